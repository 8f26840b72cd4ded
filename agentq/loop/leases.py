"""A step's lease stays alive while the step works outside a transaction.

A step claims its job with a lease of one step deadline (`AGENTQ_STEP_DEADLINE_S`); the
sweeper re-drives a claimed job whose lease ran out, taking the worker for dead. Between
the claim and the persist the step calls the model (with retries, fallbacks and, for long
conversations, a summary first), which may well outlast one deadline. Were the lease left
to run out, the sweeper would re-drive a job whose step is alive: a second model call for
the same turn, paid twice, and one of the two replies thrown away.

So while a step works, this process renews its lease: one thread per process renews, in
one UPDATE, every held lease that has a third of a deadline or less left. A step that
answers sooner costs nothing (the usual case: no write at all). A step whose worker dies is
no longer renewed, and its lease runs out one deadline after the last renewal, as before.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from datetime import datetime, timedelta
from typing import Iterator

from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from agentq.db import utcnow
from agentq.models import Job

log = logging.getLogger(__name__)

RETRY_S = 1.0
"""After a failed renewal (the database away), the next try."""


class LeaseKeeper:
    """Renews the leases of the steps held through `hold()`. Thread-safe; its thread starts
    with the first hold and is a daemon (a process that ends takes its leases with it)."""

    def __init__(self, sessions: sessionmaker, deadline_s: float):
        self._sessions = sessions
        self.deadline_s = deadline_s
        self._margin = timedelta(seconds=deadline_s / 3)
        self._held: dict[str, tuple[uuid.UUID, datetime]] = {}
        """step owner → (job id, when its lease is due for renewal)"""
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def hold(self, job_id: str | uuid.UUID, owner: str,
             lease_until: datetime | None = None) -> Iterator[None]:
        """Keep the lease of `owner` on `job_id` (running out at `lease_until`; a deadline
        from now if not given) alive for the block."""
        until = lease_until or utcnow() + timedelta(seconds=self.deadline_s)
        with self._changed:
            self._held[owner] = (uuid.UUID(str(job_id)), until - self._margin)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentq-leases",
                                                daemon=True)
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._held.pop(owner, None)

    def renew(self, owners: list[str] | None = None) -> int:
        """Push the held leases of `owners` (all when None) one deadline ahead; how many
        rows still held theirs (a step whose job was re-driven or ended meanwhile has no
        lease left to renew)."""
        with self._changed:
            held = {o: self._held[o][0] for o in (self._held if owners is None else owners)
                    if o in self._held}
        if not held:
            return 0
        now = utcnow()
        with self._sessions() as session, session.begin():
            result = session.execute(
                update(Job).where(Job.id.in_(list(set(held.values()))),
                                  Job.step_owner.in_(list(held)))
                .values(step_lease_until=now + timedelta(seconds=self.deadline_s))
                .execution_options(synchronize_session=False))
        self._reschedule(held, now + timedelta(seconds=self.deadline_s) - self._margin)
        return result.rowcount

    def _reschedule(self, held: dict[str, uuid.UUID], due: datetime) -> None:
        with self._changed:
            for owner, job_id in held.items():
                if owner in self._held:
                    self._held[owner] = (job_id, due)

    def _due(self) -> list[str]:
        """Wait until some held lease is due; the owners of those that are."""
        with self._changed:
            while True:
                now = utcnow()
                due = [o for o, (_, at) in self._held.items() if at <= now]
                if due:
                    return due
                soonest = min((at for _, at in self._held.values()), default=None)
                self._changed.wait(None if soonest is None
                                   else (soonest - now).total_seconds())

    def _run(self) -> None:
        while True:
            owners = self._due()
            try:
                self.renew(owners)
            except Exception:  # noqa: BLE001 - the database away: try again shortly
                log.warning("step leases not renewed", exc_info=True,
                            extra={"event": "step.lease_renewal_failed"})
                with self._changed:
                    retry_at = utcnow() + timedelta(seconds=RETRY_S)
                    for owner in owners:
                        if owner in self._held:
                            self._held[owner] = (self._held[owner][0], retry_at)
