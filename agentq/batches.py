"""Batches: many messages submitted as one, admitted at a bounded concurrency so they never
starve interactive traffic, results in request order.

A batch's jobs are created all at once (`waiting_for="batch"`) in the transaction that
creates the batch. Admission hands them, in request order, to their conversations (where
lines that share a conversation queue behind each other), never more than
`max_concurrency` live at a time. Each ending batch job admits the next and, when it was the
last, ends the batch (`batch.completed` / `batch.cancelled` webhook).
"""
from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.loop.effects import BatchEnded, Effect
from agentq.loop.store import EventBuffer
from agentq.models import TERMINAL_STATUSES, Batch, Job

COUNT_KEYS = ("queued", "running", "completed", "failed", "cancelled")


def lock_batch(session: Session, batch_id: uuid.UUID) -> Batch | None:
    query = select(Batch).where(Batch.id == batch_id)
    if session.bind.dialect.name == "postgresql":
        query = query.with_for_update(key_share=True)  # FOR NO KEY UPDATE: inserts that
        # reference this row (their foreign key takes KEY SHARE) are not blocked by it
    return session.execute(query.execution_options(populate_existing=True)).scalar_one_or_none()


def counts(session: Session, batch_id: uuid.UUID) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).where(Job.batch_id == batch_id)
                           .group_by(Job.status)).all()
    out = {key: 0 for key in COUNT_KEYS}
    for status, n in rows:
        out[status] = n
    out["total"] = sum(out[k] for k in COUNT_KEYS)
    return out


def batch_object(batch: Batch, tallies: dict[str, int]) -> dict[str, Any]:
    return {"id": str(batch.id), "kind": batch.kind, "status": batch.status,
            "counts": {"total": batch.total, **{k: tallies.get(k, 0) for k in COUNT_KEYS}},
            "max_concurrency": batch.max_concurrency,
            "created_at": batch.created_at.isoformat(),
            "finished_at": batch.finished_at.isoformat() if batch.finished_at else None,
            "metadata": batch.meta or {}}


def admit(session: Session, batch: Batch, events: EventBuffer) -> list[Effect]:
    """Admit waiting jobs in request order up to the batch's concurrency."""
    from agentq.loop.submit import admit as admit_job
    if batch.cancel_requested_at is not None or batch.status in ("completed", "cancelled"):
        return []
    live = session.execute(select(func.count()).select_from(Job).where(
        Job.batch_id == batch.id, Job.status.in_(("queued", "running")),
        Job.waiting_for.is_distinct_from("batch"))).scalar_one()
    room = batch.max_concurrency - live
    if room <= 0:
        return []
    waiting = session.execute(
        select(Job).where(Job.batch_id == batch.id, Job.waiting_for == "batch",
                          Job.status == "queued")
        .order_by(Job.batch_index).limit(room)).scalars().all()
    effects: list[Effect] = []
    for job in waiting:
        effects += admit_job(session, job, events)
    if waiting and batch.status == "queued":
        batch.status = "running"
    return effects


def advance(sessions, batch_id: uuid.UUID) -> list[Effect]:
    """After a batch job ended (or from the sweeper): admit the next waiting jobs and end
    the batch after its last one. Takes the batch's lock first, holding no job's."""
    events = EventBuffer()
    with sessions() as session, session.begin():
        batch = lock_batch(session, batch_id)
        if batch is None:
            return []
        effects = admit(session, batch, events)
        session.flush()
        effects += end_if_done(session, batch)
        events.flush(session)
    events.announce()
    return effects


def end_batch(session: Session, batch: Batch) -> list[Effect]:
    """The batch's last job ended: its status, and its webhook's first delivery row."""
    batch.status = "cancelled" if batch.cancel_requested_at is not None else "completed"
    batch.finished_at = utcnow()
    if batch.callback_url:
        from agentq.webhooks.delivery import enqueue_event
        enqueue_event(session, tenant_id=batch.tenant_id, event_type=f"batch.{batch.status}",
                      url=batch.callback_url, batch_id=batch.id, due=batch.finished_at)
    return [BatchEnded(str(batch.id), batch.status)]


def pending_deliveries(session: Session, batch_id: uuid.UUID) -> list[str]:
    from agentq.models import WebhookDelivery
    return [str(i) for i in session.execute(
        select(WebhookDelivery.id).where(WebhookDelivery.batch_id == batch_id,
                                         WebhookDelivery.status == "pending")).scalars()]


def cancel_waiting(session: Session, batch: Batch) -> tuple[list[Effect], EventBuffer]:
    """First half of a batch cancel, under the batch's lock: mark it and cancel the jobs
    that were never admitted. The live ones are cancelled after, each in its own
    transaction (job row first), so a cancel never holds the batch while it waits for a
    job that a finishing step holds."""
    from agentq.loop.finish import finish_job
    events = EventBuffer()
    now = utcnow()
    batch.cancel_requested_at = batch.cancel_requested_at or now
    effects: list[Effect] = []
    with_webhook = session.execute(select(Job).where(
        Job.batch_id == batch.id, Job.waiting_for == "batch", Job.status == "queued",
        Job.callback_url.is_not(None))).scalars().all()
    for job in with_webhook:  # these get their job.cancelled event
        job.waiting_for = None
        effects += finish_job(session, job, "cancelled", "cancelled", "",
                              {"code": "cancelled", "message": "The batch was cancelled."},
                              events)
    session.execute(update(Job).where(Job.batch_id == batch.id, Job.waiting_for == "batch",
                                      Job.status == "queued")
                    .values(status="cancelled", finish_reason="cancelled", finished_at=now,
                            waiting_for=None,
                            response={"content": "", "files": [], "error": {
                                "code": "cancelled", "message": "The batch was cancelled."},
                                "metadata": {"tool_calls": []}})
                    .execution_options(synchronize_session=False))
    session.flush()
    effects += end_if_done(session, batch)
    return effects, events


def live_jobs(session: Session, batch_id: uuid.UUID) -> list[uuid.UUID]:
    return list(session.execute(select(Job.id).where(
        Job.batch_id == batch_id, Job.status.in_(("queued", "running")))).scalars())


def end_if_done(session: Session, batch: Batch) -> list[Effect]:
    unfinished = session.execute(select(func.count()).select_from(Job).where(
        Job.batch_id == batch.id, Job.status.not_in(tuple(TERMINAL_STATUSES)))).scalar_one()
    if unfinished == 0 and batch.status not in ("completed", "cancelled"):
        return end_batch(session, batch)
    return []
