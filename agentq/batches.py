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
from datetime import timedelta
from typing import Any

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session, sessionmaker

from agentq.config import Settings
from agentq.db import lock_row, utcnow
from agentq.ids import new_id
from agentq.loop.effects import BatchEnded, SendWebhooks
from agentq.loop.lifecycle import (
    LIVE_STATUSES,
    JobStatus,
    StopReason,
    WaitingFor,
    end_job,
    end_unstarted,
)
from agentq.loop.lifecycle import (
    admit as admit_line,
)
from agentq.loop.states import BATCH_ENDED, ENDED_STATUSES, BatchStatus
from agentq.loop.sweeper import SWEEP_BATCH
from agentq.loop.uow import UnitOfWork
from agentq.models import Batch, Job

_NOT_ADMITTED = (Job.waiting_for == WaitingFor.BATCH, Job.status == JobStatus.QUEUED)
"""A line of the batch not admitted yet."""


def lock_batch(session: Session, batch_id: uuid.UUID) -> Batch | None:
    return lock_row(session, Batch, batch_id)


def admit(uow: UnitOfWork, batch: Batch) -> None:
    """Admit waiting jobs in request order up to the batch's concurrency."""
    from agentq.loop.submit import admit as admit_job
    session = uow.session
    if batch.cancel_requested_at is not None or batch.status in BATCH_ENDED:
        return
    live = session.execute(select(func.count()).select_from(Job).where(
        Job.batch_id == batch.id, Job.status.in_(LIVE_STATUSES),
        Job.waiting_for.is_distinct_from(WaitingFor.BATCH))).scalar_one()
    room = batch.max_concurrency - live
    if room <= 0:
        return
    waiting = session.execute(
        select(Job).where(Job.batch_id == batch.id, *_NOT_ADMITTED)
        .order_by(Job.batch_index).limit(room)).scalars().all()
    for job in waiting:
        admit_job(uow, job)
    if waiting and batch.status == BatchStatus.QUEUED:
        batch.status = BatchStatus.RUNNING


def advance(sessions, batch_id: uuid.UUID) -> None:
    """After a batch job ended (or from the sweeper): admit the next waiting jobs and end
    the batch after its last one. Takes the batch's lock first, holding no job's."""
    with UnitOfWork(sessions) as uow:
        batch = lock_batch(uow.session, batch_id)
        if batch is None:
            return
        admit(uow, batch)
        uow.session.flush()
        end_if_done(uow, batch)


def sweep(settings: Settings, sessions: sessionmaker[Session]) -> int:
    """The sweeper's safety net for batches (a crash between a line's end and its batch's
    `advance`): a batch with lines waiting for admission for a step deadline, or whose
    every job ended while it is not marked ended, is advanced. Returns how many."""
    stale = utcnow() - timedelta(seconds=settings.step_deadline_s)
    with sessions() as session:
        batch_ids = {batch_id for batch_id in session.execute(  # a line's: never None
            select(Job.batch_id).where(*_NOT_ADMITTED, Job.created_at < stale)
            .distinct().limit(SWEEP_BATCH)).scalars() if batch_id is not None}
        batch_ids |= set(session.execute(  # every job ended, the batch not marked so
            select(Batch.id).where(Batch.status.in_((BatchStatus.QUEUED, BatchStatus.RUNNING)),
                                   Batch.created_at < stale,
                                   ~exists().where(Job.batch_id == Batch.id,
                                                   Job.status.in_(LIVE_STATUSES)))
            .limit(SWEEP_BATCH)).scalars())
    for batch_id in batch_ids:
        advance(sessions, batch_id)
    return len(batch_ids)


def end_batch(uow: UnitOfWork, batch: Batch) -> None:
    """The batch's last job ended: its status, and its webhook's first delivery row."""
    batch.status = (BatchStatus.CANCELLED if batch.cancel_requested_at is not None
                    else BatchStatus.COMPLETED)
    batch.finished_at = utcnow()
    if batch.callback_url:
        from agentq.webhooks.outbox import enqueue_event
        delivery = enqueue_event(uow.session, tenant_id=batch.tenant_id,
                                 event_type=f"batch.{batch.status}", url=batch.callback_url,
                                 batch_id=batch.id, due=batch.finished_at)
        uow.effect(SendWebhooks((str(delivery.id),)))
    uow.effect(BatchEnded(str(batch.id), batch.status))


def cancel_waiting(uow: UnitOfWork, batch: Batch) -> None:
    """First half of a batch cancel, under the batch's lock: mark it and cancel the jobs
    that were never admitted. The live ones are cancelled after, each in its own
    transaction (job row first), so a cancel never holds the batch while it waits for a
    job that a finishing step holds."""
    session, now = uow.session, utcnow()
    batch.cancel_requested_at = batch.cancel_requested_at or now
    with_webhook = session.execute(select(Job).where(
        Job.batch_id == batch.id, *_NOT_ADMITTED,
        Job.callback_url.is_not(None))).scalars().all()
    for job in with_webhook:  # these get their job.cancelled event
        admit_line(job, now)
        end_job(uow, job, StopReason.CANCELLED, "",
                {"code": "cancelled", "message": "The batch was cancelled."})
    end_unstarted(session, (Job.batch_id == batch.id, *_NOT_ADMITTED),
                  {"code": "cancelled", "message": "The batch was cancelled."}, now)
    session.flush()
    end_if_done(uow, batch)


def live_jobs(session: Session, batch_id: uuid.UUID) -> list[uuid.UUID]:
    return list(session.execute(select(Job.id).where(
        Job.batch_id == batch_id, Job.status.in_(LIVE_STATUSES))).scalars())


def end_if_done(uow: UnitOfWork, batch: Batch) -> None:
    unfinished = uow.session.execute(select(func.count()).select_from(Job).where(
        Job.batch_id == batch.id, Job.status.not_in(ENDED_STATUSES))).scalar_one()
    if unfinished == 0 and batch.status not in BATCH_ENDED:
        end_batch(uow, batch)


# --- creating and cancelling (the API's batch views call these) ------------------------

def create(uow: UnitOfWork, *, kind: str, tenant_id: uuid.UUID,
           api_key_id: uuid.UUID | None, total: int, max_concurrency: int,
           callback_url: str | None, meta: dict[str, Any]) -> Batch:
    """The batch's row; the caller adds its jobs (`add_messages`, `add_replays`), then
    `admit`s the first ones in the same unit of work."""
    batch = Batch(id=new_id(), tenant_id=tenant_id, api_key_id=api_key_id, kind=kind,
                  status=BatchStatus.QUEUED, total=total, max_concurrency=max_concurrency,
                  callback_url=callback_url, meta=meta)
    uow.session.add(batch)
    uow.session.flush()
    return batch


def add_messages(uow: UnitOfWork, settings, batch: Batch,
                 lines: list[tuple[Any, str | None]]) -> None:
    """One waiting job per (Submission, custom_id), in request order. Who and where are
    resolved once per distinct user and conversation."""
    from agentq.loop.submit import submit
    cache: dict = {}
    for index, (sub, custom_id) in enumerate(lines):
        job = submit(uow, settings, sub, batch_id=batch.id, cache=cache).job
        job.batch_index, job.custom_id = index, custom_id
    uow.session.flush()


def add_replays(uow: UnitOfWork, settings, batch: Batch, originals: list[Job], mode: str,
                *, model: str | None, persona_id: uuid.UUID | None,
                api_key_id: uuid.UUID | None) -> None:
    """One waiting replay per ended job, in the order given (custom_id: the original)."""
    from agentq.loop.replay import create_replay
    for index, original in enumerate(originals):
        job = create_replay(uow, settings, original, mode, model=model,
                            persona_id=persona_id, api_key_id=api_key_id, batch_id=batch.id)
        job.batch_index, job.custom_id = index, str(original.id)
    uow.session.flush()


def cancel(sessions, batch_id: uuid.UUID) -> None:
    """Cancel a batch: under its lock, mark it and cancel the lines never admitted; then
    each live job, one unit of work each (its row first), as a job cancel does. Raises
    Conflict when the batch has ended."""
    from agentq.errors import Conflict, NotFound
    from agentq.loop.busy import lock_job
    from agentq.loop.submit import cancel as cancel_job
    with UnitOfWork(sessions) as uow:
        batch = lock_batch(uow.session, batch_id)
        if batch is None:
            raise NotFound("batch", str(batch_id))
        if batch.status in BATCH_ENDED:
            raise Conflict(f"Batch {batch_id} has already ended ({batch.status}).",
                           batch_id=str(batch_id), status=batch.status)
        cancel_waiting(uow, batch)
    with sessions() as session:
        live = live_jobs(session, batch_id)
    for job_id in live:
        with UnitOfWork(sessions) as uow:
            job = lock_job(uow.session, job_id)
            if job is not None and job.status in LIVE_STATUSES:
                cancel_job(uow, job)
