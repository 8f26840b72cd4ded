"""Running one tool call, keyed by its tool_use_id: a redelivered task runs nothing twice.

Errors are values: whatever the tool does, the call ends with a stored result and the task
returns normally, so the chord's callback always fires.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import sessionmaker

from agentq.config import Settings
from agentq.db import utcnow
from agentq.loop.busy import lock_job
from agentq.loop.step import relax_durability
from agentq.loop.store import EventBuffer
from agentq.models import TERMINAL_STATUSES, Conversation, Job, Persona, ToolCall, User
from agentq.tools.manifest import ToolContext
from agentq.tools.registry import ToolRegistry, ToolResult

log = logging.getLogger(__name__)
MAX_DELIVERIES = 3
"""A call whose task was delivered this often without storing a result (it crashed its
worker each time) is answered with an error instead of being run again."""
CRASHED_RESULT = {"ok": False, "result": None,
                  "error": {"code": "tool_crashed",
                            "message": f"The tool crashed its worker {MAX_DELIVERIES} times."}}
CANCELLED_RESULT = {"ok": False, "result": None,
                    "error": {"code": "cancelled", "message": "The job was cancelled before "
                                                              "this tool ran."}}


def execute_tool_call(tool_use_id: str, settings: Settings, registry: ToolRegistry,
                      sessions: sessionmaker) -> dict[str, Any]:
    events = EventBuffer()
    with sessions() as session, session.begin():
        prepared = _prepare(session, tool_use_id, settings, registry, sessions, events)
        events.flush(session)
    events.announce()
    if isinstance(prepared, dict):
        return prepared
    name, arguments, ctx, allowed = prepared

    result: ToolResult = registry.execute(name, arguments, ctx, allowed)
    status = "succeeded" if result.ok else "failed"
    job_id = uuid.UUID(ctx.job_id)
    with sessions() as session, session.begin():
        lock_job(session, job_id)  # the job's row before the call's, as everywhere
        iteration = _store(session, job_id, tool_use_id, name, status,
                           {**result.to_record(), "attempts": result.attempts}, events)
        events.flush(session)
        join = (_join_if_last(session, job_id, iteration)
                if iteration is not None and settings.tool_join == "database" else None)
    events.announce()
    return {"tool_use_id": tool_use_id,
            "status": status if iteration is not None else "duplicate", "next_step": join}


def _join_if_last(session, job_id: uuid.UUID, iteration: int) -> tuple[str, int] | None:
    """With `tool_join=database`: the task that stores a turn's last result names the next
    step. The job row is locked in this transaction, which orders concurrent finishers of
    one job: exactly one of them sees no call pending."""
    pending = session.execute(
        select(ToolCall.id).where(ToolCall.job_id == job_id, ToolCall.iteration == iteration,
                                  ToolCall.status == "pending").limit(1)).first()
    return None if pending else (str(job_id), iteration)


def _prepare(session, tool_use_id: str, settings: Settings, registry: ToolRegistry,
             sessions: sessionmaker, events: EventBuffer):
    """Load the call and decide whether it runs; a dict is the task's answer without it."""
    relax_durability(session)  # a lost start is re-done by the redelivered task
    query = (select(ToolCall, Job).join(Job, Job.id == ToolCall.job_id)
             .where(ToolCall.tool_use_id == tool_use_id))
    if session.bind.dialect.name == "postgresql":
        query = query.with_for_update(of=Job)  # the job's row first, as everywhere
    found = session.execute(query.execution_options(populate_existing=True)).first()
    if found is None:
        log.error("unknown tool_use_id", extra={"tool_use_id": tool_use_id})
        return {"tool_use_id": tool_use_id, "status": "missing"}
    call, job = found
    if call.status != "pending":
        return {"tool_use_id": tool_use_id, "status": call.status}
    if job.status in TERMINAL_STATUSES or job.cancel_requested_at is not None:
        _store(session, job.id, tool_use_id, call.name, "cancelled", CANCELLED_RESULT, events)
        return {"tool_use_id": tool_use_id, "status": "cancelled"}
    call.attempts += 1
    call.started_at = utcnow()
    tool = registry.tools.get(call.name)
    if call.attempts > 1 and call.attempts <= MAX_DELIVERIES:
        # at-least-once: the previous delivery died before storing a result
        idempotent = bool(tool and tool.idempotent)
        log.log(logging.INFO if idempotent else logging.WARNING,
                "tool call delivered again; running it again%s",
                "" if idempotent else " although it is not idempotent",
                extra={"event": "tool.rerun" if idempotent else "tool.rerun_not_idempotent",
                       "tool": call.name, "tool_use_id": tool_use_id,
                       "delivery": call.attempts, "idempotent": idempotent})
    if call.attempts > MAX_DELIVERIES:
        session.flush()
        _store(session, job.id, tool_use_id, call.name, "failed", CRASHED_RESULT, events)
        return {"tool_use_id": tool_use_id, "status": "failed"}
    user, conversation, persona = session.execute(
        select(User, Conversation, Persona).select_from(User)
        .join(Conversation, Conversation.id == job.conversation_id)
        .outerjoin(Persona, Persona.id == job.persona_id)
        .where(User.id == job.user_id)).one()
    allowed = registry.allowed_modules(persona.allowed_modules if persona else None)
    ctx = ToolContext(tool_use_id=tool_use_id, job_id=str(job.id), user_id=str(user.id),
                      conversation_id=str(conversation.id),
                      permission_level=user.permission_level,
                      platform=conversation.platform,
                      platform_channel_id=conversation.platform_channel_id,
                      platform_thread_id=conversation.platform_thread_id,
                      session_factory=sessions,
                      public_url=settings.public_url, tenant_id=str(job.tenant_id),
                      extra={"settings": settings})
    return call.name, call.arguments, ctx, allowed


def _store(session, job_id: uuid.UUID, tool_use_id: str, name: str, status: str,
           record: dict[str, Any], events: EventBuffer) -> int | None:
    """Write the result once: only a pending call takes it. The caller holds the job's row
    (locked first, as every other writer does). Returns the call's turn, or None when
    another delivery stored it already."""
    iteration = session.execute(
        update(ToolCall).where(ToolCall.tool_use_id == tool_use_id,
                               ToolCall.status == "pending")
        .values(status=status, result=record, finished_at=utcnow())
        .returning(ToolCall.iteration)).scalar_one_or_none()
    if iteration is None:
        return None
    error = (record.get("error") or {}).get("code")
    events.add(job_id, "tool_execution_end", tool_use_id=tool_use_id, name=name,
               ok=record["ok"], error=error, attempts=record.get("attempts", 0))
    return iteration
