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

A tool call is leased the same way while its tool runs (`ToolLeaseKeeper`): a copy of the
call delivered meanwhile (the sweeper re-dispatched it, the broker redelivered it) waits
for the running one's result, and one delivered after the lease ran out knows that worker
died (agentq.loop.execute). That lease is the call's row alone: the sweeper leaves a job
alone while a call of its turn holds one (agentq.loop.sweeper), and the job's row is not
written for it.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any, Callable, Iterator, cast

from sqlalchemy import update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, sessionmaker

from agentq.db import utcnow
from agentq.loop.states import ToolCallStatus
from agentq.models import Job, ToolCall

log = logging.getLogger(__name__)

RETRY_S = 1.0
"""After a failed renewal (the database away), the next try."""


class _Keeper:
    """Renews the leases held through `hold()`: one daemon thread per keeper (started with
    the first hold) writes, in one statement, every held lease with a third of a deadline
    or less left. Thread-safe; a process that ends takes its leases with it."""

    def __init__(self, sessions: sessionmaker[Session] | Callable[[], Session],
                 deadline_s: float):
        self._sessions = sessions
        self.deadline_s = deadline_s
        self._margin = timedelta(seconds=deadline_s / 3)
        self._held: dict[str, tuple[uuid.UUID, datetime]] = {}
        """holder's key → (job id, when its lease is due for renewal)"""
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wakes_at: datetime | None = None
        """When the waiting thread wakes next (None: it waits for a hold)."""
        self.wakeups = 0
        """How often the thread woke: at a lease due, or told of one due sooner."""

    @contextlib.contextmanager
    def hold(self, job_id: str | uuid.UUID, key: str,
             lease_until: datetime | None = None) -> Iterator[None]:
        """Keep the lease of `key` on `job_id` (running out at `lease_until`; a deadline
        from now if not given) alive for the block."""
        until = lease_until or utcnow() + timedelta(seconds=self.deadline_s)
        due = until - self._margin
        with self._changed:
            self._held[key] = (uuid.UUID(str(job_id)), due)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"agentq-{type(self).__name__}")
                self._thread.start()
            # The thread is told only of a lease due before it wakes anyway: with 1,000
            # steps in flight, waking it for each hold made it look over all of them each
            # time (docs/benchmarks.md, the fifth pass).
            if self._wakes_at is None or due < self._wakes_at:
                self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._held.pop(key, None)

    def renew(self, keys: list[str] | None = None) -> int:
        """Push the held leases of `keys` (all when None) one deadline ahead; how many
        rows still held theirs."""
        with self._changed:
            held = {k: self._held[k][0] for k in (self._held if keys is None else keys)
                    if k in self._held}
        if not held:
            return 0
        now = utcnow()
        until = now + timedelta(seconds=self.deadline_s)
        with self._sessions() as session, session.begin():
            renewed = self._write(session, held, until)
        self._reschedule(held, until - self._margin)
        return renewed

    def _write(self, session: Session, held: dict[str, uuid.UUID], until: datetime) -> int:
        raise NotImplementedError

    def _reschedule(self, held: dict[str, uuid.UUID], due: datetime) -> None:
        with self._changed:
            for key, job_id in held.items():
                if key in self._held:
                    self._held[key] = (job_id, due)

    def _due(self) -> list[str]:
        """Wait until some held lease is due; the keys of those that are."""
        with self._changed:
            while True:
                now = utcnow()
                due = [k for k, (_, at) in self._held.items() if at <= now]
                if due:
                    return due
                soonest = min((at for _, at in self._held.values()), default=None)
                self._wakes_at = soonest
                self._changed.wait(None if soonest is None
                                   else (soonest - now).total_seconds())
                self.wakeups += 1

    def _run(self) -> None:
        while True:
            keys = self._due()
            try:
                self.renew(keys)
            except Exception:  # noqa: BLE001 - the database away: try again shortly
                log.warning("leases not renewed", exc_info=True,
                            extra={"event": "lease_renewal_failed",
                                   "kind": type(self).__name__})
                with self._changed:
                    retry_at = utcnow() + timedelta(seconds=RETRY_S)
                    for key in keys:
                        if key in self._held:
                            self._held[key] = (self._held[key][0], retry_at)


class LeaseKeeper(_Keeper):
    """Steps: `hold(job_id, owner)` keeps the job's `step_lease_until` alive while the step
    named `owner` works (a step whose job was re-driven or ended meanwhile has no lease left
    to renew)."""

    def _write(self, session: Session, held: dict[str, uuid.UUID], until: datetime) -> int:
        renewed = cast("CursorResult[Any]", session.execute(  # an UPDATE's: it has rowcount
            update(Job).where(Job.id.in_(list(set(held.values()))),
                              Job.step_owner.in_(list(held)))
            .values(step_lease_until=until)
            .execution_options(synchronize_session=False)))
        return renewed.rowcount


class ToolLeaseKeeper(_Keeper):
    """Tool calls: `hold(job_id, tool_use_id)` keeps the call's `lease_until` alive while
    its tool runs. The job's row is not written: the sweeper reads the leases of the job's
    turn (a slow tool is no stalled job: it leaves the job alone while the worker running
    the call lives)."""

    def _write(self, session: Session, held: dict[str, uuid.UUID], until: datetime) -> int:
        renewed = cast("CursorResult[Any]", session.execute(  # an UPDATE's: it has rowcount
            update(ToolCall).where(ToolCall.tool_use_id.in_(list(held)),
                                   ToolCall.status == ToolCallStatus.PENDING)
            .values(lease_until=until)
            .execution_options(synchronize_session=False)))
        return renewed.rowcount
