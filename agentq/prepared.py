"""Server-side prepared statements on psycopg2: Postgres parses and plans a statement once per
connection instead of on every execution; and a transaction's SET LOCAL sent with its next
statement.

psycopg2 sends each statement as text with its values quoted in, so Postgres parses,
analyses and plans it every time. In a burst of one-tool jobs that was a third of
Postgres's CPU (perf, docs/benchmarks.md, the seventh pass). psycopg 3 prepares statements
it sees repeatedly; this does the same for psycopg2, in the connection class agentq's
engines make (`connection_class`), below SQLAlchemy: its events and logs see the statements
as written.

- A statement is prepared on a connection when it is executed there for the
  `threshold`th time (`AGENTQ_DB_PREPARE_THRESHOLD`; 0 turns this off), and from then on
  sent as `EXECUTE name (values)`, each value still quoted by psycopg2.
- Only SELECT, INSERT, UPDATE, DELETE and WITH statements with named values, executed one
  at a time on a client-side cursor, are prepared; with a value of a type `_declared` does
  not list (a list, say) the statement is sent as it was.
- A value of a type Postgres reads from its context when quoted (a string, None) is
  declared `unknown`, so Postgres infers its type as it does for a quoted literal; the other
  values are declared the type psycopg2 quotes them as (an integer `int8`, an aware
  datetime `timestamptz`, …). Where Postgres cannot infer a type (`%(x)s IS NULL`), the
  PREPARE fails inside a savepoint, the transaction goes on, and the statement is never
  prepared again in this process.
- A connection holds at most `MAX_PREPARED` statements; the least recently used one is
  deallocated to make room. A prepared statement outlives a rollback (PREPARE is not
  transactional) and dies with its connection.
- A prepared statement Postgres can no longer run (a migration changed the type of a column
  it answers: "cached plan must not change result type") is forgotten, deallocated with the
  connection's next PREPARE, and sent whole from then on. When it was the first statement of
  its transaction, that transaction is rolled back (it held nothing else) and the statement
  sent whole in a new one: the caller sees nothing. Otherwise its execution fails as
  `StalePlan`, an OperationalError: agentq retries such an error as it retries a database
  blip (`db.DATABASE_UNREACHABLE`).

Prepared statements live in a server connection: behind a pooler that hands a client's
statements to different server connections (PgBouncer in transaction mode) set the
threshold to 0. A connection whose prepared statement vanished (sqlstate 26000: a pooler's
DEALLOCATE ALL or another server connection) stops preparing and says so in a warning; the
statement is sent again whole, or fails as `StalePlan`, as above.

`Connection.ahead` holds a statement for the open transaction (agentq.db's SET LOCAL
synchronous_commit) that goes out in the same string as the transaction's next statement,
saving its round trip; it is dropped when the transaction ends.

`Connection.fold_begin()` does the same for the transaction's BEGIN, which psycopg2 sends
alone before a transaction's first statement: the connection is put in autocommit mode for
that one transaction, "BEGIN" is sent ahead with the first statement, and the commit or
rollback that ends it is sent as a COMMIT or ROLLBACK statement (nothing when no statement
was sent), after which the connection is as before. A unit of work folds its BEGIN
(agentq.loop.uow): one round trip less per transaction. `fold_begin(lone=True)` goes one
further for a transaction whose first statement does all its writing (a tool call's start
or result): that statement is sent without the BEGIN, so Postgres runs it (with a SET ahead
of it) as one implicit transaction and commits it as it ends, and the end sends nothing:
one round trip for the whole transaction."""
from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import secrets
from collections import OrderedDict
from contextlib import contextmanager
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple
from uuid import UUID

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2.extras import Json

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
MAX_PREPARED = 100
"""Prepared statements kept per connection (psycopg 3's default): each holds its plan in the
server process's memory."""
_PREPARABLE = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
_INT8 = range(-2 ** 63, 2 ** 63)
_SAVEPOINT = "agentq_prepare"
_REFUSED_CLASSES = ("42", "0A", "22")
"""A PREPARE refused for what the statement is (a type not inferred, a statement that cannot
be prepared), not for the state of the connection: the statement is then left unprepared."""


class _Shape(NamedTuple):
    """A statement in Postgres's numbered placeholders, and the values' names in their
    order."""
    sql: str
    names: tuple[str, ...]
    execute_tail: str  # " (%s, %s)" or ""


_shapes: dict[str, _Shape | None] = {}
_SHAPES_KEPT = 4096
_refused: set[tuple[str, tuple[str, ...]]] = set()
_names = itertools.count(1)
_prefix = ""
"""This process's prepared statements' names begin with it (a new one after a fork)."""


def _new_prefix() -> None:
    global _prefix
    _prefix = f"agentq_{secrets.token_hex(4)}_"


_new_prefix()
os.register_at_fork(after_in_child=_new_prefix)
"""Names are this process's own (a forked worker draws its own prefix): a statement sent to
a server connection it was not prepared on, behind a pooler, finds no statement of that
name (26000) rather than another process's statement."""


def _shape(statement: str) -> _Shape | None:
    shape = _shapes.get(statement, False)
    if shape is not False:
        return shape  # type: ignore[return-value]
    shape = None
    if statement.lstrip()[:6].upper().startswith(_PREPARABLE) and ";" not in statement:
        order: dict[str, int] = {}

        def number(match: re.Match) -> str:
            name = match.group(1)
            if name is None:
                return "%"
            return f"${order.setdefault(name, len(order) + 1)}"
        sql = _PLACEHOLDER.sub(number, statement)
        tail = f" ({', '.join(['%s'] * len(order))})" if order else ""
        shape = _Shape(sql, tuple(order), tail)
    if len(_shapes) >= _SHAPES_KEPT:  # statements built with varying text: forget them all
        _shapes.clear()
    _shapes[statement] = shape
    return shape


def _declared(value: Any) -> str | None:
    """The type a value is declared as in PREPARE, as psycopg2 would quote it; None: a type
    this does not prepare (the statement goes as it is)."""
    if value is None or isinstance(value, (str, Json)):
        return "unknown"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int8" if value in _INT8 else None
    if isinstance(value, (float, Decimal)):
        return "numeric"
    if isinstance(value, datetime):
        return "timestamptz" if value.tzinfo is not None else "timestamp"
    if isinstance(value, date):
        return "date"
    if isinstance(value, time):
        return "timetz" if value.tzinfo is not None else "time"
    if isinstance(value, timedelta):
        return "interval"
    if isinstance(value, UUID):
        return "uuid"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytea"
    return None


class StalePlan(psycopg2.OperationalError):
    """A prepared statement could not run as prepared (see the module's notes); run again in
    a new transaction, the statement goes whole."""


class _Prepared:
    """One connection's prepared statements, least recently used first."""

    def __init__(self, threshold: int):
        self.threshold = threshold
        self.names: OrderedDict[tuple[str, tuple[str, ...]], str] = OrderedDict()
        self.seen: dict[tuple[str, tuple[str, ...]], int] = {}
        self.stale: list[str] = []
        """Names forgotten while their transaction had failed, deallocated with the next
        PREPARE."""
        self.executing: tuple[str, tuple[str, ...]] | None = None
        """The statement `rewrite` last turned into an EXECUTE."""

    def rewrite(self, cursor, statement: Any, parameters: Any) -> tuple[Any, Any]:
        if not isinstance(parameters, dict) or not isinstance(statement, str):
            return statement, parameters  # (bytes or a psycopg2.sql object: as it is)
        shape = _shape(statement)
        if shape is None:
            return statement, parameters
        try:
            values = tuple(parameters[name] for name in shape.names)
        except KeyError:
            return statement, parameters
        declared = [_declared(value) for value in values]
        types = tuple(t for t in declared if t is not None)
        if len(types) < len(declared):  # a value of no type we declare: sent as it is
            return statement, parameters
        key = (statement, types)
        name = self.names.get(key)
        if name is not None:
            self.names.move_to_end(key)
        else:
            if key in _refused:
                return statement, parameters
            seen = self.seen[key] = self.seen.get(key, 0) + 1
            if seen < self.threshold:
                if len(self.seen) > _SHAPES_KEPT:  # one-off statements: start counting anew
                    self.seen.clear()
                return statement, parameters
            del self.seen[key]
            name = self._prepare(cursor, key, shape)
            if name is None:
                return statement, parameters
        self.executing = key
        return f"EXECUTE {name}{shape.execute_tail}", values

    def forget(self) -> None:
        """The EXECUTE `rewrite` last made failed for what its prepared statement is: the
        name is dropped, its statement sent whole from now on (and prepared again in time)."""
        name = self.names.pop(self.executing, None) if self.executing is not None else None
        if name is not None:
            self.stale.append(name)

    def forget_all(self) -> None:
        """Every prepared statement forgotten (deallocated with the next PREPARE): one of
        them failed where it cannot be told which (`_send_writes`)."""
        self.stale.extend(self.names.values())
        self.names.clear()

    def _prepare(self, cursor, key: tuple[str, tuple[str, ...]], shape: _Shape) -> str | None:
        name = f"{_prefix}{next(_names)}"
        types = key[1]
        declared = f" ({', '.join(types)})" if types else ""
        sql = f"PREPARE {name}{declared} AS {shape.sql}"
        if len(self.names) >= MAX_PREPARED:
            self.stale.append(self.names.popitem(last=False)[1])
        if self.stale:
            sql = "".join(f"DEALLOCATE {old}; " for old in self.stale) + sql
            self.stale = []
        conn = cursor.connection
        in_transaction = not conn.autocommit or conn.get_transaction_status() != _IDLE
        if in_transaction:  # psycopg2 opens the transaction first, if none is open
            sql = f"SAVEPOINT {_SAVEPOINT}; {sql}; RELEASE SAVEPOINT {_SAVEPOINT}"
        try:
            _PLAIN_EXECUTE(cursor, sql)
        except psycopg2.Error as exc:
            if in_transaction:
                try:
                    _PLAIN_EXECUTE(cursor, f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}; "
                                           f"RELEASE SAVEPOINT {_SAVEPOINT}")
                except psycopg2.Error:
                    return None  # the connection is gone: the statement itself says so
            if (exc.pgcode or "")[:2] in _REFUSED_CLASSES:
                _refused.add(key)
                log.debug("statement left unprepared",
                          extra={"sqlstate": exc.pgcode, "statement": key[0][:200]})
            return None
        self.names[key] = name
        return name


_PLAIN_EXECUTE = psycopg2.extensions.cursor.execute


def _send_writes(conn: "Connection", cursor, text: str) -> None:
    """Deferred writes and their transaction's end, in one round trip. A prepared statement
    among them that can no longer run as prepared fails the commit as `StalePlan` (every
    statement of the connection is then sent whole until prepared again): the transaction
    is rolled back, and the caller runs it again as after a database blip."""
    try:
        _PLAIN_EXECUTE(cursor, text)
    except psycopg2.Error as exc:
        # a write failed before the COMMIT ran: the transaction is left failed, ended here
        if not conn.closed and conn.get_transaction_status() == _IN_ERROR:
            try:
                _PLAIN_EXECUTE(cursor, "ROLLBACK")
            except psycopg2.Error:
                pass  # the connection is gone: the pool replaces it
        if not isinstance(exc, (psycopg2.errors.FeatureNotSupported,  # "cached plan …"
                                psycopg2.errors.InvalidSqlStatementName)):
            raise
        if conn.agentq_prepared is not None:
            conn.agentq_prepared.forget_all()
        raise StalePlan(f"{str(exc).strip()} (a deferred write's prepared statement; run "
                        "again, it goes whole)") from exc


def _with_begin(ahead: str | None) -> str:
    """`ahead` (what goes with the next statement) opening a transaction."""
    return f"BEGIN; {ahead}" if ahead else "BEGIN"


def _without_begin(ahead: str | None) -> str | None:
    """`ahead` without the BEGIN `_with_begin` put first."""
    if ahead is None or not ahead.startswith("BEGIN"):
        return ahead
    return ahead[len("BEGIN; "):] or None


_IDLE = psycopg2.extensions.TRANSACTION_STATUS_IDLE
_IN_ERROR = psycopg2.extensions.TRANSACTION_STATUS_INERROR


class Cursor(psycopg2.extensions.cursor):
    def execute(self, query, vars=None):
        if self.name is not None:  # a server-side cursor's DECLARE takes the statement as is
            return _PLAIN_EXECUTE(self, query, vars)
        conn = self.connection
        if conn.deferring and conn.folded:
            return self._defer(conn, query, vars)
        if conn.lone:
            return self._execute_lone(conn, query, vars)
        ahead, folded = conn.ahead, conn.folded
        opens = conn.get_transaction_status() == _IDLE
        try:
            return self._execute(conn, query, vars, ahead)
        except StalePlan:
            if not opens:
                raise
        # it opened its transaction, which held nothing else: a new one, the statement whole
        conn.rollback()
        if folded:
            conn.fold_begin()
        conn.ahead = ahead
        return self._execute(conn, query, vars, ahead, whole=True)

    def _execute(self, conn, query, vars, ahead, whole=False):
        prepared = None if whole else conn.agentq_prepared
        sent, values = query, vars
        if prepared is not None:
            sent, values = prepared.rewrite(self, query, vars)
        executes = sent is not query
        if ahead and isinstance(sent, str):
            sent, conn.ahead, conn.deferred = f"{ahead}; {sent}", None, False
        if not executes:
            return _PLAIN_EXECUTE(self, sent, values)
        try:
            return _PLAIN_EXECUTE(self, sent, values)
        except (psycopg2.errors.FeatureNotSupported,  # "cached plan must not change …"
                psycopg2.errors.InvalidSqlStatementName) as exc:  # "… does not exist"
            if isinstance(exc, psycopg2.errors.InvalidSqlStatementName):
                conn.agentq_prepared = None
                log.warning("a prepared statement vanished from its connection: preparing "
                            "stops on it (behind a pooler in transaction mode, set "
                            "AGENTQ_DB_PREPARE_THRESHOLD=0)", extra={"sqlstate": exc.pgcode})
            else:
                prepared.forget()
                log.info("a prepared statement went stale: it is sent whole from now on",
                         extra={"sqlstate": exc.pgcode, "statement": query[:200]})
            raise StalePlan(f"{str(exc).strip()} (a statement prepared on this connection; "
                            "run again, it goes whole)") from exc

    def _execute_lone(self, conn, query, vars):
        """A folded transaction's first statement as a transaction of its own
        (`Connection.lone`): sent without its BEGIN, in autocommit mode, so Postgres commits
        it as it ends (a SET sent before it is one implicit transaction with it, so a SET
        LOCAL holds for it). A statement after it opens a transaction with a BEGIN again."""
        conn.lone = False
        conn.ahead = _without_begin(conn.ahead)
        try:
            return self.execute(query, vars)
        finally:
            if conn.folded and not conn.closed:
                conn.ahead = _with_begin(conn.ahead)

    def _defer(self, conn, query, vars) -> None:
        """A write whose answer nobody reads (`Connection.deferring`): quoted here, prepared
        as any other, and kept to go out with the transaction's next statement or with its
        COMMIT. Nothing is sent now; the cursor answers no rows."""
        prepared = conn.agentq_prepared
        sent, values = (prepared.rewrite(self, query, vars) if prepared is not None
                        else (query, vars))
        if prepared is not None:
            prepared.executing = None  # a later failure is not this statement's to forget
        text = self.mogrify(sent, values).decode(
            psycopg2.extensions.encodings.get(conn.encoding, "utf_8"))
        conn.ahead = f"{conn.ahead}; {text}" if conn.ahead else text
        conn.deferred = True

    def executemany(self, query, vars_list):
        conn = self.connection
        conn.lone = False  # sent with its BEGIN: a transaction as usual
        if conn.ahead:
            _PLAIN_EXECUTE(self, conn.ahead)
            conn.ahead, conn.deferred = None, False
        return super().executemany(query, vars_list)


class Connection(psycopg2.extensions.connection):
    """A psycopg2 connection with its prepared statements and its statement ahead."""
    threshold = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cursor_factory = Cursor
        self.agentq_prepared = _Prepared(self.threshold) if self.threshold > 0 else None
        self.ahead: str | None = None
        self.folded = False
        """The open (or next) transaction's BEGIN is sent by us (`fold_begin`)."""
        self.deferring = False
        """Statements executed now, in a folded transaction, are writes whose answer nobody
        reads: kept in `ahead` rather than sent (`agentq.loop.uow`'s events)."""
        self.deferred = False
        """`ahead` holds such writes: the commit sends them with its COMMIT."""
        self.lone = False
        """The folded transaction's first statement is to be a transaction of its own
        (`fold_begin(lone=True)`); cleared when it is sent."""

    def fold_begin(self, lone: bool = False) -> bool:
        """The next transaction's BEGIN goes with its first statement, and its end is sent
        as a statement (see the module's notes). `lone`: that first statement goes without
        the BEGIN, a transaction of its own that Postgres commits as it ends, and the end
        sends nothing unless statements came after it (they open the transaction as
        usual): one round trip for a transaction of one statement. False, and nothing
        changed, when a transaction is open or the connection is in autocommit mode."""
        if self.folded or self.autocommit or self.get_transaction_status() != _IDLE:
            return False
        self.autocommit = True  # psycopg2 sends no BEGIN of its own now
        self.folded, self.lone = True, lone
        self.ahead = _with_begin(self.ahead)
        return True

    def _end_folded(self, command: str, writes: str | None = None) -> None:
        """A folded transaction's end: `command` sent if a statement opened it, after the
        deferred `writes` (with the BEGIN, if no statement opened it) in the same round
        trip; the connection back out of autocommit mode, whatever happens."""
        try:
            if writes is not None:
                with self.cursor() as cursor:
                    _send_writes(self, cursor, f"{writes}; {command}")
            elif self.get_transaction_status() != _IDLE:
                with self.cursor() as cursor:
                    _PLAIN_EXECUTE(cursor, command)
        finally:
            self.folded = self.deferring = self.lone = False
            if not self.closed:
                self.autocommit = False

    def commit(self) -> None:
        ahead, deferred = self.ahead, self.deferred
        self.ahead, self.deferred = None, False
        if self.folded:
            self._end_folded("COMMIT", ahead if deferred else None)
        else:
            super().commit()

    def rollback(self) -> None:
        self.ahead, self.deferred = None, False
        if self.folded:
            self._end_folded("ROLLBACK")
        else:
            super().rollback()


@functools.cache
def connection_class(threshold: int) -> type[Connection]:
    """The connection class for `psycopg2.connect(connection_factory=…)`, preparing a
    statement on its `threshold`th run (0: never)."""
    return type("Connection", (Connection,), {"threshold": max(0, threshold)})


# --- a session's connection ---------------------------------------------------------------

def connection_of(session: "Session") -> Connection | None:
    """The session's connection when it is one of ours (psycopg2, this module's class);
    None on another driver or dialect."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    dbapi_connection = session.connection().connection.dbapi_connection
    return dbapi_connection if isinstance(dbapi_connection, Connection) else None


@contextmanager
def deferred_writes(session: "Session") -> Iterator[None]:
    """Writes whose answer nobody reads (the events, the held job's row, a step's new tool
    calls and messages): on our connections, in a transaction whose BEGIN was folded, sent
    with the transaction's next statement or with its COMMIT, one round trip fewer
    (`Connection.deferring`); an error in them is raised there. Elsewhere sent at once."""
    connection = connection_of(session)
    if connection is None or not connection.folded:
        yield
        return
    connection.deferring = True
    try:
        yield
    finally:
        connection.deferring = False
