"""The safety net of jobs that wait for their provider: each waits for a delayed message
(its step, with an ETA). A message lost with the broker (a Redis restart or FLUSHALL)
would leave the job waiting for ever, so the sweeper re-sends the step of any job whose
next attempt is overdue by more than a step deadline. A duplicate is harmless: the step's
claim is a compare-and-set on (job, iteration). Such a re-send is not a re-drive: it never
counts towards failing the job (only the wait window does)."""
from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import sessionmaker

from agentq.config import Settings
from agentq.db import utcnow
from agentq.loop.effects import NextStep
from agentq.loop.uow import UnitOfWork
from agentq.models import Job

log = logging.getLogger(__name__)
SWEEP_BATCH = 200


def sweep_provider_waits(settings: Settings, sessions: sessionmaker) -> int:
    now = utcnow()
    overdue = now - timedelta(seconds=max(settings.step_deadline_s,
                                          2 * settings.sweep_interval_s))
    resent = 0
    with UnitOfWork(sessions) as uow:
        session = uow.session
        query = (select(Job).where(Job.status.in_(("queued", "running")),
                                   Job.waiting_for == "provider",
                                   Job.provider_next_attempt_at < overdue,
                                   or_(Job.step_lease_until.is_(None),
                                       Job.step_lease_until < now))
                 .order_by(Job.provider_next_attempt_at).limit(SWEEP_BATCH))
        if session.bind.dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        for job in session.execute(query).scalars():
            log.warning("re-sending the overdue attempt of a job waiting for its provider",
                        extra={"job_id": str(job.id), "iteration": job.iteration})
            job.provider_next_attempt_at = now  # re-sent at most once per deadline
            uow.effect(NextStep(str(job.id), job.iteration, "provider"))
            resent += 1
    return resent
