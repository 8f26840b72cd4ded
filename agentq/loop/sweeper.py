"""The sweeper: re-drives, from Postgres, every live job whose step has not advanced within
the deadline, so a job whose broker message was lost still completes.

A job whose turn's tools run is left alone while a call of that turn holds a live lease
(`tool_calls.lease_until`, renewed by the worker running it): a tool worker that died stops
renewing, the lease runs out, and the turn is re-driven (its lost calls dispatched again).

It tells poison from backlog:
  * a step that was CLAIMED (a worker took it: `step_owner` set) and whose lease ran out
    without progress crashed its worker (killed, out of memory, database lost mid-step).
    It counts in `claimed_attempts`; after `max_redrives` of them the job ends `failed`
    (`stalled`) instead of crashing workers forever;
  * a re-drive nobody claimed means nothing is consuming (the orchestrator is down, the
    broker lost its messages). That never fails a job: it is sent again with a growing
    delay (the deadline, doubled each time, at most `redrive_backoff_max_s`), so an outage
    of any length ends with every job completing and the queue holding a few copies per
    job at most. `backlog()` counts such jobs (GET /health/ready, agentq_jobs_unclaimed).
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import Exists, exists, or_, select
from sqlalchemy.orm import Session, sessionmaker

from agentq.config import Settings
from agentq.db import utcnow
from agentq.loop.effects import NextStep
from agentq.loop.lifecycle import (
    LIVE_STATUSES,
    JobStatus,
    StopReason,
    WaitingFor,
    active_job,
    admit_quota_waiters,
    end_job,
    hand_conversation,
)
from agentq.loop.states import DeliveryStatus, ToolCallStatus
from agentq.loop.uow import UnitOfWork
from agentq.models import Job, ToolCall, WebhookDelivery

log = logging.getLogger(__name__)
SWEEP_BATCH = 200


def redrive_delay_s(settings: Settings, unclaimed: int) -> float:
    """The wait before re-driving again a job whose last `unclaimed` re-drives nobody took."""
    return min(settings.step_deadline_s * 2.0 ** min(unclaimed, 20),
               max(settings.redrive_backoff_max_s, settings.step_deadline_s))


def _a_tool_runs(now: datetime) -> Exists:
    """A pending call of the job's current turn whose lease lives: a worker runs its tool
    and renews it (agentq.loop.leases), so the job is slow, not stalled. Its lease is on
    the call's row, never the job's (issue 34). A call that ended holds nothing: storing
    its result was the job's progress (its event stamps `last_progress_at`)."""
    return exists().where(ToolCall.job_id == Job.id, ToolCall.iteration == Job.iteration,
                          ToolCall.status == ToolCallStatus.PENDING,
                          ToolCall.lease_until > now)


def sweep(settings: Settings, sessions: sessionmaker[Session]) -> int:
    """Re-drive (or, past `max_redrives` crashes, fail) stalled jobs; returns how many."""
    now = utcnow()
    deadline = now - timedelta(seconds=settings.step_deadline_s)
    swept = 0
    with UnitOfWork(sessions) as uow:
        session = uow.session
        query = (select(Job).where(Job.status.in_(LIVE_STATUSES),
                                   Job.waiting_for.is_(None),
                                   Job.last_progress_at < deadline,
                                   or_(Job.step_lease_until.is_(None),
                                       Job.step_lease_until < now),
                                   or_(Job.redrive_after.is_(None),
                                       Job.redrive_after <= now),
                                   ~_a_tool_runs(now))
                 .order_by(Job.last_progress_at).limit(SWEEP_BATCH))
        if session.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        for job in session.execute(query).scalars():
            swept += 1
            claimed = job.step_owner is not None
            if claimed:  # a worker took the step and died (or lost the database) in it
                job.claimed_attempts = (job.claimed_attempts or 0) + 1
            if job.claimed_attempts > settings.max_redrives:
                log.error("job's step keeps crashing; failing it",
                          extra={"job_id": str(job.id), "attempts": job.claimed_attempts})
                end_job(uow, job, StopReason.ERROR,
                        "The job stopped making progress and was ended.",
                        {"code": "stalled",
                         "message": f"Its step was taken and crashed "
                                    f"{job.claimed_attempts} times.",
                         "redrives": job.redrives, "claimed_attempts": job.claimed_attempts})
                continue
            unclaimed = max(0, (job.redrives or 0) - (job.claimed_attempts or 0))
            job.redrives = (job.redrives or 0) + 1
            job.last_progress_at = now
            job.redrive_after = now + timedelta(seconds=redrive_delay_s(settings, unclaimed))
            job.step_owner = job.step_lease_until = None
            log.warning("re-driving stalled job", extra={
                "job_id": str(job.id), "iteration": job.iteration, "redrive": job.redrives,
                "claimed": claimed, "unclaimed_before": unclaimed})
            uow.event(job.id, "job_redriven", iteration=job.iteration, redrive=job.redrives,
                      crashed=claimed, unclaimed=unclaimed)
            uow.effect(NextStep(str(job.id), job.iteration, "sweeper"))
    return swept


def backlog(session: Session) -> int:
    """Live jobs whose latest re-drive no worker has taken: the sign that nothing consumes
    the orchestrator queue (they wait; they are not failed for it)."""
    from sqlalchemy import func
    return int(session.execute(
        select(func.count()).select_from(Job).where(
            Job.status.in_(LIVE_STATUSES), Job.waiting_for.is_(None),
            Job.step_owner.is_(None), Job.redrives > Job.claimed_attempts)).scalar_one())


def sweep_deliveries(settings: Settings, sessions: sessionmaker[Session]) -> list[str]:
    """Ids of overdue pending webhook deliveries, each marked due now, so that one is
    re-enqueued at most once per margin (a duplicate is harmless: attempts claim the row)."""
    now = utcnow()
    overdue = now - timedelta(seconds=settings.webhook_overdue_s)
    with sessions() as session, session.begin():
        query = (select(WebhookDelivery)
                 .where(WebhookDelivery.status == DeliveryStatus.PENDING,
                        WebhookDelivery.next_attempt_at < overdue)
                 .order_by(WebhookDelivery.next_attempt_at).limit(SWEEP_BATCH))
        if session.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        rows = session.execute(query).scalars().all()
        for row in rows:
            row.next_attempt_at = now
        ids = [str(row.id) for row in rows]
    if ids:
        log.warning("re-enqueuing overdue webhook deliveries", extra={"count": len(ids)})
    return ids


def sweep_waiting(settings: Settings, sessions: sessionmaker[Session]) -> int:
    """Safety net for jobs that wait: a conversation left without a live owner gets its next
    waiting job, and a batch with room admits more (each normally happens when a job ends,
    in that job's transaction; this covers a crash between). A batch's lines are
    `agentq.batches.sweep`'s."""
    from agentq.loop.busy import lock_conversation, next_waiting
    from agentq.tenants import tenants_waiting_for_quota
    now = utcnow()
    stale = now - timedelta(seconds=settings.step_deadline_s)
    started = 0
    with UnitOfWork(sessions) as uow:
        session = uow.session
        conversations = session.execute(
            select(Job.conversation_id).where(Job.status == JobStatus.QUEUED,
                                              Job.waiting_for == WaitingFor.CONVERSATION,
                                              Job.created_at < stale)
            .distinct().limit(SWEEP_BATCH)).scalars().all()
        for conversation_id in conversations:
            conversation = lock_conversation(session, conversation_id)
            if active_job(session, conversation) is not None:
                continue
            nxt = next_waiting(session, conversation_id)
            if nxt is not None:
                log.warning("starting a job its conversation forgot",
                            extra={"job_id": str(nxt.id)})
                hand_conversation(uow, conversation, nxt, now, settings)
                started += 1
        for tenant_id in tenants_waiting_for_quota(session):  # a running-jobs quota
            started += admit_quota_waiters(uow, tenant_id, settings)  # with room again
    from agentq.agents import sweep as sweep_sub_agents  # parents and their children
    return started + sweep_sub_agents(settings, sessions)
