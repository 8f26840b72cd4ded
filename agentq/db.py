"""Engine and sessions: one engine per process and URL, sessions short-lived.

A step never holds a connection while the model thinks: it opens a session to claim and read,
closes it, calls the model, then opens another to write.
"""
from __future__ import annotations

import functools
import logging
import select as io_select  # sqlalchemy's select is the name used here
import sqlite3
import threading
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import (
    Any,
    Callable,
    ClassVar,
    Iterator,
    Literal,
    Protocol,
    Sequence,
    TypeVar,
    cast,
    overload,
)

import psycopg2.extensions
from sqlalchemy import (
    JSON,
    BindParameter,
    Column,
    Insert,
    Select,
    Table,
    Update,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, CursorResult, Dialect, Engine, make_url
from sqlalchemy.exc import DisconnectionError, InterfaceError, InvalidatePoolError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, make_transient_to_detached, sessionmaker
from sqlalchemy.orm.attributes import instance_state
from sqlalchemy.orm.state import InstanceState
from sqlalchemy.sql.dml import UpdateBase
from sqlalchemy.sql.schema import CallableColumnDefault, ScalarElementColumnDefault
from sqlalchemy.sql.selectable import CTE, ScalarSelect
from tenacity import (
    AttemptManager,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from agentq import prepared
from agentq.config import Settings, get_settings
from agentq.prebuilt import prebuilt

_lock = threading.Lock()
RELAXED = "SET LOCAL synchronous_commit = off"
DATABASE_UNREACHABLE = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)
"""The database is away (refused, restarting, a connection cut), or every pooled connection
stayed busy past the pool's timeout: nothing is wrong with the request, it may be tried
again. The API answers it 503 (api/errors.py), a step or tool task retries it
(tasks/base.py), a tool's result waits it out (agentq/loop/execute.py)."""
log = logging.getLogger(__name__)
_engines: dict[str, Engine] = {}
_makers: dict[str, sessionmaker[Session]] = {}


class Model(Protocol):
    """An object of a mapped class of agentq.models, as the statement helpers here see it
    (this module cannot import those: they import it): its class's Table."""
    __table__: ClassVar[Table]


class ModelWithId(Model, Protocol):
    """A `Model` whose primary key is its UUID `id` (every table but tool_modules)."""
    id: uuid.UUID


def riding_out(deadline_s: float, kept: str, *, first_wait_s: float = 0.5,
               longest_wait_s: float = 5.0, **context: Any) -> Iterator[AttemptManager]:
    """The attempts of a write whose work is done already (a tool ran, the model answered):
    retried while the database is away (`DATABASE_UNREACHABLE`), backing off from
    `first_wait_s` doubling up to `longest_wait_s`, for `deadline_s`, rather than lost and
    done again. Each attempt a new unit of work:

        for attempt in riding_out(deadline_s, "tool result", tool_use_id=...):
            with attempt, UnitOfWork(sessions) as uow: ...

    Each wait is logged, and a write that needed more than one attempt when it is done
    ("<kept> stored after the database came back"), with `context` as the log's fields. A
    body that returns from inside the loop ends it without that last line."""
    def waiting(state: RetryCallState) -> None:
        log.warning(f"database unreachable: the {kept} is written when it answers",
                    extra={**context, "tries": state.attempt_number,
                           "retry_in_s": round(state.upcoming_sleep, 2)})
    retrying = Retrying(retry=retry_if_exception_type(DATABASE_UNREACHABLE),
                        stop=stop_after_delay(deadline_s),
                        wait=wait_exponential(multiplier=first_wait_s, max=longest_wait_s),
                        before_sleep=waiting,
                        reraise=True)
    for attempt in retrying:
        tries = attempt.retry_state.attempt_number
        yield attempt
    if tries > 1:
        log.info(f"{kept} stored after the database came back",
                 extra={**context, "tries": tries})


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def make_engine(settings: Settings) -> Engine:
    url = settings.database_url
    if url.startswith("sqlite"):
        make_sqlite_folder(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: sqlite3.Connection,
                            _record: object) -> None:  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # Every connection a process opens is kept: with an overflow beyond a smaller kept
    # pool, a burst of 300 jobs made Postgres open 70-140 connections (each a backend
    # forked and warmed) that were closed again as soon as they were returned; keeping them
    # cut the machine's CPU per job by 2-3 ms (docs/benchmarks.md, the fifth pass).
    ours = make_url(url).get_driver_name() == "psycopg2"  # the driver agentq installs
    engine = create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=0,
        pool_timeout=settings.db_pool_timeout_s,
        pool_recycle=1800,
        connect_args={"connection_factory": prepared.connection_class(
            settings.db_prepare_threshold)} if ours else {},
    )
    event.listen(engine, "checkout", _closed_by_server_replaced(engine.dialect))
    return engine


def make_sqlite_folder(url: str) -> None:
    """The folder of a SQLite file URL (`sqlite:///…`, or Celery's `db+sqlite:///…`) made:
    SQLite opens the file, but makes no folder for it. Other URLs: nothing."""
    path = url.removeprefix("db+").removeprefix("sqlite:///")
    if path != url.removeprefix("db+") and not path.startswith(":memory:"):
        from pathlib import Path
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def _closed_by_server_replaced(dialect: Dialect) -> Callable[[Any, object, object], None]:
    """A pool `checkout` listener: a pooled connection the server has closed is replaced
    before it is used, without a round trip for one that is alive.

    SQLAlchemy's `pool_pre_ping` sends a statement on every checkout: about nine round
    trips of a one-tool job, each costing CPU here and in Postgres (docs/benchmarks.md,
    the fourth pass). The server says nothing to an idle client, so a pooled connection
    with something to read was told goodbye: a restart's or `pg_terminate_backend`'s
    FATAL, then the end of the stream. That is seen with a poll(2) of its socket that does
    not wait (gevent's cooperative poll under that pool). Only such a connection is pinged
    as pre-ping would (what arrived may be a harmless notice); a dead one invalidates the
    pool, as a failed pre-ping does, and SQLAlchemy connects again. A server gone without
    closing (a host lost, a network cut) is not seen here, nor by a ping until its TCP
    timeout: the statement fails instead, SQLAlchemy invalidates the pool, and the API
    answers 503 or the task retries (DATABASE_UNREACHABLE). The connection is the
    driver's own (psycopg2's, or another Postgres driver's): typed Any, as DB-API
    connections have no common type with `closed` and `fileno()`."""
    def checkout(dbapi_connection: Any, _record: object, _proxy: object) -> None:
        if dbapi_connection.closed:
            raise InvalidatePoolError("the connection was closed")
        idle = io_select.poll()  # looked up now: gevent's, if it patched the module
        idle.register(dbapi_connection.fileno(),
                      io_select.POLLIN | io_select.POLLERR | io_select.POLLHUP)
        if not idle.poll(0):
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi_connection, None):
                raise InvalidatePoolError("the server closed the connection") from exc
            raise
    return checkout


def engine_for(settings: Settings | None = None) -> Engine:
    settings = settings or get_settings()
    with _lock:
        engine = _engines.get(settings.database_url)
        if engine is None:
            engine = _engines[settings.database_url] = make_engine(settings)
        return engine


def session_factory(settings: Settings | None = None) -> sessionmaker[Session]:
    settings = settings or get_settings()
    with _lock:
        maker = _makers.get(settings.database_url)
    if maker is None:
        engine = engine_for(settings)
        with _lock:
            maker = _makers.setdefault(
                settings.database_url,
                sessionmaker(bind=engine, expire_on_commit=False, future=True))
    return maker


@contextmanager
def session_scope(settings: Settings | None = None) -> Iterator[Session]:
    """A transaction: committed on success, rolled back on any error, always closed."""
    session = session_factory(settings)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@contextmanager
def read_scope(settings: Settings | None = None) -> Iterator[Session]:
    """Reads that need not agree with each other (a poll's job and its children): each
    statement in its own snapshot, in autocommit mode (`autocommitting`), so no BEGIN and no
    COMMIT is sent: one round trip a statement instead of a statement's plus two. Nothing is
    written here (a write would be committed by itself, at once). Always closed."""
    session = session_factory(settings)()
    try:
        with autocommitting(session.connection()):
            yield session
    finally:
        session.close()


_PG_IDLE = psycopg2.extensions.TRANSACTION_STATUS_IDLE


@contextmanager
def autocommitting(connection: Connection) -> Iterator[None]:
    """Statements on `connection` each commit alone for the block: psycopg2's autocommit
    switched on, and off again before the connection goes back to its pool (a flag of the
    driver's: no round trip either way). Not SQLAlchemy's `isolation_level="AUTOCOMMIT"`:
    the pool resets that as it takes the connection back, outside its own error handling, so
    a server gone at that moment failed the request (a 500 in a Postgres restart, the fault
    suite). Another driver (SQLite's), or a connection already in a transaction: as it is."""
    dbapi_connection = connection.connection.dbapi_connection
    if (not isinstance(dbapi_connection, psycopg2.extensions.connection)
            or dbapi_connection.autocommit
            or dbapi_connection.get_transaction_status() != _PG_IDLE):
        yield
        return
    dbapi_connection.autocommit = True
    try:
        yield
    finally:
        if not dbapi_connection.closed:
            dbapi_connection.autocommit = False


@contextmanager
def snapshot_scope(settings: Settings | None = None) -> Iterator[Session]:
    """A read-only transaction whose statements all see one snapshot of the database, for an
    answer built from several reads (a job page: the job, its events, its calls) that must
    agree with itself. Postgres reads in READ COMMITTED, a snapshot per statement: this one
    is REPEATABLE READ READ ONLY. SQLite's driver starts no transaction for a SELECT (each
    would read its own snapshot): this one begins one. Always rolled back and closed."""
    session = session_factory(settings)()
    try:
        if session.get_bind().dialect.name == "postgresql":
            session.connection(execution_options={"isolation_level": "REPEATABLE READ",
                                                  "postgresql_readonly": True})
        else:
            session.connection().exec_driver_sql("BEGIN")
        yield session
    finally:
        session.rollback()
        session.close()


@functools.cache
def _lock_statement(model: type[Model], postgres: bool, load: bool) -> Select[Any]:
    ident = model.__table__.c.id
    query = (select(model) if load else select(ident)).where(ident == bindparam("ident"))
    if postgres:
        query = query.with_for_update(key_share=True)
    return query.execution_options(populate_existing=True) if load else query


_Row = TypeVar("_Row", bound=Model)


@overload
def lock_row(session: Session, model: type[_Row], ident: Any, *,
             load: Literal[True] = True) -> _Row | None: ...
@overload
def lock_row(session: Session, model: type[Model], ident: Any, *, load: bool) -> Any: ...
def lock_row(session: Session, model: type[Model], ident: Any, *, load: bool = True) -> Any:
    """`model`'s row with this id, locked for the transaction (None when there is none).

    FOR NO KEY UPDATE: inserts of rows that reference it (their foreign key takes KEY
    SHARE) are not blocked by it. The object is re-read (populate_existing), so what the
    caller sees is what it locked; `load=False` locks without loading it and answers the id
    (for a writer that changes the row only through statements of its own). The one lock
    helper: jobs, conversations and batches are locked through it, always in that order (a
    batch's row only ever first, alone)."""
    statement = _lock_statement(model, session.get_bind().dialect.name == "postgresql", load)
    return session.execute(statement, {"ident": ident}).scalar_one_or_none()


_NONE_AS_SQL_NULL = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
"""A JSON column's bind type in insert_new: None is SQL NULL, as the ORM's flush writes a
column left unset (the column's own type would write JSON's `null`)."""


@functools.cache
def _insert_statement(dialect: str, model: type[Model], unique: tuple[str, ...]) -> Insert:
    table = model.__table__
    json_nulls = {column.key: bindparam(column.key, type_=_NONE_AS_SQL_NULL)
                  for column in table.c if isinstance(column.type, JSON)}
    if not unique:
        return insert(table).values(json_nulls)
    if dialect == "postgresql":
        return (postgresql.insert(table).values(json_nulls)
                .on_conflict_do_nothing(index_elements=list(unique)))
    return (sqlite.insert(table).values(json_nulls)
            .on_conflict_do_nothing(index_elements=list(unique)))


@functools.cache
def _mapped_columns(model: type[Model]) -> tuple[tuple[str, Column[Any]], ...]:
    """(attribute name, table column) of each mapped column: `Job.meta` is the column
    `metadata`."""
    return tuple((prop.key, prop.columns[0]) for prop in inspect(model).column_attrs)


@functools.cache
def _columns_of(model: type[Model]) -> dict[str, Column[Any]]:
    """attribute name → table column, of each mapped column."""
    return dict(_mapped_columns(model))


def _column_value(obj: Model, attribute: str, column: Column[Any]) -> Any:
    """What the ORM's flush would write for `column`: the attribute's value, else the
    column's Python default (a scalar, or a callable of no argument), else NULL."""
    if attribute in obj.__dict__:
        return obj.__dict__[attribute]
    default = column.default
    if isinstance(default, ScalarElementColumnDefault):
        return default.arg
    if isinstance(default, CallableColumnDefault):
        # the ORM wraps a no-argument callable to take a context, which it ignores
        return default.arg(None)  # type: ignore[arg-type]  # no context outside a flush
    return None


def _row_of(obj: Model) -> dict[str, Any]:
    """attribute name → what the ORM's flush would write, of each mapped column of `obj`."""
    return {attribute: _column_value(obj, attribute, column)
            for attribute, column in _mapped_columns(type(obj))}


def insert_new(session: Session, obj: Model, unique: tuple[str, ...] = ()) -> bool:
    """Write a new ORM object's row with one Core INSERT, the ORM's flush skipped (its
    unit-of-work machinery costs more CPU than the statement); `… ON CONFLICT (unique) DO
    NOTHING` when a concurrent writer may hold a unique key, with no SAVEPOINT, so the
    loser of a race keeps its transaction. True: written, and `obj` joins the session as if
    loaded from that row. False: another writer's row holds the key; the caller reads it."""
    columns = _mapped_columns(type(obj))
    values = _row_of(obj)
    statement = _insert_statement(session.get_bind().dialect.name, type(obj), unique)
    result = cast("CursorResult[Any]", session.execute(  # an INSERT's: it has rowcount
        statement, {column.key: values[attribute] for attribute, column in columns}))
    if result.rowcount != 1:
        return False
    _joined_as_written(session, obj, values)
    return True


def _joined_as_written(session: Session, obj: Model, values: dict[str, Any]) -> None:
    """`obj`, whose row was written with `values` (every column), joins the session as if
    loaded from that row: nothing to read back."""
    for attribute, value in values.items():
        setattr(obj, attribute, value)
    make_transient_to_detached(obj)
    session.add(obj)


def insert_all(session: Session, objects: Sequence[Model]) -> None:
    """Write new ORM objects of one class with one Core INSERT (as `insert_new` writes one,
    with no unique key to contend for): the flush skipped, so a transaction whose other
    change is its held job writes that with `write_changes` (a step's tool calls)."""
    if not objects:
        return
    model = type(objects[0])
    columns = _mapped_columns(model)
    values = [_row_of(obj) for obj in objects]
    session.execute(_insert_statement(session.get_bind().dialect.name, model, ()),
                    [{column.key: row[attribute] for attribute, column in columns}
                     for row in values])
    for obj, row in zip(objects, values, strict=True):
        _joined_as_written(session, obj, row)


_MARKS_FLUSHED = hasattr(InstanceState, "_commit_all")
"""The flush's own way to mark an object written (SQLAlchemy 1.4 to 2.1, not public API): a
release without it makes write_changes decline, and the caller flush, rather than fail."""


def write_changes(session: Session, obj: ModelWithId,
                  together: tuple[UpdateBase, dict[str, Any]] | None = None) -> bool:
    """Write a loaded object's changed columns with one Core UPDATE by its id, the ORM's
    flush skipped (its unit-of-work machinery costs more CPU than the statement: a step's
    job row, changed many times in one transaction); the object is then as after a flush,
    nothing pending. False, and nothing written, when a change is not a plain column (a
    relationship): the caller flushes.

    `together` (Postgres; a data-modifying statement built once, and its parameters): run
    in the same statement, as a CTE of the UPDATE, which Postgres runs once whether or not
    the UPDATE reads it (a step's events with its job's row). Written exactly when True is
    returned."""
    return _write_changes(session, obj, together)[0]


def _write_changes(session: Session, obj: ModelWithId,
                   together: tuple[UpdateBase, dict[str, Any]] | None = None,
                   read: ScalarSelect[Any] | None = None) -> tuple[bool, Any]:
    """`write_changes`, and what `read` (a scalar subquery, its parameters among
    `together`'s) answers as the UPDATE's RETURNING, in the UPDATE's snapshot (before the
    statement's writes); None when there was no UPDATE (nothing changed)."""
    state = instance_state(obj)
    columns = _columns_of(type(obj))
    if not _MARKS_FLUSHED or any(key not in columns for key in state.committed_state):
        return False, None
    changed = frozenset(key for key in state.committed_state if key in state.dict)
    answer = None  # on the cursor (agentq.prebuilt), which never autoflushes (it would flush obj)
    if changed:
        params = {f"new_{key}": state.dict[key] for key in changed}
        params.update(ident=obj.id, **(together[1] if together is not None else {}))
        statement = prebuilt(_update_statement(
            type(obj), changed, together[0] if together else None, read))
        rows = statement.rows(session, params)  # an UPDATE of the held row by its id: one
        answer = rows[0][0] if read is not None else None
    elif together is not None:
        prebuilt(together[0]).execute(session, together[1])
    # what the flush does to the objects it wrote (SQLAlchemy's own, not public API)
    state._commit_all(state.dict, session.identity_map)
    return True, answer


def insert_new_with(session: Session, obj: Model, changed: ModelWithId,
                    read: tuple[ScalarSelect[Any], dict[str, Any]] | None = None
                    ) -> tuple[bool, Any]:
    """Write a new ORM object's row (as `insert_new`, with no unique key to contend for) in
    the statement that writes `changed`'s changes (`write_changes`' `together`): one round
    trip for both, as a new job and the conversation it takes. The INSERT runs as a CTE of
    the UPDATE, so a foreign key either way is checked once both are written. `read` (a
    scalar subquery and its parameters, named unlike `changed`'s columns): answered by the
    same statement, in its snapshot (before its writes). Postgres only. (Whether written,
    what `read` answered: None without it or with nothing changed); not written, nothing
    written, on another dialect or when `write_changes` declines: the caller writes them
    one by one."""
    dialect = session.get_bind().dialect.name
    if dialect != "postgresql":
        return False, None
    columns = _mapped_columns(type(obj))
    values = _row_of(obj)
    params = {f"row_{column.key}": values[attribute] for attribute, column in columns}
    if read is not None:
        params.update(read[1])
    written, answer = _write_changes(session, changed, (_row_insert_statement(type(obj)),
                                                        params),
                                     read[0] if read is not None else None)
    if not written:
        return False, None
    _joined_as_written(session, obj, values)
    return True, answer


def insert_new_chain(session: Session, *rows: tuple[Model, tuple[str, ...]]) -> int | None:
    """Write new ORM objects' rows in one statement (Postgres), each only when the one before
    it was written: its INSERT selects from the previous one's, a data-modifying CTE
    returning its id (a foreign key between them is checked at the statement's end). A row
    given a unique key is `… ON CONFLICT (unique) DO NOTHING` (as `insert_new`): another
    writer's row holds it, and neither it nor any row after it is written. Answers how
    many were written, a prefix of `rows`, which join the session; the caller reads the
    winner's row of the first one not written. None, nothing written, on another dialect:
    the caller writes them one by one."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    values = [_row_of(obj) for obj, _ in rows]
    params: dict[str, Any] = {}
    for at, ((obj, _), row) in enumerate(zip(rows, values, strict=True)):
        params.update({f"r{at}_{column.key}": row[attribute]
                       for attribute, column in _mapped_columns(type(obj))})
    written = sum(prebuilt(_chain_statement(tuple(
        (type(obj), unique) for obj, unique in rows))).one(session, params))
    for (obj, _), row in zip(rows[:written], values, strict=False):
        _joined_as_written(session, obj, row)
    return written


@functools.cache
def _chain_statement(rows: tuple[tuple[type[Model], tuple[str, ...]], ...]) -> Select[Any]:
    """`WITH w0 AS (INSERT INTO <first> … RETURNING id), w1 AS (INSERT INTO <second>
    SELECT … FROM w0 RETURNING id), … SELECT <rows in w0>, <rows in w1>, …`, each row's
    columns bound as r<its place>_<column>."""
    made: list[CTE] = []
    for at, (model, unique) in enumerate(rows):
        table = model.__table__
        values = _row_values(model, f"r{at}")
        insert_ = postgresql.insert(table)
        if made:
            statement = insert_.from_select(
                [column.name for column in table.c],
                select(*(values[column] for column in table.c)).select_from(made[-1]))
        else:
            statement = insert_.values(values)
        if unique:
            statement = statement.on_conflict_do_nothing(index_elements=list(unique))
        made.append(statement.returning(table.c.id).cte(f"w{at}"))
    return select(*(select(func.count()).select_from(cte).scalar_subquery() for cte in made))


def _row_values(model: type[Model], prefix: str) -> dict[Column[Any], BindParameter[Any]]:
    """Each column of `model`'s table bound as <prefix>_<column> (a JSON column's None is
    SQL NULL, as `insert_new` writes it)."""
    return {column: bindparam(f"{prefix}_{column.key}", type_=(
        _NONE_AS_SQL_NULL if isinstance(column.type, JSON) else column.type))
        for column in model.__table__.c}


@functools.cache
def _row_insert_statement(model: type[Model]) -> Insert:
    """`INSERT INTO <model's table>` of every column, bound as `row_<column>`: inside
    another table's UPDATE, a parameter named as a column would be taken for a SET value."""
    return insert(model.__table__).values(_row_values(model, "row"))


@functools.cache
def _update_statement(model: type[Model], attributes: frozenset[str],
                      together: UpdateBase | None = None,
                      read: ScalarSelect[Any] | None = None) -> Update:
    """`UPDATE … SET <those columns> WHERE id = :ident`, built once per set of attributes
    (a step changes its job in a handful of ways) and statement run with it: a statement
    made per call costs more CPU than running it. Bound as `new_<attribute>`: a parameter
    named as a column would be taken for a SET value. `together`: a CTE of it; `read`: what
    it returns."""
    table = model.__table__
    columns = _columns_of(model)
    statement = (update(table).where(table.c.id == bindparam("ident"))
                 .values({columns[a]: bindparam(f"new_{a}", type_=columns[a].type)
                          for a in sorted(attributes)}))
    statement = statement if together is None else statement.add_cte(together.cte("together"))
    return statement if read is None else statement.returning(read)


def relax_durability(session: Session) -> None:
    """This transaction may be lost in a database crash without harm: what it records is
    re-done by the next delivery or the sweeper (a claim, a tool's start). Skipping its
    disk flush saves a sync per step on Postgres. On agentq's psycopg2 connections the SET
    goes with the transaction's next statement, in one round trip (agentq.prepared)."""
    if session.get_bind().dialect.name != "postgresql":
        return
    connection = session.connection()
    dbapi_connection = connection.connection.dbapi_connection
    if isinstance(dbapi_connection, prepared.Connection):
        dbapi_connection.ahead = RELAXED
    else:
        connection.exec_driver_sql(RELAXED)


def dispose_engines() -> None:
    """Forget engines (after a fork, or in tests that switch databases)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _makers.clear()
