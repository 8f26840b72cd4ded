"""Human approval of tool calls.

A tool whose manifest says `requires_approval` (or that the job's persona lists in its
`requires_approval`, stored in the `approval_tools` column) does not run when the model
calls it: its call row starts `awaiting`, with a deadline (the tool's `approval_timeout_s`, else
AGENTQ_APPROVAL_TIMEOUT_S, 24 h), an `approval_required` event and, when the job has a
callback_url, a signed `job.approval_required` webhook (data: the job object plus
`tool_call: {tool_use_id, name, arguments}`).
The job goes to `status: waiting` (`waiting_for: approval`): no step claims it, so it holds
no worker slot. Other calls of the same turn run meanwhile.

- approve (optionally with edited arguments, validated against the tool's schema): the call
  becomes `pending` and is dispatched; its result joins the turn like any other.
- deny (with a reason), or the deadline passing (the sweeper): the call ends `failed` with a
  `denied` (or `approval_timeout`) error that the model reads.

Either way an `approval_resolved` event says how: `decision` is `approved`, `denied` or
`timed_out`.

When no call of the turn awaits any more, the job is `running` again; if no call is still
running either, the next step is dispatched at once. Cancelling a waiting job cancels its
awaiting calls and ends the job at its next step, as for any job.
"""
from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import Conflict, NotFound, ToolError, ValidationFailed
from agentq.loop.busy import lock_job
from agentq.loop.effects import DispatchTools, NextStep, SendWebhooks
from agentq.loop.lifecycle import JobStatus, ToolCallStatus, resume, wait_for_approval
from agentq.loop.uow import UnitOfWork
from agentq.models import Job, ToolCall
from agentq.tools.registry import ToolRegistry
from agentq.tools.result import ToolResult
from agentq.webhooks.outbox import APPROVAL_EVENT_TYPE, enqueue_event

log = logging.getLogger(__name__)

AWAITING = ToolCallStatus.AWAITING
DECISIONS = {"denied": "denied", "approval_timeout": "timed_out"}
"""A refused call's error code → the `decision` of its approval_resolved event."""
MAX_REASON_CHARS = 2000
"""The longest reason a person may give with a denial (the API's and the dashboard's)."""


def needs_approval(registry: ToolRegistry, name: str,
                   persona_tools: list[str] | None = None) -> bool:
    """The tool's manifest says so, or the job's persona lists it."""
    tool = registry.tools.get(name)
    return bool(tool and (tool.requires_approval or name in (persona_tools or ())))


def deadline(registry: ToolRegistry, settings: Settings, name: str,
             now: datetime) -> datetime:
    tool = registry.tools[name]
    return now + timedelta(seconds=tool.approval_timeout_s or settings.approval_timeout_s)


def hold(uow: UnitOfWork, job: Job, call: ToolCall, expires_at: datetime) -> None:
    """Park `call` for approval and put the job in `waiting` (the step's transaction)."""
    call.status, call.approval_expires_at = AWAITING, expires_at
    wait_for_approval(job)
    approval = {"tool_use_id": call.tool_use_id, "name": call.name,
                "arguments": call.arguments, "expires_at": expires_at.isoformat(),
                "turn": call.iteration}
    uow.event(job.id, "approval_required", **approval)
    if job.callback_url:
        delivery = enqueue_event(uow.session, tenant_id=job.tenant_id,
                                 event_type=APPROVAL_EVENT_TYPE, url=job.callback_url,
                                 job_id=job.id, data=approval)
        uow.effect(SendWebhooks((str(delivery.id),)))


def _locked_job(session: Session, job_id: uuid.UUID) -> Job:
    job = lock_job(session, job_id)
    if job is None:  # deleted since the caller read it
        raise NotFound("job", str(job_id))
    return job


def _awaiting_call(session: Session, job: Job, tool_use_id: str) -> ToolCall:
    call = session.execute(select(ToolCall).where(
        ToolCall.job_id == job.id, ToolCall.tool_use_id == tool_use_id)
        .with_for_update()).scalar_one_or_none()
    if call is None:
        raise NotFound("tool call", tool_use_id)
    if call.status != AWAITING:
        raise Conflict(f"Tool call {tool_use_id} is not awaiting approval ({call.status}).",
                       tool_use_id=tool_use_id, status=call.status)
    return call


def approve(uow: UnitOfWork, job_id: uuid.UUID, tool_use_id: str,
            arguments: dict[str, Any] | None, registry: ToolRegistry) -> None:
    session = uow.session
    job = _locked_job(session, job_id)
    call = _awaiting_call(session, job, tool_use_id)
    if arguments is not None:
        tool = registry.tools.get(call.name)
        try:
            if tool is None:
                raise ToolError(f"no tool {call.name!r}")
            registry.validate(tool, arguments)
        except ToolError as exc:
            raise ValidationFailed({"arguments": [exc.message]},
                                   "The arguments do not fit the tool's schema.") from None
        call.arguments = arguments
    call.status = ToolCallStatus.PENDING
    uow.event(job.id, "approval_resolved", decision="approved", tool_use_id=tool_use_id,
              name=call.name, arguments=call.arguments, edited=arguments is not None)
    uow.event(job.id, "tool_execution_start", tool_use_id=tool_use_id, name=call.name,
              arguments=call.arguments, queue=call.queue)
    limit = (registry.time_limit_for(call.name) if call.name in registry.tools else 60.0)
    uow.effect(DispatchTools(str(job.id), call.iteration, ((tool_use_id, call.queue, limit),)))
    _resume(uow, job, call.iteration)


def deny(uow: UnitOfWork, job_id: uuid.UUID, tool_use_id: str, reason: str | None,
         code: str = "denied") -> None:
    job = _locked_job(uow.session, job_id)
    call = _awaiting_call(uow.session, job, tool_use_id)
    _deny(uow, job, call, reason, code)


def _deny(uow: UnitOfWork, job: Job, call: ToolCall, reason: str | None, code: str) -> None:
    message = ("A person denied this tool call" + (f": {reason}" if reason else ".")
               if code == "denied" else
               "Nobody approved this tool call in time; it was not run.")
    call.status, call.finished_at = ToolCallStatus.FAILED, utcnow()
    call.result = ToolResult.failed(code, message).to_record()
    uow.event(job.id, "approval_resolved", decision=DECISIONS[code],
              tool_use_id=call.tool_use_id, name=call.name, reason=reason, code=code)
    uow.event(job.id, "tool_execution_end", tool_use_id=call.tool_use_id, name=call.name,
              ok=False, error=code)
    _resume(uow, job, call.iteration)


def _resume(uow: UnitOfWork, job: Job, iteration: int) -> None:
    """No call of the turn awaits any more: the job runs again; with nothing running,
    its next step goes out now."""
    statuses = uow.session.execute(select(ToolCall.status).where(
        ToolCall.job_id == job.id, ToolCall.iteration == iteration)).scalars().all()
    if AWAITING in statuses:
        return
    if job.status == JobStatus.WAITING:
        resume(job, utcnow())
    if ToolCallStatus.PENDING not in statuses:
        uow.effect(NextStep(str(job.id), iteration, "callback"))


def cancel_awaiting(uow: UnitOfWork, job: Job) -> None:
    """A waiting job is being cancelled: its awaiting calls will never run."""
    from agentq.loop.busy import CANCELLED_TOOL_RESULT
    calls = uow.session.execute(select(ToolCall).where(
        ToolCall.job_id == job.id, ToolCall.status == AWAITING)).scalars().all()
    now = utcnow()
    for call in calls:
        call.status, call.result, call.finished_at = (ToolCallStatus.CANCELLED,
                                                      CANCELLED_TOOL_RESULT, now)
        uow.event(job.id, "tool_execution_end", tool_use_id=call.tool_use_id,
                  name=call.name, ok=False, error="cancelled")
    if job.status == JobStatus.WAITING:
        resume(job, now)


def expire(settings: Settings, sessions: sessionmaker[Session], limit: int = 100) -> int:
    """Deny every awaiting call past its deadline (the sweeper), each in its own unit of
    work; returns how many were denied."""
    now = utcnow()
    with sessions() as session:
        due = session.execute(select(ToolCall.job_id, ToolCall.tool_use_id).where(
            ToolCall.status == AWAITING, ToolCall.approval_expires_at < now)
            .order_by(ToolCall.approval_expires_at).limit(limit)).all()
    denied = 0
    for job_id, tool_use_id in due:
        try:
            with UnitOfWork(sessions) as uow:
                deny(uow, job_id, tool_use_id, None, code="approval_timeout")
        except (Conflict, NotFound):
            continue  # approved or denied meanwhile, or the job deleted
        denied += 1
    return denied
