"""A step's lease stays alive while the step works outside a transaction.

A step claims its job with a lease of one step deadline (`AGENTQ_STEP_DEADLINE_S`); the
sweeper re-drives a claimed job whose lease ran out, taking the worker for dead. Between
the claim and the persist the step calls the model (with retries, fallbacks and, for long
conversations, a summary first), which may well outlast one deadline. Were the lease left
to run out, the sweeper would re-drive a job whose step is alive: a second model call for
the same turn, paid twice, and one of the two replies thrown away.

So while a step works, this process renews its lease: one thread per process, one UPDATE
for all of its steps every third of a deadline. A step whose worker dies is no longer
renewed, and its lease runs out one deadline after the last renewal, as before.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Iterator

from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from agentq.db import utcnow
from agentq.models import Job

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews the leases of the steps held through `hold()`. Thread-safe; its thread starts
    with the first hold and is a daemon (a process that ends takes its leases with it)."""

    def __init__(self, sessions: sessionmaker, deadline_s: float):
        self._sessions = sessions
        self.deadline_s = deadline_s
        self.interval_s = deadline_s / 3
        self._held: dict[str, uuid.UUID] = {}
        """step owner → job id"""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def hold(self, job_id: str | uuid.UUID, owner: str) -> Iterator[None]:
        """Keep the lease of `owner` on `job_id` alive for the block."""
        with self._lock:
            self._held[owner] = uuid.UUID(str(job_id))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentq-leases",
                                                daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(owner, None)

    def renew(self) -> int:
        """Push every held lease one deadline ahead; how many rows still held theirs (a
        step whose job was re-driven or ended meanwhile has no lease left to renew)."""
        with self._lock:
            held = dict(self._held)
        if not held:
            return 0
        until = utcnow() + timedelta(seconds=self.deadline_s)
        with self._sessions() as session, session.begin():
            result = session.execute(
                update(Job).where(Job.id.in_(set(held.values())),
                                  Job.step_owner.in_(list(held)))
                .values(step_lease_until=until)
                .execution_options(synchronize_session=False))
        return result.rowcount

    def _run(self) -> None:
        while True:
            time.sleep(self.interval_s)
            try:
                self.renew()
            except Exception:  # noqa: BLE001 - the database away: the next round tries again
                log.warning("step leases not renewed", exc_info=True,
                            extra={"event": "step.lease_renewal_failed"})
