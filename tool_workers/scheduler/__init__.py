"""Tool module `scheduler` (seed 000): the model schedules a message that continues this
conversation later (`scheduler.add_job`), lists (`scheduler.list_jobs`) and cancels
(`scheduler.cancel_job`) the ones it made here.

The conversation, user and platform context are not arguments: they are injected by the
loop (ToolContext: conversation_id, user_id, platform, channel, thread), so a model can
reach only its own conversation. The tools need the `user` permission level (guests are
not offered them), and the persona must enable the module. `add_job` writes once per
tool_use_id: a re-run of the same call finds the schedule it made.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from agentq.errors import ClientError, QuotaExceeded, ToolError
from agentq.loop.states import ScheduleStatus
from agentq.models import Conversation, Job, Schedule
from agentq.schedules import cancel_schedule, create_schedule, schedule_object, timing
from agentq.tools.manifest import ToolContext, define_module

MAX_LISTED = 50


class SchedulerError(ToolError):
    code = "scheduler_error"
    retryable = False


class ScheduleQuotaExceeded(SchedulerError):
    """The tenant holds its quota of active schedules (`agentq.tenants.Quotas`)."""
    code = "quota_exceeded"


def _sessions(ctx: ToolContext):
    if ctx.session_factory is None:
        raise ToolError("scheduler tools need a database session")
    return ctx.session_factory


def _brief(schedule: Schedule) -> dict[str, Any]:
    body = schedule_object(schedule)
    return {k: body[k] for k in ("id", "content", "kind", "run_at", "cron", "timezone",
                                 "next_run_at", "status", "runs")}


def add_job(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    run_at = None
    if args.get("run_at") is not None:
        try:
            run_at = datetime.fromisoformat(args["run_at"])
        except ValueError:
            raise SchedulerError("run_at must be an ISO 8601 time with an offset, e.g. "
                                 "2030-01-01T09:00:00+00:00") from None
    try:
        when = timing(run_at, args.get("delay_s"), args.get("cron"), args.get("timezone"))
    except ClientError as exc:
        fields = exc.details.get("fields") or {}
        said = "; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items())
        raise SchedulerError(f"{exc.message} {said}".strip()) from None
    sessions = _sessions(ctx)
    try:
        with sessions() as session, session.begin():
            made = session.execute(select(Schedule).where(
                Schedule.tool_use_id == ctx.tool_use_id)).scalar_one_or_none()
            if made is None:
                conversation = session.get(Conversation, uuid.UUID(ctx.conversation_id))
                api_key_id = session.execute(select(Job.api_key_id).where(
                    Job.id == uuid.UUID(ctx.job_id))).scalar_one()
                try:
                    made = create_schedule(session, conversation, args["content"], when,
                                           api_key_id, created_by="tool",
                                           tool_use_id=ctx.tool_use_id,
                                           metadata={"job_id": ctx.job_id},
                                           settings=ctx.extra.get("settings"))
                except QuotaExceeded as exc:
                    raise ScheduleQuotaExceeded(exc.message, **exc.details) from None
            return {"scheduled": True, "job": _brief(made)}
    except IntegrityError:  # a concurrent run of this call made it
        with sessions() as session:
            made = session.execute(select(Schedule).where(
                Schedule.tool_use_id == ctx.tool_use_id)).scalar_one()
            return {"scheduled": True, "job": _brief(made)}


def list_jobs(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    with _sessions(ctx)() as session:
        rows = session.execute(select(Schedule).where(
            Schedule.conversation_id == uuid.UUID(ctx.conversation_id),
            Schedule.status == ScheduleStatus.ACTIVE, Schedule.cancelled_at.is_(None))
            .order_by(Schedule.next_run_at).limit(MAX_LISTED)).scalars()
        return {"jobs": [_brief(s) for s in rows]}


def cancel_job(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    try:
        ident = uuid.UUID(args["job_id"])
    except ValueError:
        raise SchedulerError(f"no scheduled job {args['job_id']!r} in this conversation",
                             job_id=args["job_id"]) from None
    with _sessions(ctx)() as session, session.begin():
        schedule = session.get(Schedule, ident)
        if (schedule is None or schedule.cancelled_at is not None
                or str(schedule.conversation_id) != ctx.conversation_id):
            raise SchedulerError(f"no scheduled job {args['job_id']!r} in this conversation",
                                 job_id=args["job_id"])
        return {"cancelled": True, "job": _brief(cancel_schedule(session, schedule))}


WHEN = {
    "run_at": {"type": "string", "maxLength": 64,
               "description": "When, ISO 8601 with an offset (2030-01-01T09:00:00+00:00)."},
    "delay_s": {"type": "number", "minimum": 0, "maximum": 366 * 86400,
                "description": "Or: this many seconds from now."},
    "cron": {"type": "string", "maxLength": 200,
             "description": "Or: repeat on a cron schedule (5 fields; 6 with seconds last)."},
    "timezone": {"type": "string", "maxLength": 64,
                 "description": "The cron's IANA time zone (default UTC)."},
}

MODULE = define_module({
    "module": "scheduler",
    "description": "Continue this conversation later: reminders and recurring check-ins.",
    "tools": [
        {"name": "scheduler.add_job",
         "description": ("Schedule a message that continues this conversation later (you "
                         "will be asked to act on it then). Give exactly one of run_at, "
                         "delay_s and cron."),
         "parameters": {"type": "object", "additionalProperties": False,
                        "required": ["content"],
                        "properties": {"content": {"type": "string", "minLength": 1,
                                                   "maxLength": 10000,
                                                   "description": "The message to run "
                                                                  "then."},
                                       **WHEN}},
         "permission": "user", "function": add_job, "time_limit_s": 10},
        {"name": "scheduler.list_jobs",
         "description": "The active scheduled jobs of this conversation.",
         "parameters": {"type": "object", "additionalProperties": False, "properties": {}},
         "permission": "user", "function": list_jobs, "time_limit_s": 10},
        {"name": "scheduler.cancel_job",
         "description": "Cancel one of this conversation's scheduled jobs by its id.",
         "parameters": {"type": "object", "additionalProperties": False,
                        "required": ["job_id"],
                        "properties": {"job_id": {"type": "string", "maxLength": 64}}},
         "permission": "user", "function": cancel_job, "time_limit_s": 10},
    ],
})
