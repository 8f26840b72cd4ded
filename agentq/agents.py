"""Sub-agents: the `agents.delegate` tool (API.md 1.2, docs/sub-agents.md).

A delegate call goes out with its turn's other calls (the same fan-out: a tool task per
call, on the `tools.agents` queue). Its task does not run a function: in one unit of work,
with the parent's row locked, it makes the child job (a new conversation of the same tenant
and user, `triggered_by: sub_agent`), keyed by the call's tool_use_id (a unique index: a
call delivered twice makes one child), puts the parent in `waiting` (`waiting_for:
children`: no step claims it, so it holds no worker) and records `child_started` on the
parent. The call stays `pending` while its child runs.

A child's end is the loop's (`agentq.loop.lifecycle.child_ended`, called by `end_job` in
the same unit of work as the child's end state): it records the child's answer, or its
error, as the call's result, adds its tokens to the parent's (the parent's `max_tokens`
counts them; the user's budget counted them as they were used), records `child_ended` on
the parent and, when no delegate call of the turn is pending any more (`settle`), puts the
parent back to `running` and, with no other call pending, sends its next step.

Cancelling a parent cancels its children (`cancel_children`, after the parent's own
cancel commits, each child in a transaction of its own). The sweeper (`sweep`) covers a
crash between: it cancels live children of an ended or cancelled parent, re-dispatches a
waiting parent's delegate calls whose task was lost, and wakes a waiting parent whose
children all ended.
"""
from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, aliased, sessionmaker

from agentq.config import Settings
from agentq.db import lock_row, utcnow
from agentq.errors import ToolError
from agentq.ids import new_id
from agentq.loop.effects import DispatchTools, NextStep
from agentq.loop.lifecycle import (
    DELEGATE,
    JobStatus,
    ReplayMode,
    ToolCallStatus,
    WaitingFor,
    new_job,
    record_child,
    settle,
    wait_for_children,
)
from agentq.loop.states import ENDED, ENDED_STATUSES, UNENDED_STATUSES
from agentq.models import Conversation, Job, Persona, ToolCall
from agentq.tools.registry import ToolRegistry
from agentq.tools.result import ToolResult

log = logging.getLogger(__name__)

class DepthExceeded(ToolError):
    code = "agent_depth_exceeded"
    retryable = False


class NoRecordedChild(ToolError):
    code = "replay_no_recorded_child"
    retryable = False


class PersonaNotFound(ToolError):
    code = "persona_not_found"
    retryable = False


def depth(session: Session, job: Job, stop_at: int) -> int:
    """How many parents above `job` (0 for a top-level job), counted up to `stop_at`."""
    level, parent_id = 0, job.parent_job_id
    while parent_id is not None and level < stop_at:
        level += 1
        parent_id = session.execute(select(Job.parent_job_id).where(
            Job.id == parent_id)).scalar_one_or_none()
    return level


def start_child(uow, call, tool_use_id: str, settings: Settings,
                registry: ToolRegistry) -> dict[str, Any] | ToolResult:
    """The delegate call `call` (a row of `execute._CALL`, its job's row locked): the task's
    answer once the child exists, or the tool error the call ends with."""
    session = uow.session
    existing = session.execute(select(Job.id).where(
        Job.parent_tool_use_id == tool_use_id)).scalar_one_or_none()
    if existing is not None:  # a second delivery: the child was made by the first
        return {"tool_use_id": tool_use_id, "status": "delegated",
                "child_job_id": str(existing)}
    arguments = call.arguments
    parent = session.get(Job, call.job_id)
    try:
        allowed = registry.allowed_modules(call.allowed_modules, call.tenant_id)
        registry.validate(registry.check(call.name, call.permission_level, allowed),
                          arguments)
        level = depth(session, parent, settings.max_agent_depth + 1) + 1
        if level > settings.max_agent_depth:
            raise DepthExceeded(f"Sub-agents nest at most {settings.max_agent_depth} deep "
                                f"(AGENTQ_MAX_AGENT_DEPTH); this agent is at depth "
                                f"{level - 1} and cannot delegate.")
        persona = _persona(session, parent, arguments.get("persona_id"))
    except ToolError as exc:
        return ToolResult.failure(exc)
    recorded = _recorded_original(session, parent, tool_use_id)
    if isinstance(recorded, ToolResult):
        return recorded
    now = utcnow()
    asked = {k: v for k, v in (arguments.get("limits") or {}).items() if v is not None}
    left = _tokens_left(parent)
    if left is not None:  # the parent's max_tokens counts its children's tokens
        asked["max_tokens"] = max(1, min(asked.get("max_tokens", left), left))
    from agentq.loop.decision import applied_limits
    child = new_job(tenant_id=parent.tenant_id, conversation_id=new_id(),
                    user_id=parent.user_id, persona_id=persona.id if persona else None,
                    api_key_id=parent.api_key_id, content=arguments["task"],
                    meta={"sub_agent_of": str(parent.id), "tool_use_id": tool_use_id},
                    model=parent.model if arguments.get("persona_id") is None else None,
                    limits=asked or None, now=now,
                    limits_applied=applied_limits(settings,
                                                  persona.limits if persona else None, asked),
                    parent_job_id=parent.id, parent_tool_use_id=tool_use_id,
                    replay_of=recorded,
                    replay_mode=ReplayMode.RECORDED if recorded is not None else None)
    source = session.get(Conversation, parent.conversation_id)
    session.add(Conversation(
        id=child.conversation_id, tenant_id=parent.tenant_id, user_id=parent.user_id,
        persona_id=child.persona_id, platform=source.platform,
        platform_channel_id=source.platform_channel_id,
        platform_thread_id=source.platform_thread_id,
        scope_key=json.dumps(["sub_agent", str(child.id)]), message_seq=0, started_at=now,
        last_active_at=now, is_summarized=False, active_job_id=child.id))
    session.add(child)
    session.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id)
                    .values(attempts=ToolCall.attempts + 1, started_at=now))
    if parent.status in (JobStatus.QUEUED, JobStatus.RUNNING):
        wait_for_children(parent)
    parent.last_progress_at = now
    session.flush()
    _event(uow, parent.id, "child_started",
           {"job_id": str(child.id), "tool_use_id": tool_use_id})
    uow.effect(NextStep(str(child.id), 0, "start"))
    log.info("sub-agent started", extra={"event": "agents.child_started",
                                         "job_id": str(parent.id),
                                         "child_job_id": str(child.id),
                                         "tool_use_id": tool_use_id})
    return {"tool_use_id": tool_use_id, "status": "delegated", "child_job_id": str(child.id)}


def _recorded_original(session: Session, parent: Job,
                       tool_use_id: str) -> uuid.UUID | ToolResult | None:
    """For a recorded replay of a parent: the original's child at this call's place (the
    replay's child plays it back, recorded too), or the error when it made none there."""
    if parent.replay_mode != ReplayMode.RECORDED or parent.replay_of is None:
        return None
    place = session.execute(select(ToolCall.iteration, ToolCall.position).where(
        ToolCall.tool_use_id == tool_use_id)).one()
    original = session.execute(
        select(Job.id).join(ToolCall, ToolCall.tool_use_id == Job.parent_tool_use_id)
        .where(ToolCall.job_id == parent.replay_of, ToolCall.iteration == place.iteration,
               ToolCall.position == place.position)).scalar_one_or_none()
    if original is None:
        return ToolResult.failure(NoRecordedChild(
            "The original job started no sub-agent with this call; a recorded replay "
            "cannot start a live one."))
    return original


def _event(uow, job_id: uuid.UUID, kind: str, data: dict[str, Any]) -> None:
    """`uow.event`, for data with a `job_id` of its own (the child's, API.md 1.2)."""
    uow.events.append((job_id, kind, data))


def _persona(session: Session, parent: Job, persona_id: str | None) -> Persona | None:
    if persona_id is None:
        return session.get(Persona, parent.persona_id) if parent.persona_id else None
    try:
        persona = session.get(Persona, uuid.UUID(str(persona_id)))
    except ValueError:
        persona = None
    if persona is None or persona.tenant_id != parent.tenant_id:
        raise PersonaNotFound(f"No persona {persona_id} in this tenant.")
    return persona


def _tokens_left(parent: Job) -> int | None:
    cap = (parent.limits_applied or {}).get("max_tokens")
    if cap is None:
        return None
    return int(cap) - (parent.input_tokens + parent.output_tokens)


def awaits_children(session: Session, pending: list[ToolCall]) -> bool:
    """Some of these pending calls are delegate calls whose child is still live."""
    ids = [c.tool_use_id for c in pending if c.name == DELEGATE]
    if not ids:
        return False
    return session.execute(select(Job.id).where(
        Job.parent_tool_use_id.in_(ids), Job.status.in_(UNENDED_STATUSES)).limit(1)
    ).first() is not None


def cancel_children(sessions: sessionmaker, job_id: uuid.UUID) -> int:
    """Cancel the live children of `job_id` and theirs, each in a unit of work of its own
    (the child's row alone locked: never a parent's while a child's is waited for)."""
    from agentq.loop.busy import lock_job
    from agentq.loop.submit import cancel
    from agentq.loop.uow import UnitOfWork
    with sessions() as session:
        ids = list(session.execute(select(Job.id).where(
            Job.parent_job_id == job_id, Job.status.in_(UNENDED_STATUSES))).scalars())
    cancelled = 0
    for child_id in ids:
        with UnitOfWork(sessions) as uow:
            child = lock_job(uow.session, child_id)
            if child is None or child.status in ENDED:
                continue
            cancel(uow, child)
            cancelled += 1
        cancelled += cancel_children(sessions, child_id)
    return cancelled


def sweep(settings: Settings, sessions: sessionmaker) -> int:
    """The sweeper's safety net for sub-agents (a crash between two units of work)."""
    from agentq.loop.uow import UnitOfWork
    stale = utcnow() - timedelta(seconds=settings.step_deadline_s)
    parents = aliased(Job)
    with sessions() as session:
        orphans = list(session.execute(
            select(parents.id).join(Job, Job.parent_job_id == parents.id)
            .where(Job.status.in_(UNENDED_STATUSES),
                   (parents.status.in_(ENDED_STATUSES))
                   | parents.cancel_requested_at.is_not(None))
            .distinct().limit(100)).scalars())
        waiting = list(session.execute(select(Job.id).where(
            Job.status == JobStatus.WAITING, Job.waiting_for == WaitingFor.CHILDREN,
            Job.last_progress_at < stale).limit(100)).scalars())
    done = sum(cancel_children(sessions, parent_id) for parent_id in orphans)
    for parent_id in waiting:
        with UnitOfWork(sessions) as uow:
            parent = lock_row(uow.session, Job, parent_id)
            if parent is None or parent.status != JobStatus.WAITING \
                    or parent.waiting_for != WaitingFor.CHILDREN:
                continue
            done += _wake(uow, parent, settings)
    return done


def _wake(uow, parent: Job, settings: Settings) -> int:
    """A parent waiting for children a step deadline: lost delegate tasks go out again,
    ended children's results are stored, and the parent goes on when none is left."""
    session = uow.session
    pending = list(session.execute(select(ToolCall).where(
        ToolCall.job_id == parent.id, ToolCall.iteration == parent.iteration,
        ToolCall.name == DELEGATE, ToolCall.status == ToolCallStatus.PENDING)).scalars())
    children = {c.parent_tool_use_id: c for c in session.execute(select(Job).where(
        Job.parent_tool_use_id.in_([c.tool_use_id for c in pending]))).scalars()}
    lost = [c for c in pending if c.tool_use_id not in children]
    for call in pending:
        child = children.get(call.tool_use_id)
        if child is not None and child.status in ENDED:
            record_child(uow, parent, child)
    parent.last_progress_at = utcnow()
    if lost:
        log.warning("re-dispatching lost delegate calls",
                    extra={"job_id": str(parent.id), "count": len(lost)})
        uow.effect(DispatchTools(str(parent.id), parent.iteration, tuple(
            (c.tool_use_id, c.queue, settings.tool_time_limit_s) for c in lost)))
        return len(lost)
    settle(uow, parent, parent.iteration)
    return 1 if parent.status == JobStatus.RUNNING else 0

