"""One job runs per conversation at a time; what happens to the next message (`on_busy`).

A conversation's `active_job_id` names the job that owns it. A message for a busy
conversation follows its policy (seed 001's steering and follow-ups):

  queue      a new job that waits (`waiting_for="conversation"`), started when the owner
             ends, in arrival order
  steer      a `job_inputs` row for the owner, injected as a user message at its next turn
             boundary; if the owner ends before another turn, the input becomes a follow-up
  interrupt  the owner is cancelled (at its next step boundary; pending tool calls answered
             `cancelled`) and the new job waits for it to end
  reject     409 naming the running job

The conversation row is locked while deciding, so two messages racing for one conversation
are ordered, never both started.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Insert,
    Select,
    bindparam,
    case,
    exists,
    func,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnElement

from agentq.db import lock_row, utcnow
from agentq.errors import Conflict, NotFound
from agentq.ids import new_id
from agentq.loop.states import JobStatus, ToolCallStatus, WaitingFor
from agentq.loop.store import json_object, message_appended_unread_by
from agentq.models import Conversation, Job, JobInput, ToolCall
from agentq.tools.result import ToolResult

if TYPE_CHECKING:
    from agentq.loop.uow import UnitOfWork

CANCELLED_TOOL_RESULT = ToolResult.failed(
    "cancelled", "The job was cancelled; this tool did not run to completion.").to_record()


def lock_conversation(session: Session, conversation_id: uuid.UUID) -> Conversation:
    conversation = lock_row(session, Conversation, conversation_id)
    if conversation is None:
        raise NotFound("conversation", str(conversation_id))
    return conversation


def lock_job(session: Session, job_id: uuid.UUID) -> Job | None:
    return lock_row(session, Job, job_id)


def request_cancel(uow: UnitOfWork, job: Job, now: datetime | None = None) -> list[str]:
    """Ask a live job to stop at its next step boundary; answer its pending tool calls.

    Returns the tool_use_ids whose queued tasks should be revoked.
    """
    session, now = uow.session, now or utcnow()
    if job.cancel_requested_at is None:
        job.cancel_requested_at = now
        uow.event(job.id, "cancel_requested")
    pending = session.execute(
        select(ToolCall.tool_use_id, ToolCall.name).where(
            ToolCall.job_id == job.id, ToolCall.iteration == job.iteration,
            ToolCall.status == ToolCallStatus.PENDING)).all()
    if pending:
        session.execute(update(ToolCall).where(
            ToolCall.job_id == job.id, ToolCall.iteration == job.iteration,
            ToolCall.status == ToolCallStatus.PENDING).values(
                status=ToolCallStatus.CANCELLED, result=CANCELLED_TOOL_RESULT, finished_at=now))
        for tool_use_id, name in pending:
            uow.event(job.id, "tool_execution_end", tool_use_id=tool_use_id, name=name,
                      ok=False, error="cancelled")
    return [tool_use_id for tool_use_id, _ in pending]


def steer(uow: UnitOfWork, job: Job, content: str, metadata: dict[str, Any] | None,
          now: datetime | None = None) -> JobInput:
    entry = JobInput(id=new_id(), job_id=job.id, content=content, meta=metadata or {},
                     created_at=now or utcnow())
    uow.session.add(entry)
    job.pending_inputs = (job.pending_inputs or 0) + 1
    uow.event(job.id, "steering_queued", input_id=str(entry.id))
    return entry


def pending_inputs(session: Session, job_id: uuid.UUID) -> list[JobInput]:
    return list(session.execute(
        select(JobInput).where(JobInput.job_id == job_id, JobInput.consumed_at.is_(None))
        .order_by(JobInput.created_at)).scalars())


NEXT_WAITING = (select(Job).where(Job.conversation_id == bindparam("conversation_id"),
                                  Job.waiting_for == WaitingFor.CONVERSATION,
                                  Job.status == JobStatus.QUEUED)
                # an interrupting message goes before queued follow-ups
                .order_by((Job.on_busy != "interrupt"), Job.created_at, Job.id).limit(1))
"""The conversation's next waiting job, if any (`conversation_id`)."""


def next_waiting(session: Session, conversation_id: uuid.UUID) -> Job | None:
    return session.execute(NEXT_WAITING,
                           {"conversation_id": conversation_id}).scalar_one_or_none()


def busy_conflict(job: Job) -> Conflict:
    return Conflict(f"The conversation is busy with job {job.id}.", job_id=str(job.id),
                    status=job.status)


# --- a job's end hands its conversation on (agentq.loop.lifecycle.release_conversation) ---

_conversations = Conversation.__table__


def quota_waits(tenant_id: Any) -> tuple[ColumnElement[bool], ...]:
    """The tenant's jobs that wait for its running-jobs quota."""
    return (Job.tenant_id == tenant_id, Job.waiting_for == WaitingFor.QUOTA,
            Job.status == JobStatus.QUEUED)


CALL_COLUMNS = (ToolCall.name, ToolCall.tool_use_id, ToolCall.result, ToolCall.arguments,
                ToolCall.status)
CALLS_OF = (select(*CALL_COLUMNS)
            .where(ToolCall.job_id == bindparam("job_id"))
            .order_by(ToolCall.iteration, ToolCall.position))
"""A job's calls: the columns its response needs, not the calls' objects."""
RELEASE = (update(_conversations)
           .where(_conversations.c.id == bindparam("conversation_id"),
                  _conversations.c.active_job_id == bindparam("job_id"))
           # idle from now: the memory digest's clock (agentq.memory_digest)
           .values(active_job_id=None, last_active_at=bindparam(
               "now", type_=_conversations.c.last_active_at.type))
           .returning(_conversations.c.id))
HAND_ON = (update(_conversations).where(_conversations.c.id == bindparam("conversation_id"))
           .values(active_job_id=bindparam("next_id")))
"""Built once, with bind parameters: a job's end runs them on every job."""


def _answer_and_release() -> Insert:
    """A job's last message appended, and its conversation let go of if the job holds it,
    in one statement whose answer nobody reads (Postgres; it goes with the next statement,
    `AFTER_ANSWER`): the conversation's row written once, its counter advanced, and its
    owner and idle clock (`last_active_at` = `now`) moved only when the owner is the job.
    Parameters: `store.message_parameters(…)`'s and `job_id`."""
    c = _conversations.c
    ours = c.active_job_id == bindparam("job_id")
    advanced = (update(_conversations).where(c.id == bindparam("ident"))
                .values(message_seq=c.message_seq + bindparam("n", type_=c.message_seq.type),
                        active_job_id=case((ours, null()), else_=c.active_job_id),
                        # idle from now: the memory digest's clock (agentq.memory_digest)
                        last_active_at=case(
                            (ours, bindparam("now", type_=c.last_active_at.type)),
                            else_=c.last_active_at))
                .returning(c.message_seq))
    return message_appended_unread_by(advanced)


def _next_and_quota_waiters(answered: bool = False) -> Select[Any]:
    """The id of the conversation's next waiting job (`next_waiting`'s, or None) and
    whether the tenant has jobs waiting for its running-jobs quota, in one statement of
    scalar subqueries: one row whether or not a job waits. Parameters: `conversation_id`,
    `tenant_id`. `answered`: after `ANSWER_AND_RELEASE`, also whether that let the
    conversation go (it is nobody's, idle since `now`) and the job's calls (`job_id`), as
    `CALLS_OF`'s columns in one JSON array in call order."""
    columns: list[Any] = [
        NEXT_WAITING.with_only_columns(Job.id).scalar_subquery().label("next_id"),
        exists().where(*quota_waits(bindparam("tenant_id"))).label("quota_waiters")]
    if answered:
        c = _conversations.c
        columns.append(exists().where(
            c.id == bindparam("conversation_id"), c.active_job_id.is_(None),
            c.last_active_at == bindparam("now", type_=c.last_active_at.type)
        ).label("released"))
        calls = json_object(*((column.key, column) for column in CALL_COLUMNS))
        columns.append(select(func.json_agg(aggregate_order_by(
            calls, ToolCall.iteration, ToolCall.position)))
            .where(ToolCall.job_id == bindparam("job_id")).scalar_subquery().label("calls"))
    return select(*columns)


ANSWER_AND_RELEASE = _answer_and_release()
NEXT_AND_QUOTA_WAITERS = _next_and_quota_waiters()
AFTER_ANSWER = _next_and_quota_waiters(answered=True)
