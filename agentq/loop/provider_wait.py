"""Waiting for the model provider (step 6 of `agentq.loop.step` when the model call fails).

When every model failed with a transient error (429, 5xx, timeout, connection, circuit
open), the job waits for its provider: `waiting_for = provider` (shown as `status:
waiting`), a `waiting_provider` event with `next_attempt_at`, and the same step sent again
as a delayed message: no worker waits (`ProviderWaits`). Attempts back off (Retry-After
honoured) for AGENTQ_PROVIDER_WAIT_S, then the job fails `provider_unavailable`
(`decision.wait_for_provider` decides, a pure function). Any other provider error fails it
at once.

The safety net of jobs that wait for their provider: each waits for a delayed message
(its step, with an ETA). A message lost with the broker (a Redis restart or FLUSHALL)
would leave the job waiting for ever, so the sweeper re-sends the step of any job whose
next attempt is overdue by more than a step deadline (`sweep_provider_waits`). A duplicate
is harmless: the step's claim is a compare-and-set on (job, iteration). Such a re-send is
not a re-drive: it never counts towards failing the job (only the wait window does)."""
from __future__ import annotations

import logging
import random
from datetime import datetime, timedelta
from typing import assert_never

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import ProviderError
from agentq.loop.decision import Stop, WaitForProvider, wait_for_provider
from agentq.loop.effects import Effect, NextStep
from agentq.loop.endings import Endings
from agentq.loop.lifecycle import LIVE_STATUSES, StopReason, WaitingFor
from agentq.loop.lifecycle import wait_for_provider as hold_for_provider
from agentq.loop.turn import Wired, leased
from agentq.loop.uow import UnitOfWork
from agentq.models import Job

log = logging.getLogger(__name__)
SWEEP_BATCH = 200


def sweep_provider_waits(settings: Settings, sessions: sessionmaker[Session]) -> int:
    now = utcnow()
    overdue = now - timedelta(seconds=max(settings.step_deadline_s,
                                          2 * settings.sweep_interval_s))
    resent = 0
    with UnitOfWork(sessions) as uow:
        session = uow.session
        query = (select(Job).where(Job.status.in_(LIVE_STATUSES),
                                   Job.waiting_for == WaitingFor.PROVIDER,
                                   Job.provider_next_attempt_at < overdue,
                                   or_(Job.step_lease_until.is_(None),
                                       Job.step_lease_until < now))
                 .order_by(Job.provider_next_attempt_at).limit(SWEEP_BATCH))
        if session.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        for job in session.execute(query).scalars():
            log.warning("re-sending the overdue attempt of a job waiting for its provider",
                        extra={"job_id": str(job.id), "iteration": job.iteration})
            job.provider_next_attempt_at = now  # re-sent at most once per deadline
            uow.effect(NextStep(str(job.id), job.iteration, "provider"))
            resent += 1
    return resent


class ProviderWaits:
    """Step 6's ending when the model call failed: every model failed with a transient
    error → the job is parked (`waiting_for = provider`) and this step sent again as a
    delayed message, or, past AGENTQ_PROVIDER_WAIT_S, failed `provider_unavailable`; any
    other provider error fails it at once. When to try again is decided by
    `decision.wait_for_provider`, a pure function; this writes what it decided."""

    def __init__(self, step: Wired, endings: Endings):
        self.step = step
        self.endings = endings

    def failed(self, job_id: str, iteration: int, owner: str,
               exc: ProviderError) -> list[Effect]:
        """The model call failed with `exc`: wait for the provider, or fail the job."""
        if exc.transient:
            return self._wait(job_id, iteration, owner, exc)
        return self._fail(job_id, iteration, owner, exc)

    def _wait(self, job_id: str, iteration: int, owner: str,
              exc: ProviderError) -> list[Effect]:
        """Every model failed with a transient error: park the job and send this step again
        later, or end it once the wait window has passed."""
        settings = self.step.settings
        failed_ctx = None
        with UnitOfWork(self.step.sessions) as uow:
            job = leased(uow.session, job_id, iteration, owner)
            if job is None:
                return []
            now = utcnow()
            last_error = exc.attempts[-1]["error"] if exc.attempts else exc.message
            plan = wait_for_provider(
                now=now, waiting_since=job.provider_wait_since,
                attempts=job.provider_attempts, window_s=settings.provider_wait_s,
                base_s=settings.provider_retry_base_s, max_s=settings.provider_retry_max_s,
                jitter=random.random(), retry_after_s=exc.retry_after_s,
                last_error=last_error)
            match plan:
                case Stop():
                    log.warning("provider unavailable for the whole wait; failing the job",
                                extra={"job_id": job_id, "error": last_error})
                    error = {"code": "provider_unavailable", "message": plan.message}
                    failed_ctx = self.endings.failed_turn(uow, job, iteration, error)
                    self.endings.end(uow, job, StopReason.ERROR,
                                     "The model provider could not be reached for too long; "
                                     "please try again later.",
                                     {**error, **{k: v for k, v in plan.details.items()
                                                  if k != "code"}, "attempts": exc.attempts})
                case WaitForProvider():
                    _park(uow, job, plan, exc, last_error, now)
                case _:
                    assert_never(plan)
        self.endings.after_failed_turn(failed_ctx)
        return uow.sent

    def _fail(self, job_id: str, iteration: int, owner: str,
              exc: ProviderError) -> list[Effect]:
        """A provider error that will not pass by itself: the job fails at once."""
        with UnitOfWork(self.step.sessions) as uow:
            job = leased(uow.session, job_id, iteration, owner)
            if job is None:
                return []
            log.warning("model call failed", extra={"job_id": job_id, "error": exc.message})
            error = {"code": exc.code, "message": exc.message}
            failed_ctx = self.endings.failed_turn(uow, job, iteration, error)
            self.endings.end(uow, job, StopReason.ERROR,
                             "The model could not be reached; please try again.",
                             {**error, "attempts": exc.attempts})
        self.endings.after_failed_turn(failed_ctx)
        return uow.sent


def _park(uow: UnitOfWork, job: Job, plan: WaitForProvider, exc: ProviderError,
          last_error: str, now: datetime) -> None:
    """The job waits for its provider, holding no worker: its step goes out again as a
    message delayed to `plan.next_attempt_at`."""
    hold_for_provider(job)
    job.provider_wait_since = plan.waiting_since
    job.provider_attempts = plan.attempt
    job.provider_next_attempt_at = plan.next_attempt_at
    job.step_owner = job.step_lease_until = None
    job.last_progress_at = now
    job.redrives = 0  # the step ended in a known state: parking is progress
    log.warning("waiting for the model provider", extra={
        "job_id": str(job.id), "attempt": plan.attempt, "delay_s": round(plan.delay_s, 3),
        "error": last_error})
    uow.event(job.id, "waiting_provider", turn=job.iteration + 1,
              next_attempt_at=plan.next_attempt_at.isoformat(),
              attempt=plan.attempt, delay_s=round(plan.delay_s, 3),
              retry_after_s=exc.retry_after_s, error=last_error,
              waiting_since=plan.waiting_since.isoformat())
    uow.effect(NextStep(str(job.id), job.iteration, "provider", plan.next_attempt_at))
