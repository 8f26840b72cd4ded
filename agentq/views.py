"""Row → JSON object, exactly as API.md gives it: shared by the API and by the webhook
payloads (which carry the same job object), so it lives in the library."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Select, Text, bindparam, cast, func, select
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session, aliased, object_session

from agentq.loop.states import COUNTED_STATUSES, SHOWN_WAITS, UNENDED_STATUSES, JobStatus
from agentq.models import Batch, Conversation, Job, ToolCall, WebhookDelivery
from agentq.prebuilt import Prebuilt


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _id(value) -> str | None:
    return str(value) if value else None


def job_status(job: Job) -> tuple[str, str | None]:
    """(status, waiting_for) as the API shows them: a live job waiting for its provider, a
    person or its children as `waiting` (SHOWN_WAITS, API.md 1.1); a queued job waiting for
    its conversation, its batch or its tenant's quota stays `queued`, with `waiting_for`
    saying which (docs/api-admin.md)."""
    if job.status in UNENDED_STATUSES and job.waiting_for in SHOWN_WAITS:
        return JobStatus.WAITING, job.waiting_for
    if job.status == JobStatus.QUEUED and job.waiting_for:  # its conversation, its batch, ...
        return JobStatus.QUEUED, job.waiting_for
    return job.status, None


def job_object(job: Job, children: list[str] | None = None) -> dict[str, Any]:
    """`job`: a Job, or a row of its columns named as its attributes (`read_job`).
    `children`: the job's children as read with it (`read_job`); None: read now."""
    status, waiting_for = job_status(job)
    return {
        "id": str(job.id),
        "status": status,
        "waiting_for": waiting_for,
        "finish_reason": job.finish_reason,
        "conversation_id": str(job.conversation_id),
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "iterations": job.iteration,
        "usage": {"input_tokens": job.input_tokens, "output_tokens": job.output_tokens,
                  "cost_estimate": round(job.cost_estimate or 0.0, 8)},
        "response": job.response,
        "replay_of": _id(job.replay_of),
        "batch_id": _id(job.batch_id),
        "follow_up_job_id": _id(job.follow_up_job_id),
        "parent_job_id": _id(job.parent_job_id),
        "children": _children(job) if children is None else children,
        "limits": job.limits,
        "limits_applied": job.limits_applied,
        "metadata": job.meta or {},
    }


def _children(job: Job) -> list[str]:
    """The job's sub-agents (`agents.delegate`), in call order: read through the job's own
    session (an index lookup); a job object built without one lists none. A job that has
    had no model reply yet (every new job: a submission's answer) made no delegate call,
    so none is read for it."""
    session = object_session(job)
    if session is None or not job.iteration:
        return []
    return children_of(session, job.id)


_CALL_ORDER = (ToolCall.iteration, ToolCall.position)
"""A parent's children in the order of the delegate calls that made them."""


def _children_of(child: type[Job], parent: Any) -> Select[Any]:
    """The children (`child`, Job or an alias of it) of `parent` (an id or a column), each
    joined to the call that made it: the one query of `children_of` and `read_job`."""
    return (select(child.id).join(ToolCall, ToolCall.tool_use_id == child.parent_tool_use_id)
            .where(child.parent_job_id == parent))


def children_of(session: Session, job_id: uuid.UUID) -> list[str]:
    """A job's children, in the order of the calls that made them."""
    return [str(i) for i in session.execute(
        _children_of(Job, job_id).order_by(*_CALL_ORDER)).scalars()]


_child = aliased(Job)
_JOB_WITH_CHILDREN = Prebuilt(
    select(*(attribute.columns[0].label(attribute.key)
             for attribute in sa_inspect(Job).column_attrs),
           _children_of(_child, Job.id).with_only_columns(
               func.array_agg(aggregate_order_by(cast(_child.id, Text), *_CALL_ORDER)))
           .scalar_subquery().label("children_read"))
    .where(Job.id == bindparam("job_id")))
"""A job's columns, each named as its Job attribute, and its children's ids in call order
(`children_of`), in one prebuilt statement (Postgres, agentq.prebuilt): no ORM object
made, the children an index lookup of the same round trip."""


def read_job(session: Session, job_id: uuid.UUID) -> tuple[Any, list[str] | None] | None:
    """The job and its children for `job_object`: on Postgres in one statement, the job a
    row read as its Job's attributes (a poll's one read of the job: no ORM object, no
    second round trip for its children), elsewhere the Job alone (its children read by
    `job_object`, None). None: no such job."""
    if session.get_bind().dialect.name != "postgresql":
        job = session.get(Job, job_id)
        return None if job is None else (job, None)
    row = _JOB_WITH_CHILDREN.first(session, {"job_id": job_id})
    if row is None:
        return None
    return row, list(row.children_read or ())


def conversation_object(conversation: Conversation) -> dict[str, Any]:
    """GET /v1/conversations/<id>."""
    branched = None
    if conversation.branched_from_conversation_id is not None:
        branched = {"conversation_id": str(conversation.branched_from_conversation_id),
                    "message_id": _id(conversation.branched_from_message_id)}
    return {"id": str(conversation.id), "created_at": _iso(conversation.started_at),
            "persona_id": _id(conversation.persona_id), "branched_from": branched,
            "active_project": conversation.active_project}


def delivery_object(delivery: WebhookDelivery) -> dict[str, Any]:
    return {"id": str(delivery.id), "event_id": delivery.event_id,
            "event_type": delivery.event_type, "url": delivery.url,
            "attempt": delivery.attempt, "status": delivery.status,
            "status_code": delivery.status_code, "latency_ms": delivery.latency_ms,
            "error": delivery.error, "created_at": _iso(delivery.created_at),
            "next_attempt_at": _iso(delivery.next_attempt_at)}


COUNT_KEYS = COUNTED_STATUSES
"""A batch's jobs counted by status (`batch_counts`)."""


def batch_counts(session: Session, batch_id: uuid.UUID) -> dict[str, int]:
    """A batch object's `counts`: its jobs by status, and their total. Here, not in
    `agentq.batches`, because the webhook payloads carry the batch object too."""
    rows = session.execute(select(Job.status, func.count()).where(Job.batch_id == batch_id)
                           .group_by(Job.status)).all()
    out = {key: 0 for key in COUNT_KEYS}
    for status, n in rows:
        out[status] = n
    out["total"] = sum(out[k] for k in COUNT_KEYS)
    return out


def batch_object(batch: Batch, tallies: dict[str, int]) -> dict[str, Any]:
    """The batch as API.md gives it, with its jobs counted (`tallies`)."""
    return {"id": str(batch.id), "kind": batch.kind, "status": batch.status,
            "counts": {"total": batch.total, **{k: tallies.get(k, 0) for k in COUNT_KEYS}},
            "max_concurrency": batch.max_concurrency,
            "created_at": batch.created_at.isoformat(),
            "finished_at": batch.finished_at.isoformat() if batch.finished_at else None,
            "metadata": batch.meta or {}}
