"""One unit of work: a transaction, the events it records and the effects it asks for.

Every writer in agentq keeps one rule: commit, then announce, then dispatch. A worker never
reads a row that is not committed, a listener never hears of an event that may roll back,
and a crash between the commit and the dispatch is repaired by the sweeper (the rows say
what was due). This module keeps that rule once:

    with UnitOfWork(sessions) as uow:
        job = uow.session.get(Job, job_id)
        uow.event(job.id, "job_start", conversation_id=...)
        uow.effect(NextStep(str(job.id), 0, "start"))
    # committed; the events were announced; the effects went to the dispatcher

  1. `uow.session` is a session inside `begin()`: the caller writes rows.
  2. `uow.event(...)` queues a job event; they are written, in order and with their
     sequence numbers, just before the commit.
  3. `uow.effect(...)` queues an effect (plain values, `agentq.loop.effects`).
  4. On a clean exit: events written, commit, then the events are announced to the
     observers (`agentq.loop.store.on_events`: the SSE hub), then the effects are handed to
     this process's dispatcher. On an exception: rollback; nothing is announced or sent.

The dispatcher is registered once per process (`set_dispatcher`): Celery messages in
workers, the API and the CLI (`tasks.dispatch`), the in-process runner in unit tests and the
floor benchmark (`agentq.runner`). It never opens a session: anything that needs a
transaction (admitting a batch's jobs, scheduling webhooks) is an effect whose task opens
its own unit of work. A dispatcher that fails after the commit loses no work: the rows are
committed and the sweeper re-drives what was not sent; the failure is logged.
"""
from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Callable, Iterable, Literal, Sequence, TypeVar, cast

from sqlalchemy import update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, sessionmaker

from agentq import prepared
from agentq.config import get_settings
from agentq.db import relax_durability, riding_out, utcnow, write_changes
from agentq.loop.effects import Effect
from agentq.loop.states import LIVE_STATUSES
from agentq.models import Job
from agentq.prepared import deferred_writes

log = logging.getLogger(__name__)
T = TypeVar("T")

Dispatcher = Callable[[Sequence[Effect]], None]
_dispatcher: Dispatcher | None = None
_dispatcher_lock = threading.Lock()


def set_dispatcher(dispatcher: Dispatcher | None) -> Dispatcher | None:
    """Register this process's dispatcher; returns the one it replaces (tests restore it)."""
    global _dispatcher
    with _dispatcher_lock:
        previous, _dispatcher = _dispatcher, dispatcher
    return previous


class NoDispatcher(RuntimeError):
    """Effects were committed in a process that registered no dispatcher: a wiring bug (the
    sweeper still re-drives the job, but nothing here would have sent it)."""


def send(effects: Sequence[Effect]) -> bool:
    """Hand committed effects to the dispatcher; False when it failed. A failing dispatcher
    is logged, never raised: the rows are committed, and the sweeper re-drives whatever
    was not sent."""
    if not effects:
        return True
    target = _dispatcher
    if target is None:
        raise NoDispatcher(f"no effect dispatcher registered; {len(effects)} effect(s) "
                           f"committed but not sent: {list(effects)!r}")
    try:
        target(effects)
    except Exception:
        log.exception("effects not sent after commit; the sweeper re-drives them",
                      extra={"effects": [type(e).__name__ for e in effects]})
        return False
    return True


class UnitOfWork:
    """A transaction with its events and effects (see the module's docstring)."""

    def __init__(self, sessions: sessionmaker[Session] | Callable[[], Session], *,
                 durable: bool = True, autoflush: bool = True, lone: bool = False):
        """`durable=False`: the commit does not wait for its disk flush (a transaction
        whose loss in a database crash is re-done by a redelivery or the sweeper).
        `autoflush=False`: ORM changes are written once, just before the events, instead
        of before each query (a step changes its job row many times: one UPDATE).
        `lone=True`: the first statement is committed as it ends, a transaction of its own
        with no BEGIN or COMMIT sent (`agentq.prepared`, on Postgres): for a caller whose
        first statement does all of its writing, or writes nothing and is followed by
        statements that read again under their own locks (they form a second
        transaction, committed at the end as usual)."""
        self._sessions = sessions
        self._durable = durable
        self._autoflush = autoflush
        self._lone = lone
        self._session: Session | None = None
        self.events: list[tuple[uuid.UUID, str, dict[str, Any]]] = []
        self.effects: list[Effect] = []
        self.announced: dict[str, list[dict[str, Any]]] = {}
        """The events written by the last commit, per job (what observers were told)."""
        self.sent: list[Effect] = []
        """The effects handed to the dispatcher after the commit."""
        self._locked: dict[uuid.UUID, Job] = {}

    @property
    def session(self) -> Session:
        """The transaction's session, from `__enter__` on (after `__exit__`: closed)."""
        if self._session is None:
            raise RuntimeError("a unit of work has a session inside its `with` block only")
        return self._session

    # -- what the caller records ---------------------------------------------------------
    def event(self, job_id: uuid.UUID, type_: str, **data: Any) -> None:
        self.events.append((job_id, type_, data))

    def effect(self, *effects: Effect) -> None:
        self.effects.extend(effects)

    def written(self, job_id: uuid.UUID, events: list[dict[str, Any]]) -> None:
        """Events of `job_id` the caller wrote in a statement of its own (as the API shows
        them, `store.shown`): announced after the commit with those `event` queued."""
        self.announced.setdefault(str(job_id), []).extend(events)

    def holds(self, job: Job) -> None:
        """This transaction holds `job`'s row lock (taken by an UPDATE … RETURNING of it)
        and its object is current: its events take their numbers from it, written with
        the job's own UPDATE instead of one more."""
        self._locked[job.id] = job

    # -- the transaction ---------------------------------------------------------------
    def __enter__(self) -> "UnitOfWork":
        session = self._session = self._sessions()
        session.autoflush = self._autoflush
        session.begin()
        if not self._durable:
            relax_durability(session)
        _fold_begin(session, self._lone)  # its BEGIN sent with its first statement
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        session = self.session
        try:
            if exc_type is not None:
                session.rollback()
                self.events.clear()
                self.effects.clear()
                return False
            try:
                self.write_events()
                session.commit()
            except BaseException:
                session.rollback()
                raise
        finally:
            session.close()
        self.announce()
        effects, self.effects = self.effects, []
        self.sent = effects
        if not send(effects):
            self._redrive_soon(effects)
        return False

    def _redrive_soon(self, effects: Sequence[Effect]) -> None:
        """The steps these effects were to start did not go out (the broker away): their
        jobs are due for the sweeper's next pass, which sends them once the broker is back,
        instead of waiting out a step deadline first."""
        from agentq.loop.effects import NextStep
        job_ids = [e.job_id for e in effects if isinstance(e, NextStep)]
        if not job_ids:
            return
        try:
            due_now(self._sessions, job_ids)
        except Exception:  # noqa: BLE001 - the database away too: the deadline still holds
            log.exception("jobs whose step was not sent not marked due",
                          extra={"job_ids": job_ids})

    def write_events(self, now: datetime | None = None) -> None:
        """Write the queued events (also before the commit, for a caller that reads them
        back in the same transaction)."""
        from agentq.loop.store import append_events, insert_events, shown
        if not self.events:
            return
        now = now or utcnow()
        by_job: dict[uuid.UUID, list[tuple[str, dict[str, Any]]]] = {}
        for job_id, type_, data in self.events:
            by_job.setdefault(job_id, []).append((type_, data))
        self.events.clear()
        first: dict[uuid.UUID, int] = {}
        for job_id, items in by_job.items():
            held = self._locked.get(job_id)
            if held is not None:  # numbered now, the counter written with the job's row
                first[job_id] = held.event_seq + 1
                held.event_seq += len(items)
                held.last_progress_at = now
        alone, written = self._write_held_alone(by_job, first, now)
        if not alone:
            self.session.flush()  # those rows, and rows the events refer to (a new job)
        for job_id, items in by_job.items():
            if job_id not in first:
                announced = append_events(self.session, job_id, items, now)
            elif job_id in written:
                announced = shown(first[job_id], items, now)
            else:
                with deferred_writes(self.session):
                    announced = insert_events(self.session, job_id, first[job_id], items,
                                              now)
            self.announced.setdefault(str(job_id), []).extend(announced)

    def _write_held_alone(self, by_job: dict[uuid.UUID, list[tuple[str, dict[str, Any]]]],
                          first: dict[uuid.UUID, int], now: datetime
                          ) -> tuple[bool, set[uuid.UUID]]:
        """When the only changes are to jobs this transaction holds (a step changes only
        its job in most of its transactions), they are written by `db.write_changes`, one
        UPDATE each, without the ORM's flush, on Postgres each with its events (numbered
        from `first`) in the same statement. (Whether that wrote every change, the ids of
        the jobs whose events it wrote); False: there is more (new rows, other objects
        changed, a change write_changes declines), and the caller flushes the rest."""
        from agentq.loop.store import events_with_job
        session = self.session
        written: set[uuid.UUID] = set()
        if session.new or session.deleted:
            return False, written
        dirty = list(session.dirty)
        if not all(self._held(obj) for obj in dirty):
            return False, written
        together = session.get_bind().dialect.name == "postgresql"
        for obj in dirty:
            events = together and obj.id in first
            with deferred_writes(session):
                done = write_changes(session, obj, events_with_job(
                    obj.id, first[obj.id], by_job[obj.id], now) if events else None)
            if not done:
                return False, written
            if events:
                written.add(obj.id)
        return True, written

    def _held(self, obj: object) -> bool:
        """`obj` is the object of a job this transaction holds (`holds`)."""
        ident = getattr(obj, "id", None)
        return isinstance(ident, uuid.UUID) and self._locked.get(ident) is obj

    def announce(self) -> None:
        from agentq.loop.store import notify
        announced, self.announced = self.announced, {}
        for job_id, written in announced.items():
            notify(job_id, written)


def _fold_begin(session: Session, lone: bool = False) -> bool:
    """The transaction's BEGIN goes with its first statement (and the SET), one round trip
    instead of two, on agentq's psycopg2 connections (`agentq.prepared.Connection.
    fold_begin`); its commit or rollback ends it as before. `lone`: that first statement
    is a transaction of its own, no BEGIN or COMMIT sent for it. False (nothing changed)
    on another driver or dialect, or when the transaction has begun already."""
    connection = prepared.connection_of(session)
    return connection is not None and connection.fold_begin(lone)


def due_now(sessions: sessionmaker[Session] | Callable[[], Session],
            job_ids: Iterable[str]) -> int:
    """Jobs whose next step was committed but not sent (the broker was away): due for the
    sweeper's next pass, its re-drive backoff forgotten. A pass whose send fails too marks
    them again, so the first pass after the broker is back sends them (within
    AGENTQ_SWEEP_INTERVAL_S of its return, not a step deadline after). A step a worker has
    taken (`step_owner`) is left alone. Returns how many were marked."""
    overdue = utcnow() - timedelta(seconds=get_settings().step_deadline_s + 1)
    ids = [uuid.UUID(str(i)) for i in job_ids]
    with sessions() as session, session.begin():
        marked = cast("CursorResult[Any]", session.execute(  # an UPDATE's: it has rowcount
            update(Job).where(Job.id.in_(ids), Job.status.in_(LIVE_STATUSES),
                              Job.waiting_for.is_(None), Job.step_owner.is_(None))
            .values(last_progress_at=overdue, redrive_after=None)
            .execution_options(synchronize_session=False)))
        return marked.rowcount


def ride_out(sessions: sessionmaker[Session] | Callable[[], Session], deadline_s: float,
             kept: str, work: Callable[[UnitOfWork], T], *, durable: bool = True,
             autoflush: bool = True, lone: bool = False,
             **context: Any) -> tuple[T, UnitOfWork]:
    """`work(uow)` in a unit of work, kept through a database outage: the write of work
    done already (a tool ran, the model answered, a summary was made), tried again in a new
    unit of work while the database is away, for `deadline_s`, rather than lost and done
    again (`agentq.db.riding_out`, the one retry policy: `kept` and `context` name the write
    in its log lines). Returns what the committed attempt's `work` returned and its unit of
    work (`.sent`: the effects dispatched). `work` may run more than once: it starts from
    what it reads in its own transaction, and a caller that keeps state across attempts
    resets it in `work`. `durable`, `autoflush`, `lone`: the unit of work's."""
    for attempt in riding_out(deadline_s, kept, **context):
        with attempt, UnitOfWork(sessions, durable=durable, autoflush=autoflush,
                                 lone=lone) as uow:
            done = work(uow)
    return done, uow
