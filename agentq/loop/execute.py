"""Running one tool call, keyed by its tool_use_id.

A started call holds a lease of one step deadline, renewed while its tool runs
(agentq.loop.leases). A copy delivered while the lease lives (the sweeper re-dispatched the
turn, the broker redelivered) waits for the running delivery's result. A copy delivered
after the lease ran out (the running worker died, no result) runs an idempotent tool again
(at-least-once) and answers a not idempotent one `tool_interrupted` without running it: it
may have acted already.

Errors are values: whatever the tool does, the call ends with a stored result and the task
returns normally, so the chord's callback always fires.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NotRequired, TypedDict, assert_never

from sqlalchemy import Select, bindparam, insert, select, true, update
from sqlalchemy.orm import Session, sessionmaker

from agentq import agents
from agentq.config import Settings
from agentq.db import lock_row, utcnow
from agentq.loop import rules
from agentq.loop.effects import NextStep
from agentq.loop.leases import ToolLeaseKeeper
from agentq.loop.lifecycle import ToolCallStatus
from agentq.loop.rules import MAX_DELIVERIES
from agentq.loop.states import ENDED
from agentq.loop.store import shown
from agentq.loop.uow import UnitOfWork, ride_out
from agentq.models import Conversation, Job, JobEvent, Persona, ToolCall, User
from agentq.prebuilt import Prebuilt, literal_in
from agentq.tools.manifest import ToolContext
from agentq.tools.registry import ToolRegistry
from agentq.tools.result import ToolResult

log = logging.getLogger(__name__)
_calls, _jobs, _events = ToolCall.__table__, Job.__table__, JobEvent.__table__
_users, _conversations, _personas = User.__table__, Conversation.__table__, Persona.__table__
AWAIT_POLL_S = 0.5
CRASHED_RESULT = ToolResult.failed(
    "tool_crashed", f"The tool crashed its worker {MAX_DELIVERIES} times.").to_record()
INTERRUPTED_RESULT = ToolResult.failed(
    "tool_interrupted", "The worker running this tool stopped before it answered. The tool "
    "is not idempotent, so it was not run again: it may or may not have taken effect."
).to_record()
CANCELLED_RESULT = ToolResult.failed(
    "cancelled", "The job was cancelled before this tool ran.").to_record()


class OutcomeRecord(TypedDict):
    """A `CallOutcome` as the tool task's JSON result."""
    tool_use_id: str
    status: str
    next_step: tuple[str, int] | None
    child_job_id: NotRequired[str]


@dataclass(frozen=True)
class CallOutcome:
    """What a delivery of a tool call ended with (the tool task's result). `status`: the
    stored status (succeeded, failed, cancelled), `duplicate` when another delivery stored
    it, `delegated` when a sub-agent was started, `missing` for an unknown tool_use_id."""
    tool_use_id: str
    status: str
    next_step: tuple[str, int] | None = None
    """With `tool_join=database`: the step this delivery sent (its turn's last result)."""
    child_job_id: str | None = None
    """A delegate call's sub-agent."""

    def as_dict(self) -> OutcomeRecord:
        """The task's JSON result."""
        out: OutcomeRecord = {"tool_use_id": self.tool_use_id, "status": self.status,
                              "next_step": self.next_step}
        if self.child_job_id is not None:
            out["child_job_id"] = self.child_job_id
        return out


@dataclass(frozen=True)
class Run:
    """`_prepare` started the call: this delivery runs the tool, under a lease renewed
    while it runs."""
    name: str
    arguments: Any
    ctx: ToolContext
    allowed: tuple[str, ...]
    lease_until: datetime


@dataclass(frozen=True)
class Answered:
    """The delivery ends without running the tool: stored already, cancelled, interrupted,
    crashed too often, unknown, or a sub-agent started."""
    outcome: CallOutcome


@dataclass(frozen=True)
class Refused:
    """A delegate call that starts no sub-agent (bad arguments, too deep): its error."""
    job_id: uuid.UUID
    result: ToolResult


_WRITES = (rules.CancelCall, rules.Delegate, rules.Interrupted, rules.Start)
"""The verdicts whose delivery writes (`_prepare`)."""

Prepared = Run | Answered | Refused | rules.Elsewhere
"""What `_prepare` leaves this delivery to do; `rules.Elsewhere`: another delivery runs the
call, this one waits for its result."""


def execute_tool_call(tool_use_id: str, settings: Settings, registry: ToolRegistry,
                      sessions: sessionmaker[Session], join: bool = True) -> CallOutcome:
    """Run one call (its tool task's body). `join=False`: the caller is the step that runs
    its turn's local calls (`agentq.loop.tool_turn`); it goes on with the turn itself, so
    storing the turn's last result sends no next step (`tool_join=database`)."""
    registry.look()  # before the transaction: one pooled connection at a time
    # a lost start is re-done by the redelivered task; the statement that starts the usual
    # delivery is a transaction of its own (`_prepare`)
    with UnitOfWork(sessions, durable=False, lone=True) as uow:
        prepared = _prepare(uow, tool_use_id, settings, registry, sessions)
    match prepared:
        case rules.Elsewhere():
            return _await_other_delivery(tool_use_id, settings, registry, sessions, join)
        case Answered(outcome=outcome):
            return outcome
        case Refused(job_id=job_id, result=refusal):  # a delegate call: no sub-agent
            return _finish(tool_use_id, job_id, agents.DELEGATE, ToolCallStatus.FAILED,
                           {**refusal.to_record(), "attempts": 1}, settings, sessions, join)
        case Run(name=name, arguments=arguments, ctx=ctx, allowed=allowed,
                 lease_until=lease_until):
            # the lease taken in `_prepare` is renewed while the tool runs
            with tool_leases(settings, sessions).hold(ctx.job_id, tool_use_id, lease_until):
                result: ToolResult = registry.execute(name, arguments, ctx, allowed)
            status = ToolCallStatus.SUCCEEDED if result.ok else ToolCallStatus.FAILED
            record = {**result.to_record(), "attempts": result.attempts}
            return _finish(tool_use_id, uuid.UUID(ctx.job_id), name, status, record,
                           settings, sessions, join)
        case _:
            assert_never(prepared)


def _finish(tool_use_id: str, job_id: uuid.UUID, name: str, status: str,
            record: dict[str, Any], settings: Settings,
            sessions: sessionmaker[Session], join_turn: bool = True) -> CallOutcome:
    """Store a call's result and, when it was its turn's last, name the next step."""
    delegate = name == agents.DELEGATE

    def store(uow: UnitOfWork) -> tuple[int | None, tuple[str, int] | None]:
        if not delegate and uow.session.get_bind().dialect.name == "postgresql":
            iteration = _lock_store_and_announce(uow, job_id, tool_use_id, name, status,
                                                 record)
        else:
            # the job's row before the call's, as everywhere
            job = lock_row(uow.session, Job, job_id, load=delegate)
            iteration = _store(uow, job_id, tool_use_id, name, status, record)
            if delegate and iteration is not None and job is not None:
                agents.settle(uow, job, iteration)  # its parent may wait for children
        join = (_join_if_last(uow.session, job_id, iteration)
                if iteration is not None and join_turn and settings.tool_join == "database"
                else None)
        if join is not None:  # this call was the turn's last: the next step goes out
            uow.effect(NextStep(join[0], join[1], "callback"))
        return iteration, join

    # the tool ran: its result is kept through a database outage (retried for a step
    # deadline) rather than lost, which would leave a not idempotent call `interrupted`.
    # On Postgres the result and its event are one statement, a transaction of its own,
    # unless the turn is joined here (that read must hold the job's row with the store)
    lone = not delegate and not (join_turn and settings.tool_join == "database")
    (iteration, join), _ = ride_out(sessions, settings.step_deadline_s, "tool result", store,
                                    lone=lone, tool_use_id=tool_use_id)
    return CallOutcome(tool_use_id, status if iteration is not None else "duplicate", join)


_keepers: dict[tuple[int, float], ToolLeaseKeeper] = {}
_keepers_lock = threading.Lock()


def _forget_keepers_in_child() -> None:
    """A forked child has none of the parent's threads: it starts keepers of its own."""
    global _keepers, _keepers_lock
    _keepers, _keepers_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_keepers_in_child)


def tool_leases(settings: Settings, sessions: sessionmaker[Session]) -> ToolLeaseKeeper:
    """This process's keeper of running calls' leases (one per database and deadline)."""
    key = (id(sessions), settings.step_deadline_s)
    with _keepers_lock:
        if key not in _keepers:
            _keepers[key] = ToolLeaseKeeper(sessions, settings.step_deadline_s)
        return _keepers[key]


def _await_other_delivery(tool_use_id: str, settings: Settings, registry: ToolRegistry,
                          sessions: sessionmaker[Session], join: bool = True) -> CallOutcome:
    """A copy of a call that a live delivery is running: wait until that one stores the
    result (this copy then answers `duplicate`; the storer joins the turn), or until its
    lease runs out unrenewed (its worker died: this copy decides again, in `_prepare`)."""
    while True:
        with sessions() as session:
            status, lease_until = session.execute(
                select(ToolCall.status, ToolCall.lease_until)
                .where(ToolCall.tool_use_id == tool_use_id)).one()
        if status != ToolCallStatus.PENDING:
            return CallOutcome(tool_use_id, "duplicate")
        if lease_until is None or utcnow() >= lease_until:
            log.warning("the delivery running a tool call went silent",
                        extra={"event": "tool.lease_expired", "tool_use_id": tool_use_id})
            return execute_tool_call(tool_use_id, settings, registry, sessions, join)
        time.sleep(AWAIT_POLL_S)


def turn_pending(sessions: sessionmaker[Session], job_id: uuid.UUID, iteration: int) -> bool:
    """Whether a call of the job's turn `iteration` has no result yet (committed)."""
    with sessions() as session:
        return _PENDING_OF_TURN.first(session,
                                      {"job_id": job_id, "iteration": iteration}) is not None


def _join_if_last(session: Session, job_id: uuid.UUID, iteration: int) -> tuple[str, int] | None:
    """With `tool_join=database`: the task that stores a turn's last result names the next
    step. The job row is locked in this transaction, which orders concurrent finishers of
    one job: exactly one of them sees no call pending."""
    pending = _PENDING_OF_TURN.first(session, {"job_id": job_id, "iteration": iteration})
    return None if pending else (str(job_id), iteration)


_CALL = select(
    _calls.c.name, _calls.c.arguments, _calls.c.status, _calls.c.attempts,
    _calls.c.lease_until, _jobs.c.id.label("job_id"), _jobs.c.tenant_id,
    _jobs.c.status.label("job_status"), _jobs.c.cancel_requested_at,
    _users.c.id.label("user_id"), _users.c.permission_level,
    _conversations.c.id.label("conversation_id"), _conversations.c.platform,
    _conversations.c.platform_channel_id, _conversations.c.platform_thread_id,
    _personas.c.allowed_modules,
).select_from(
    _calls.join(_jobs, _jobs.c.id == _calls.c.job_id)
    .join(_users, _users.c.id == _jobs.c.user_id)
    .join(_conversations, _conversations.c.id == _jobs.c.conversation_id)
    .outerjoin(_personas, _personas.c.id == _jobs.c.persona_id))
"""A call with what running it needs, in one statement: its job's state, the caller, the
place and the persona's modules (Core columns: no ORM objects to build)."""
_CALL_BY_ID = _CALL.where(_calls.c.tool_use_id == bindparam("tool_use_id"))
_LOCK_CALL_BY_ID = {False: Prebuilt(_CALL_BY_ID),
                    True: Prebuilt(_CALL_BY_ID.with_for_update(of=_jobs))}  # the job's row first
_START_CALL = Prebuilt(update(_calls).where(_calls.c.tool_use_id == bindparam("call_id"))
               .values(attempts=bindparam("attempts_now", type_=_calls.c.attempts.type),
                       started_at=bindparam("now", type_=_calls.c.started_at.type),
                       lease_until=bindparam("until", type_=_calls.c.lease_until.type)))
_STORE = (update(_calls)
                 .where(_calls.c.tool_use_id == bindparam("call_id"),
                        _calls.c.status == ToolCallStatus.PENDING)
                 .values(status=bindparam("status_now", type_=_calls.c.status.type),
                         result=bindparam("record", type_=_calls.c.result.type),
                         finished_at=bindparam("now", type_=_calls.c.finished_at.type))
                 .returning(_calls.c.iteration))
_STORE_RESULT = Prebuilt(_STORE)


def _lock_and_start_first() -> Select[Any]:
    """`_LOCK_CALL_BY_ID` (Postgres) and, when this is the call's first delivery and it is
    to run (pending, its job live and not cancelling, not a delegate: `rules.call_verdict`
    answers `Start(1)`), `_START_CALL`, in one statement: the call as read (before the
    start; `started` 1 when it was started), the job's row locked first (`call`, which the
    call's UPDATE reads before it takes the call's row). The call's own conditions are the
    UPDATE's, so a delivery that started it meanwhile leaves it alone. Its id is bound as
    `call_id`: a parameter named as a column of tool_calls would be SET by the UPDATE."""
    call = (_CALL.where(_calls.c.tool_use_id == bindparam("call_id"))
            .with_for_update(of=_jobs).cte("call"))
    started = (update(_calls)
               .where(_calls.c.tool_use_id == bindparam("call_id"),
                      _calls.c.status == ToolCallStatus.PENDING, _calls.c.attempts == 0,
                      _calls.c.name != agents.DELEGATE,
                      select(call.c.job_id).where(~literal_in(call.c.job_status, ENDED),
                                                  call.c.cancel_requested_at.is_(None))
                      .exists())
               .values(attempts=1,
                       started_at=bindparam("now", type_=_calls.c.started_at.type),
                       lease_until=bindparam("until", type_=_calls.c.lease_until.type))
               .returning(_calls.c.attempts.label("started")).cte("started"))
    return select(call, started.c.started).select_from(call.outerjoin(started, true()))


_LOCK_AND_START_FIRST = Prebuilt(_lock_and_start_first())
_PENDING_OF_TURN = Prebuilt(select(_calls.c.id)
                    .where(_calls.c.job_id == bindparam("job_id"),
                           _calls.c.iteration == bindparam("iteration"),
                           _calls.c.status == ToolCallStatus.PENDING).limit(1))
"""Built once, with bind parameters (named unlike the columns they set), and run on the
session's cursor (`agentq.prebuilt`): a tool call runs them on every call."""


def _prepare(uow: UnitOfWork, tool_use_id: str, settings: Settings, registry: ToolRegistry,
             sessions: sessionmaker[Session]) -> Prepared:
    """Load the call and decide whether this delivery runs it (`rules.call_verdict`). On
    Postgres the usual delivery, the call's first, is started by the statement that loads
    it (`_LOCK_AND_START_FIRST`): with the unit of work `lone`, one round trip in all."""
    session, now = uow.session, utcnow()
    postgres = session.get_bind().dialect.name == "postgresql"
    query = _LOCK_CALL_BY_ID[postgres]
    if postgres:
        call = _LOCK_AND_START_FIRST.first(session, {
            "call_id": tool_use_id, "now": now,
            "until": now + timedelta(seconds=settings.step_deadline_s)})
        if call is not None and call.started is not None:
            # started with the read: its UPDATE's conditions are `rules.call_verdict`'s
            # Start(1) (pending, never delivered, its job live and not cancelling, no
            # delegate); in a `lone` unit of work that statement is committed already
            return _start(uow, call, rules.Start(1), tool_use_id, settings, registry,
                          sessions, now, started=True)
    else:
        call = query.first(session, {"tool_use_id": tool_use_id})
    if call is None:
        return _missing(tool_use_id)
    verdict = _verdict(call, registry, now)
    if postgres and isinstance(verdict, _WRITES):
        # not started with the read, and this delivery writes (a delegate, a cancelled or
        # interrupted call, a start again): that statement wrote nothing; read again, the
        # job's row held, in the transaction that writes. A verdict that writes nothing
        # (settled, running elsewhere) stands on the first read.
        call = query.first(session, {"tool_use_id": tool_use_id})
        if call is None:
            return _missing(tool_use_id)
        verdict = _verdict(call, registry, now)
    job_id = call.job_id
    match verdict:
        case rules.Settled(status=status):
            return Answered(CallOutcome(tool_use_id, status))
        case rules.CancelCall():
            _store(uow, job_id, tool_use_id, call.name, ToolCallStatus.CANCELLED,
                   CANCELLED_RESULT)
            return Answered(CallOutcome(tool_use_id, ToolCallStatus.CANCELLED))
        case rules.Delegate():  # a sub-agent: a job, not a function (agentq.agents)
            outcome = agents.start_child(uow, call, tool_use_id, settings, registry)
            if isinstance(outcome, ToolResult):
                return Refused(job_id, outcome)
            return Answered(CallOutcome(tool_use_id, outcome["status"],
                                        child_job_id=outcome.get("child_job_id")))
        case rules.Elsewhere():
            log.info("tool call is running in another delivery; waiting for its result",
                     extra={"event": "tool.running_elsewhere", "tool_use_id": tool_use_id})
            return verdict
        case rules.Interrupted():
            # the delivery that started it died without storing a result: it may have acted
            # already, so a tool with side effects is not run again (the model is told)
            log.warning("not idempotent tool call interrupted; not running it again",
                        extra={"event": "tool.interrupted", "tool": call.name,
                               "tool_use_id": tool_use_id, "deliveries": call.attempts})
            _store(uow, job_id, tool_use_id, call.name, ToolCallStatus.FAILED,
                   INTERRUPTED_RESULT)
            return Answered(CallOutcome(tool_use_id, ToolCallStatus.FAILED))
        case rules.Start():
            return _start(uow, call, verdict, tool_use_id, settings, registry, sessions, now)
        case _:
            assert_never(verdict)


def _missing(tool_use_id: str) -> Answered:
    log.error("unknown tool_use_id", extra={"tool_use_id": tool_use_id})
    return Answered(CallOutcome(tool_use_id, "missing"))


def _verdict(call: Any, registry: ToolRegistry, now: datetime) -> rules.Verdict:
    tool = registry.tools.get(call.name)
    return rules.call_verdict(
        status=call.status, job_ended=call.job_status in ENDED,
        cancel_requested=call.cancel_requested_at is not None,
        delegate=call.name == agents.DELEGATE, attempts=call.attempts,
        lease_until=call.lease_until, now=now, idempotent=bool(tool and tool.idempotent))


def _start(uow: UnitOfWork, call: Any, start: rules.Start, tool_use_id: str,
           settings: Settings, registry: ToolRegistry, sessions: sessionmaker[Session],
           now: datetime, started: bool = False) -> Run | Answered:
    """This delivery starts the call: its attempt counted and its lease taken (`started`:
    taken already, with the read); a call that crashed its worker too often is answered
    `tool_crashed` instead."""
    job_id = call.job_id
    lease_until = now + timedelta(seconds=settings.step_deadline_s)
    # the lease is the call's alone: the sweeper leaves the job alone while a call of its
    # turn holds one (a slow tool is not a stall), and the job's row, locked by `_prepare`,
    # is not written (issue 34: it changes only with the job's state)
    if not started:
        _START_CALL.execute(uow.session, {"call_id": tool_use_id,
                                          "attempts_now": start.attempts, "now": now,
                                          "until": lease_until})
    if start.crashed:
        _store(uow, job_id, tool_use_id, call.name, ToolCallStatus.FAILED, CRASHED_RESULT)
        return Answered(CallOutcome(tool_use_id, ToolCallStatus.FAILED))
    if start.attempts > 1:  # at-least-once: the previous delivery died before storing
        log.info("idempotent tool call delivered again; running it again",
                 extra={"event": "tool.rerun", "tool": call.name,
                        "tool_use_id": tool_use_id, "delivery": start.attempts})
    allowed = registry.allowed_modules(call.allowed_modules, call.tenant_id)
    ctx = ToolContext(tool_use_id=tool_use_id, job_id=str(job_id), user_id=str(call.user_id),
                      conversation_id=str(call.conversation_id),
                      permission_level=call.permission_level,
                      platform=call.platform,
                      platform_channel_id=call.platform_channel_id,
                      platform_thread_id=call.platform_thread_id,
                      session_factory=sessions,
                      public_url=settings.public_url, tenant_id=str(call.tenant_id),
                      extra={"settings": settings})
    return Run(call.name, call.arguments, ctx, allowed, lease_until)


def _store(uow: UnitOfWork, job_id: uuid.UUID, tool_use_id: str, name: str, status: str,
           record: dict[str, Any]) -> int | None:
    """Write the result once: only a pending call takes it. The caller holds the job's row
    (locked first, as every other writer does). Returns the call's turn, or None when
    another delivery stored it already."""
    iteration: int | None = _STORE_RESULT.scalar(uow.session, {
        "call_id": tool_use_id, "status_now": status, "record": record,
        "now": utcnow()})
    if iteration is None:
        return None
    type_, data = _end_event(tool_use_id, name, record)
    uow.event(job_id, type_, **data)
    return iteration


def _end_event(tool_use_id: str, name: str, record: dict[str, Any]
               ) -> tuple[str, dict[str, Any]]:
    """The (type, data) of the event a stored result announces."""
    error = (record.get("error") or {}).get("code")
    return "tool_execution_end", {"tool_use_id": tool_use_id, "name": name,
                                  "ok": record["ok"], "error": error,
                                  "attempts": record.get("attempts", 0)}


def _store_with_event() -> Select[tuple[int, int]]:
    """`lock_row` of the job, `_STORE_RESULT` and the job's event appended, in one
    statement (Postgres): the job's row locked first (`locked`, which the call's UPDATE
    joins: it runs before the call's row is taken), the result stored only on a pending
    call, and only then the job's event counter advanced and its event written. Answers
    (the call's turn, the event's seq), no row when another delivery stored the result."""
    locked = (select(_jobs.c.id).where(_jobs.c.id == bindparam("ident"))
              .with_for_update(key_share=True).cte("locked"))
    stored = _STORE.where(_calls.c.job_id == locked.c.id).cte("stored")
    advanced = (update(_jobs)
                .where(_jobs.c.id == bindparam("ident"), select(stored.c.iteration).exists())
                .values(event_seq=_jobs.c.event_seq + 1,
                        last_progress_at=bindparam("now", type_=_jobs.c.last_progress_at.type))
                .returning(_jobs.c.event_seq).cte("advanced"))
    appended = insert(_events).from_select(
        ["job_id", "seq", "type", "data", "created_at"],
        select(bindparam("ident", type_=_events.c.job_id.type), advanced.c.event_seq,
               bindparam("event_type", type_=_events.c.type.type),
               bindparam("event_data", type_=_events.c.data.type),
               bindparam("now", type_=_events.c.created_at.type))).cte("appended")
    return (select(stored.c.iteration, advanced.c.event_seq)
            .select_from(stored.join(advanced, true())).add_cte(appended))


_STORE_WITH_EVENT = Prebuilt(_store_with_event())


def _lock_store_and_announce(uow: UnitOfWork, job_id: uuid.UUID, tool_use_id: str,
                             name: str, status: str, record: dict[str, Any]) -> int | None:
    """`_store` after `lock_row` of the job in one statement (Postgres): its event is
    written by it and announced after the commit. Returns the call's turn, or None when
    another delivery stored it already."""
    now = utcnow()
    event = _end_event(tool_use_id, name, record)
    row = _STORE_WITH_EVENT.first(uow.session, {
        "ident": job_id, "call_id": tool_use_id, "status_now": status, "record": record,
        "now": now, "event_type": event[0], "event_data": event[1]})
    if row is None:
        return None
    iteration: int = row.iteration
    uow.written(job_id, shown(row.event_seq, [event], now))
    return iteration
