"""Appending to a conversation's messages and a job's events, with their sequence numbers.

Events are recorded through a unit of work (`agentq.loop.uow`), which writes them here before
its commit and announces them to the observers registered with `on_events` after it.

Both counters live on the parent row and are advanced by one `UPDATE … RETURNING`, so
sequence numbers are gap-free per parent and never collide across processes.
"""
from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any, Callable, Iterable, Sequence, Unpack

from sqlalchemy import (
    ColumnElement,
    Insert,
    Select,
    SQLColumnExpression,
    Table,
    Update,
    bindparam,
    column,
    exists,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql.dml import ReturningInsert, ReturningUpdate

from agentq.db import utcnow
from agentq.ids import new_id
from agentq.llm.types import LLMReply
from agentq.loop.context import StoredMessage, estimate_tokens
from agentq.models import Base, Conversation, Job, JobEvent, Message, TokenLog, User
from agentq.prebuilt import prebuilt
from agentq.prepared import deferred_writes

log = logging.getLogger(__name__)

EventHook = Callable[[str, list[dict[str, Any]]], None]
_event_hooks: list[EventHook] = []


def on_events(hook: EventHook) -> None:
    """Register an observer called after events are written (e.g. a pub/sub push).

    Observers run after the write, outside the job's logic; a failing one is logged and
    never fails the job.
    """
    if hook not in _event_hooks:  # a root that starts twice (tests, `agentq dev`) adds it once
        _event_hooks.append(hook)


def notify(job_id: str, events: list[dict[str, Any]]) -> None:
    """Tell the observers of events just committed (`agentq.loop.uow` calls this)."""
    for hook in _event_hooks:
        try:
            hook(job_id, events)
        except Exception:  # an observer never fails the job
            log.exception("event hook failed", extra={"job_id": job_id})


_conversations, _messages = Conversation.__table__, Message.__table__
_jobs, _events = Job.__table__, JobEvent.__table__
_token_logs, _users = TokenLog.__table__, User.__table__
"""Core tables: these appends are the hottest writes of a step, and Core statements skip
the ORM's bulk-update and unit-of-work machinery (a third of their CPU, profiled on the
floor benchmark)."""


def _advance(table: Table, counter: str, stamp: str | None = None) -> ReturningUpdate[Any]:
    """`UPDATE table SET counter = counter + :n[, stamp = :now] WHERE id = :ident RETURNING
    counter`, built once: a statement made per call costs more CPU than running it."""
    column = table.c[counter]
    values: dict[str, ColumnElement[Any]] = {counter: column + bindparam("n", type_=column.type)}
    if stamp is not None:
        values[stamp] = bindparam("now", type_=table.c[stamp].type)
    return (update(table).where(table.c.id == bindparam("ident")).values(values)
            .returning(column))


_ADVANCE_MESSAGES = _advance(_conversations, "message_seq")
"""Only the counter: a conversation's last_active_at is set when its job lets it go
(agentq.loop.lifecycle). It is in `ix_conversations_idle`, and an update that changes an indexed
column is never heap-only: moved with each of a job's five or so messages, it made each of
those updates write all five of the table's indexes anew (2.0 kB of WAL a job)."""
_ADVANCE_EVENTS = _advance(_jobs, "event_seq", "last_progress_at")
_INSERT_MESSAGES, _INSERT_EVENTS = insert(_messages), insert(_events)
_INSERT_TOKEN_LOG = insert(_token_logs)
_CHARGE_USER = (update(_users).where(_users.c.id == bindparam("ident"))
                .values(tokens_used_this_month=_users.c.tokens_used_this_month
                        + bindparam("n", type_=_users.c.tokens_used_this_month.type))
                .returning(_users.c.tokens_used_this_month))


def _append_one(advance: ReturningUpdate[Any], table: Table, parent: str, counter: str,
                own: tuple[str, ...], prefix: str) -> Insert:
    """One row appended in one statement (Postgres): `advance` (its parent's counter,
    `UPDATE … RETURNING`) as a data-modifying CTE, the row numbered from what it returns.
    A step appends one message at a time (the question, a reply, a tool result), a tool's
    result one event: half the round trips of advance-then-insert. The row's own values
    are bound as <prefix>_<column>: a parameter named as a column of the parent (`id`)
    would also be SET by the UPDATE."""
    advanced = advance.cte("advanced")
    values: dict[str, ColumnElement[Any]] = {
        name: bindparam(f"{prefix}_{name}", type_=table.c[name].type) for name in own}
    values.update({parent: bindparam("ident", type_=table.c[parent].type),
                   "seq": advanced.c[counter],
                   "created_at": bindparam("now", type_=table.c.created_at.type)})
    columns = list(values)
    return (insert(table).from_select(columns, select(*(values[c] for c in columns)))
            .add_cte(advanced))


def message_appended_unread_by(advance: ReturningUpdate[Any]) -> Insert:
    """`message_appended_by` returning nothing: a write that may go with the next
    statement (`prepared.deferred_writes`)."""
    return _append_one(advance, _messages, "conversation_id", "message_seq",
                       ("id", "job_id", "role", "content", "token_count", "model_used"),
                       "message")


def message_appended_by(advance: ReturningUpdate[Any]) -> ReturningInsert[Any]:
    """One message appended in one statement by `advance`, an UPDATE of its conversation's
    row that returns the advanced `message_seq` (by `ident`), returning the message's seq:
    its parameters, `message_parameters(…)`'s. When the UPDATE matches no row, nothing is
    appended."""
    return message_appended_unread_by(advance).returning(_messages.c.seq)


def message_parameters(conversation_id: uuid.UUID, job_id: uuid.UUID | None,
                       row: tuple[str, str, str | None], now: datetime,
                       tokens: int | None = None) -> dict[str, Any]:
    """The parameters of a `message_appended_by` statement: the (role, content,
    model_used) row appended to `conversation_id` (`tokens`: its content's estimate, when
    the caller made it already)."""
    role, content, model = row
    return {"ident": conversation_id, "n": 1, "now": now, "message_id": new_id(),
            "message_job_id": job_id, "message_role": role, "message_content": content,
            "message_token_count": estimate_tokens(content) if tokens is None else tokens,
            "message_model_used": model}


def json_object(*pairs: tuple[str, SQLColumnExpression[Any]]) -> ColumnElement[Any]:
    """`json_build_object` of (key, value) pairs, its keys (names of ours, never input)
    written into the SQL: bound as parameters, Postgres could not type them, and the
    statement would not be prepared (planned anew at each run, `agentq.prepared`)."""
    return func.json_build_object(*(part for key, value in pairs
                                    for part in (literal_column(f"'{key}'"), value)))


def _append_after() -> Insert:
    """One message appended at the seq after `after`, its conversation's counter moved from
    `after` by a data-modifying CTE in the same statement (Postgres). Its parameters:
    `message_parameters(…)`'s and `after`. When the counter is no longer `after`, the
    CTE moves nothing and the INSERT's seq is taken: it fails on
    uq_messages_conversation_seq, never numbering two messages alike."""
    after = bindparam("after", type_=_conversations.c.message_seq.type)
    moved = (update(_conversations)
             .where(_conversations.c.id == bindparam("ident"),
                    _conversations.c.message_seq == after)
             .values(message_seq=after + 1).cte("moved"))
    return (insert(_messages).values(
        id=bindparam("message_id"), conversation_id=bindparam("ident"),
        job_id=bindparam("message_job_id"), seq=after + 1, role=bindparam("message_role"),
        content=bindparam("message_content"),
        token_count=bindparam("message_token_count"),
        model_used=bindparam("message_model_used"), created_at=bindparam("now"))
        .add_cte(moved))


_APPEND_AFTER = _append_after()
_APPEND_ONE = message_appended_by(_ADVANCE_MESSAGES)
_APPEND_ONE_UNREAD = message_appended_unread_by(_ADVANCE_MESSAGES)
"""`_APPEND_ONE` returning nothing: a write that may go with the next statement."""
_APPEND_ONE_EVENT = _append_one(_ADVANCE_EVENTS, _events, "job_id", "event_seq",
                                ("type", "data"), "event").returning(_events.c.seq)



_TOKEN_LOG_COLUMNS = ("id", "user_id", "conversation_id", "job_id", "iteration", "model",
                      "input_tokens", "output_tokens", "cost_estimate", "usage_estimated",
                      "reply", "created_at")
_LOG_AND_CHARGE = _CHARGE_USER.add_cte(insert(_token_logs).values({
    # bound as log_<column>: a parameter named as a column of users (`id`) would also be
    # SET by the UPDATE
    name: bindparam(f"log_{name}", type_=_token_logs.c[name].type)
    for name in _TOKEN_LOG_COLUMNS}).cte("logged"))
"""The token log written and the user charged in one statement (Postgres): the INSERT as a
data-modifying CTE, which Postgres runs once whether or not the UPDATE reads it."""


def with_usage(advance: Update, charged: bool) -> Select[Unpack[tuple[Any, ...]]]:
    """`advance` (a compare-and-set `UPDATE jobs … WHERE <the step holds the job>`, without
    RETURNING) with the model call's usage in the same statement (Postgres): the UPDATE as a
    data-modifying CTE that returns the job's row, the token log inserted from what it
    returns and, when `charged`, the job's user charged by joining it. When the
    compare-and-set fails the CTE returns no row, and neither the log nor the charge writes
    anything: a late step's reply is discarded whole. The statement answers the job's row
    (every column of jobs, as `advance … RETURNING` would). Its parameters: `advance`'s,
    `usage_parameters(…)`'s."""
    advanced = advance.returning(*_jobs.c).cte("advanced")
    given: dict[str, ColumnElement[Any]] = {
        name: bindparam(f"log_{name}", type_=_token_logs.c[name].type)
        for name in _TOKEN_LOG_COLUMNS}
    given.update(user_id=advanced.c.user_id, conversation_id=advanced.c.conversation_id,
                 job_id=advanced.c.id)
    logged = insert(_token_logs).from_select(
        list(_TOKEN_LOG_COLUMNS), select(*(given[name] for name in _TOKEN_LOG_COLUMNS))
        .select_from(advanced)).cte("logged")
    statement = select(*advanced.c).add_cte(logged)
    if charged:
        statement = statement.add_cte(
            update(_users).where(_users.c.id == advanced.c.user_id)
            .values(tokens_used_this_month=_users.c.tokens_used_this_month
                    + bindparam("charge_n", type_=_users.c.tokens_used_this_month.type))
            .cte("charged"))
    return statement


def usage_parameters(*, iteration: int, reply: LLMReply, cost: float, keep_reply: bool,
                     now: datetime) -> dict[str, Any]:
    """The parameters of a `with_usage` statement's log and charge: a model call's tokens
    (the job, its user and conversation come from the job's row)."""
    return {"log_id": new_id(), "log_iteration": iteration, "log_model": reply.model,
            "log_input_tokens": reply.input_tokens, "log_output_tokens": reply.output_tokens,
            "log_cost_estimate": cost, "log_usage_estimated": reply.usage_estimated,
            "log_reply": reply.to_record() if keep_reply else None, "log_created_at": now,
            "charge_n": reply.input_tokens + reply.output_tokens}


def append_messages(session: Session, conversation_id: uuid.UUID, job_id: uuid.UUID | None,
                    rows: Sequence[tuple[str, str, str | None]],
                    now: datetime | None = None) -> list[StoredMessage]:
    """Append (role, content, model_used) rows to a conversation, in order; returns them
    as stored (numbered)."""
    if not rows:
        return []
    now = now or utcnow()
    tokens = [estimate_tokens(content) for _, content, _ in rows]
    if len(rows) == 1 and session.get_bind().dialect.name == "postgresql":
        last = first = prebuilt(_APPEND_ONE).one(session, message_parameters(
            conversation_id, job_id, rows[0], now, tokens[0]))[0]
    else:
        last = prebuilt(_ADVANCE_MESSAGES).one(session, {"ident": conversation_id,
                                                         "n": len(rows), "now": now})[0]
        first = last - len(rows) + 1
        session.execute(_INSERT_MESSAGES, [
            {"id": new_id(), "conversation_id": conversation_id, "job_id": job_id,
             "seq": first + i, "role": role, "content": content,
             "token_count": tokens[i], "model_used": model, "created_at": now}
            for i, (role, content, model) in enumerate(rows)])
    sync_loaded(session, Conversation, conversation_id, message_seq=last)
    return [StoredMessage(first + i, role, content, tokens[i])
            for i, (role, content, _) in enumerate(rows)]


def append_unread(session: Session, conversation_id: uuid.UUID, job_id: uuid.UUID | None,
                  rows: Sequence[tuple[str, str, str | None]],
                  now: datetime | None = None) -> None:
    """`append_messages` for a caller that reads nothing of the append: on Postgres one row
    goes in one statement sent with the transaction's next statement or its COMMIT
    (`prepared.deferred_writes`), one round trip fewer; the conversation's `message_seq`,
    if loaded, is expired (read again, after the append, when next asked for)."""
    if len(rows) != 1 or session.get_bind().dialect.name != "postgresql":
        append_messages(session, conversation_id, job_id, rows, now)
        return
    with deferred_writes(session):
        prebuilt(_APPEND_ONE_UNREAD).execute(session, message_parameters(
            conversation_id, job_id, rows[0], now or utcnow()))
    forget_loaded(session, Conversation, conversation_id, "message_seq")


def append_after(session: Session, conversation: Conversation, job_id: uuid.UUID | None,
                 rows: Sequence[tuple[str, str, str | None]],
                 now: datetime | None = None) -> list[StoredMessage]:
    """`append_messages` by the job that holds `conversation`, whose row this transaction
    read: nobody else appends to a conversation its job holds, so its `message_seq` is
    current and the rows are numbered after it without asking. On Postgres one row goes
    with the transaction's next statement or its COMMIT (`prepared.deferred_writes`): one
    round trip fewer, and a seq taken meanwhile fails the write (`_APPEND_AFTER`) rather
    than the rows' numbers being other than those returned. Returns them as stored."""
    if len(rows) != 1 or session.get_bind().dialect.name != "postgresql":
        return append_messages(session, conversation.id, job_id, rows, now)
    role, content, _model = rows[0]
    tokens, after = estimate_tokens(content), conversation.message_seq
    with deferred_writes(session):
        prebuilt(_APPEND_AFTER).execute(session, {**message_parameters(
            conversation.id, job_id, rows[0], now or utcnow(), tokens), "after": after})
    set_committed_value(conversation, "message_seq", after + 1)
    return [StoredMessage(after + 1, role, content, tokens)]


def append_with_history(session: Session, conversation_id: uuid.UUID,
                        job_id: uuid.UUID | None, row: tuple[str, str, str | None],
                        limit: int, now: datetime | None = None
                        ) -> tuple[list[StoredMessage], list[StoredMessage]]:
    """Append one (role, content, model_used) row as `append_messages` does, and read the
    `limit` messages before it, oldest first. (The row as stored, the history.) On
    Postgres a step's claim reads the history (`agentq.loop.claim`) and its question goes
    by `append_after`."""
    stored = append_messages(session, conversation_id, job_id, [row], now)
    return stored, list(reversed(recent_messages(session, conversation_id, limit,
                                                 stored[0].seq - 1)))


def record_usage(session: Session, *, user_id: uuid.UUID, conversation_id: uuid.UUID | None,
                 job_id: uuid.UUID | None, iteration: int, reply: LLMReply, cost: float,
                 charged: bool = True, keep_reply: bool = False,
                 now: datetime | None = None) -> None:
    """A model call's tokens: its `token_logs` row (with the reply itself when
    `keep_reply`, for recorded replays) and, when `charged`, the user's monthly count."""
    log = {"id": new_id(), "user_id": user_id, "conversation_id": conversation_id,
           "job_id": job_id, "iteration": iteration, "model": reply.model,
           "input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
           "cost_estimate": cost, "usage_estimated": reply.usage_estimated,
           "reply": reply.to_record() if keep_reply else None, "created_at": now or utcnow()}
    if not charged:
        session.execute(_INSERT_TOKEN_LOG, log)
        return
    charge = {"ident": user_id, "n": reply.input_tokens + reply.output_tokens}
    if session.get_bind().dialect.name == "postgresql":
        used = session.execute(_LOG_AND_CHARGE, {
            **charge, **{f"log_{name}": value for name, value in log.items()}}).scalar_one()
    else:
        session.execute(_INSERT_TOKEN_LOG, log)
        used = session.execute(_CHARGE_USER, charge).scalar_one()
    sync_loaded(session, User, user_id, tokens_used_this_month=used)


def sync_loaded(session: Session, model: type[Base], ident: uuid.UUID, **values: Any) -> None:
    """A row this transaction advanced with Core: its object in the session, if loaded,
    shows the new values (as an ORM UPDATE … RETURNING would have made it)."""
    obj = session.identity_map.get(session.identity_key(model, ident))
    if obj is not None:
        for name, value in values.items():
            set_committed_value(obj, name, value)


def forget_loaded(session: Session, model: type[Base], ident: uuid.UUID, *names: str) -> None:
    """A row this transaction changed without reading the answer: its object in the
    session, if loaded, reads those columns again when next asked for (after the change)."""
    obj = session.identity_map.get(session.identity_key(model, ident))
    if obj is not None:
        session.expire(obj, list(names))


STORED_MESSAGE = (Message.seq, Message.role, Message.content, Message.token_count)
"""The columns a StoredMessage is made of, in its fields' order."""
_RECENT = (select(*STORED_MESSAGE)
           .where(Message.conversation_id == bindparam("conversation_id")))
_RECENT_ANY = _RECENT.order_by(Message.seq.desc()).limit(bindparam("limit"))
_RECENT_FROM = (_RECENT.where(Message.seq > bindparam("floor"))
                .order_by(Message.seq.desc()).limit(bindparam("limit")))
"""Built once, with bind parameters: every step reads its history with one of them."""


def recent_messages(session: Session, conversation_id: uuid.UUID, limit: int,
                    last_seq: int | None = None) -> list[StoredMessage]:
    """The newest `limit` messages, newest first: an index range scan bounded by the
    conversation's last seq, so the planner never reads the whole history."""
    if last_seq is None:
        rows = session.execute(_RECENT_ANY, {"conversation_id": conversation_id,
                                             "limit": limit}).all()
    else:
        rows = session.execute(_RECENT_FROM, {"conversation_id": conversation_id,
                                              "floor": last_seq - limit, "limit": limit}).all()
    return [StoredMessage(seq, role, content, tokens) for seq, role, content, tokens in rows]


def append_events(session: Session, job_id: uuid.UUID,
                  items: Iterable[tuple[str, dict[str, Any]]],
                  now: datetime | None = None) -> list[dict[str, Any]]:
    """Append (type, data) events to a job, in order; returns them as the API shows them."""
    items = list(items)
    if not items:
        return []
    now = now or utcnow()
    if len(items) == 1 and session.get_bind().dialect.name == "postgresql":
        (type_, data), = items
        last = prebuilt(_APPEND_ONE_EVENT).one(session, {
            "ident": job_id, "n": 1, "now": now,
            "event_type": type_, "event_data": data})[0]
        written = shown(last, items, now)
    else:
        last = prebuilt(_ADVANCE_EVENTS).one(session, {"ident": job_id, "n": len(items),
                                                       "now": now})[0]
        written = insert_events(session, job_id, last - len(items) + 1, items, now)
    sync_loaded(session, Job, job_id, event_seq=last, last_progress_at=now)
    return written


def insert_events(session: Session, job_id: uuid.UUID, first: int,
                  items: list[tuple[str, dict[str, Any]]],
                  now: datetime) -> list[dict[str, Any]]:
    """The event rows, numbered from `first` (the caller advanced the job's counter)."""
    session.execute(_INSERT_EVENTS, [
        {"job_id": job_id, "seq": first + i, "type": type_,
         "data": data, "created_at": now} for i, (type_, data) in enumerate(items)])
    return shown(first, items, now)


def _insert_given_events() -> Insert:
    """The INSERT of a job's events given as one JSON array of {type, data} (Postgres):
    numbered from `event_first` in the array's order. One form
    for any number of events, so it is compiled once (a multi-row VALUES is compiled on
    every run); it goes with its job's UPDATE (`events_with_job`)."""
    given = (func.jsonb_array_elements(bindparam("event_rows", type_=JSONB))
             .table_valued(column("value", JSONB), with_ordinality="ord").render_derived())
    value = given.c.value
    return insert(_events).from_select(
        ["job_id", "seq", "type", "data", "created_at"],
        select(bindparam("event_job", type_=_events.c.job_id.type),
               bindparam("event_first", type_=_events.c.seq.type) + given.c.ord - 1,
               value.op("->>", return_type=_events.c.type.type)(literal("type")),
               value.op("->", return_type=JSONB)(literal("data")),
               bindparam("event_now", type_=_events.c.created_at.type)).select_from(given))


_INSERT_GIVEN_EVENTS = _insert_given_events()


def events_with_job(job_id: uuid.UUID, first: int, items: list[tuple[str, dict[str, Any]]],
                    now: datetime) -> tuple[Insert, dict[str, Any]]:
    """A job's (type, data) events, numbered from `first`, as the statement and parameters
    `db.write_changes` runs with the job's UPDATE (Postgres). Bound as event_<name>: a
    parameter named as a column of jobs would be SET by the UPDATE."""
    return _INSERT_GIVEN_EVENTS, {
        "event_rows": [{"type": type_, "data": data} for type_, data in items],
        "event_job": job_id, "event_first": first, "event_now": now}


def shown(first: int, items: list[tuple[str, dict[str, Any]]],
          now: datetime) -> list[dict[str, Any]]:
    """(type, data) events numbered from `first` as the API shows them (and the hub
    announces them)."""
    created = now.isoformat()
    return [{"seq": first + i, "type": type_, "data": data, "created_at": created}
            for i, (type_, data) in enumerate(items)]


def event_dict(event: JobEvent) -> dict[str, Any]:
    return {"seq": event.seq, "type": event.type, "data": event.data,
            "created_at": event.created_at.isoformat()}


def is_branch_start(session: Session, job: Job, conversation: Conversation) -> bool:
    """Whether `job` is its branch conversation's first job (its turn is a branch's:
    `agentq.branches` makes such conversations)."""
    if conversation.branched_from_conversation_id is None:
        return False
    return not session.execute(select(exists().where(
        Message.conversation_id == conversation.id, Message.job_id.is_not(None),
        Message.job_id != job.id))).scalar()
