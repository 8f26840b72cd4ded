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
    CompoundSelect,
    Select,
    bindparam,
    exists,
    literal_column,
    null,
    select,
    true,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql import ColumnElement

from agentq.db import lock_row, utcnow
from agentq.errors import Conflict, NotFound
from agentq.loop.states import JobStatus, ToolCallStatus, WaitingFor
from agentq.loop.store import message_appended_by
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
    entry = JobInput(id=uuid.uuid4(), job_id=job.id, content=content, meta=metadata or {},
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


def _release_with_message() -> CompoundSelect[Any, Any, Any, Any]:
    """`RELEASE` that also appends the job's last message, and `CALLS_OF`, in one
    statement (Postgres): the conversation's row is written once, its counter advanced and
    its owner let go of together, the message numbered from it (`store.message_appended_by`),
    and the job's calls read with them. Its rows: the calls (as `CALLS_OF`'s, `seq` NULL),
    then the message's seq on a line of its own (its `name` NULL), which is missing when the
    job did not hold the conversation: then nothing was written. The calls are the job's
    own, finished before its last step and locked with its row: the statement's snapshot
    sees them as a later one would. Parameters: `store.message_parameters(…)`'s and
    `job_id`."""
    released = (update(_conversations)
                .where(_conversations.c.id == bindparam("ident"),
                       _conversations.c.active_job_id == bindparam("job_id"))
                .values(message_seq=_conversations.c.message_seq
                        + bindparam("n", type_=_conversations.c.message_seq.type),
                        active_job_id=None,
                        last_active_at=bindparam("now",
                                                 type_=_conversations.c.last_active_at.type))
                .returning(_conversations.c.message_seq))
    appended = message_appended_by(released).cte("appended")
    order = (ToolCall.iteration, ToolCall.position)
    calls = select(*CALL_COLUMNS, *order, null().label("seq")).where(
        ToolCall.job_id == bindparam("job_id"))
    message = select(*(type_coerce(null(), column.type).label(column.key)
                       for column in (*CALL_COLUMNS, *order)), appended.c.seq)
    # the message's line last: its iteration is NULL
    return union_all(calls, message).order_by(*(literal_column(c.key) for c in order))


def _next_and_quota_waiters() -> Select[Job, bool]:
    """The conversation's next waiting job (`next_waiting`, or None) and whether the
    tenant has jobs waiting for its running-jobs quota, in one statement: one row whether
    or not a job waits. Parameters: `conversation_id`, `tenant_id`."""
    waiting = NEXT_WAITING.subquery("waiting")
    one = select(literal_column("1").label("one")).subquery("one")
    quota = exists().where(*quota_waits(bindparam("tenant_id"))).label("quota_waiters")
    return (select(aliased(Job, waiting), quota).select_from(one)
            .outerjoin(waiting, true()))


RELEASE_WITH_MESSAGE = _release_with_message()
NEXT_AND_QUOTA_WAITERS = _next_and_quota_waiters()
