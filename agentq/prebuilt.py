"""Prebuilt statements: a Core statement compiled once and run on the session's own psycopg2
cursor, SQLAlchemy's per-execution work skipped.

SQLAlchemy runs each Core statement through its execution machinery: the statement's cache
key (a walk of the whole statement), the compiled cache's lookup, every parameter
constructed and processed, an execution context, a result with its metadata, each row
processed column by column. SQLAlchemy's own code was 41% of the in-process floor's samples
(py-spy over 400 one-tool jobs: docs/benchmarks.md, issue 34's eighth pass), most of it in
the statements every step, tool call and poll runs.
A `Prebuilt` does that work once, on its first run against a dialect: the SQL string, which
parameters take a processor (a JSON column's serializer, say) and which hold a value fixed
in the statement, and each result column's processor. A run then builds its parameters,
executes on the session's DBAPI cursor (so `agentq.prepared` still prepares it and folds it
into the transaction as any statement) and answers plain named tuples.

What a run keeps of SQLAlchemy's behaviour:
  * the session's transaction: the statement runs on `session.connection()`, begun as
    `session.execute` would begin it. Like a Core statement of Tables run by
    `session.execute`, it does not flush the session's pending ORM changes first: the
    callers' statements are of Tables, in units of work that write their objects
    themselves;
  * its errors: a driver error is raised as SQLAlchemy's own exception class
    (`DBAPIError.instance`: an `OperationalError` stays one, so `db.DATABASE_UNREACHABLE`
    and every retry keep working), and a connection the error shows dead is invalidated so
    the pool never hands it out again;
  * its events: `before_cursor_execute` listeners hear the statement as SQLAlchemy would
    hand it to the driver (tests/support/sql.py counts statements so).

On another dialect or driver (SQLite) a run is the same statement on `session.connection()`:
one code path for the callers, the same rows (attribute and index access).

A statement whose SQL changes from run to run runs through SQLAlchemy's connection as before:
an `in_` of a list bound per call (SQLAlchemy expands the list into the SQL; fixed lists are
written as literals, `literal_in`), or a run of an INSERT or UPDATE given a parameter named
as a column of a table it writes (SQLAlchemy then writes that column too). The statements
run on every step are prebuilt: tests/unit/test_prebuilt.py lists them."""
from __future__ import annotations

import functools
import threading
from collections import namedtuple
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, Sequence, cast

from sqlalchemy import Table, literal_column
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement, visitors
from sqlalchemy.sql.expression import Executable, Select, UpdateBase
from sqlalchemy.sql.operators import ColumnOperators

if TYPE_CHECKING:
    from sqlalchemy.engine import CursorResult, Dialect
    from sqlalchemy.orm import Session
    from sqlalchemy.sql.elements import ClauseElement

_Processor = Callable[[Any], Any]


class _Plan(NamedTuple):
    """A statement as compiled for one dialect."""
    sql: str
    fixed: dict[str, Any]
    """Parameters whose value the statement holds (a literal compared with), processed."""
    processors: dict[str, _Processor]
    """The processor of each parameter a caller passes that has one."""
    names: frozenset[str]
    """Every parameter of the statement."""
    columns: frozenset[str]
    """The columns of the tables it writes (none for a statement that writes nothing) that
    are not among its parameters: SQLAlchemy writes a run's parameter named as one of them
    too (it compiles an INSERT or UPDATE for the keys it is given), so such a run goes
    through SQLAlchemy."""
    required: frozenset[str]
    """The parameters a caller must pass."""
    defaults: tuple[tuple[str, Callable[[Any], Any] | None, Any, _Processor | None], ...]
    """(name, callable, scalar, processor) of each column whose default (or onupdate) is
    computed in Python, as SQLAlchemy computes it for each execution when not given."""
    row: type | None
    """The named tuple of a row (None: the statement answers no rows)."""
    types: tuple[Any, ...]
    """Each result column's type, for this dialect."""
    results: list[tuple[tuple[int, _Processor], ...] | None]
    """[(column index, processor) of each result column that has one]: made on the first
    run, from the driver's type of each column (a numeric's processor depends on it)."""


def literal_in(column: ColumnOperators, values: Iterable[str]) -> ColumnElement[bool]:
    """`column IN ('a', 'b')` with the values written into the SQL: for fixed sets of
    known strings (statuses), which a prebuilt statement cannot bind as a list."""
    quoted: list[ColumnElement[Any]] = []
    for value in values:
        text = str(getattr(value, "value", value))
        if "'" in text or "\\" in text:
            raise ValueError(f"not a plain literal: {text!r}")
        quoted.append(literal_column(f"'{text}'"))
    return cast("ColumnElement[bool]", column.in_(quoted))


class Prebuilt:
    """A Core statement (SELECT, or INSERT/UPDATE/DELETE, with RETURNING or not), compiled
    once per dialect and run on the session's cursor (the module's notes)."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._plans: dict[str, _Plan | None] = {}
        self._lock = threading.Lock()

    # -- running ----------------------------------------------------------------------------
    def rows(self, on: "Session | Connection", params: dict[str, Any] | None = None
             ) -> list[Any]:
        """Every row the statement answers (named tuples; [] for a statement with none), run
        in the session's transaction (begun if none is), or on the connection."""
        if isinstance(on, Connection):
            connection = on
            if not connection.in_transaction():
                connection.begin()  # as its execute would autobegin: its commit is this one's
        else:
            connection = on.connection()
        dialect = connection.dialect
        # on the driver agentq installs (agentq.config); any other through SQLAlchemy
        plan = self._plan(dialect) if dialect.driver == "psycopg2" else None
        if plan is None or (params and not plan.columns.isdisjoint(params)):
            # another driver, a statement that expands a list, or a run that names a
            # column to write: as SQLAlchemy runs it
            result = cast("CursorResult[Any]", connection.execute(self.statement, params or {}))
            return list(result) if result.returns_rows else []
        return self._run(connection, dialect, plan, params or {})

    def first(self, on: "Session | Connection", params: dict[str, Any] | None = None) -> Any:
        """The first row, or None."""
        rows = self.rows(on, params)
        return rows[0] if rows else None

    def one(self, on: "Session | Connection", params: dict[str, Any] | None = None) -> Any:
        """The one row: SQLAlchemy's NoResultFound or MultipleResultsFound otherwise."""
        rows = self.rows(on, params)
        if len(rows) != 1:
            raise (sa_exc.NoResultFound if not rows else sa_exc.MultipleResultsFound)(
                "no row was found when one was required" if not rows
                else "more than one row was found when one was required")
        return rows[0]

    def scalar(self, on: "Session | Connection", params: dict[str, Any] | None = None) -> Any:
        """The first column of the first row, or None when there is no row."""
        row = self.first(on, params)
        return None if row is None else row[0]

    def execute(self, on: "Session | Connection", params: dict[str, Any] | None = None) -> None:
        """Run it, its rows (if any) not read."""
        self.rows(on, params)

    def _run(self, connection: Connection, dialect: "Dialect", plan: _Plan,
             params: dict[str, Any]) -> list[Any]:
        values = dict(plan.fixed)
        processors = plan.processors
        for name, value in params.items():
            if name in plan.names:
                processor = processors.get(name)
                values[name] = processor(value) if processor is not None else value
        for name, make, scalar, processor in plan.defaults:
            if name not in params:
                value = make(None) if make is not None else scalar
                values[name] = processor(value) if processor is not None else value
        if not plan.required <= values.keys():
            raise sa_exc.ArgumentError(
                f"a value is required for {sorted(plan.required - values.keys())}")
        dbapi_connection = connection.connection.dbapi_connection
        cursor = dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            for listener in connection.dispatch.before_cursor_execute:
                listener(connection, cursor, plan.sql, values, None, False)
            cursor.execute(plan.sql, values)
            if plan.row is None or cursor.description is None:
                return []
            fetched = cursor.fetchall()
            results = plan.results[0]
            if results is None:
                results = plan.results[0] = _result_processors(plan.types, dialect,
                                                               cursor.description)
        except dialect.loaded_dbapi.Error as error:
            raise _translated(connection, dialect, error, plan.sql, values, cursor) from error
        finally:
            cursor.close()
        return _rows(plan.row, results, fetched)

    # -- compiling --------------------------------------------------------------------------
    def _plan(self, dialect: "Dialect") -> _Plan | None:
        """The statement's plan for `dialect`, compiled on its first run (under a lock; a
        compiled one read without it)."""
        if dialect.name in self._plans:
            return self._plans[dialect.name]
        with self._lock:
            if dialect.name not in self._plans:
                self._plans[dialect.name] = _compile(self.statement, dialect)
            return self._plans[dialect.name]


@functools.lru_cache(maxsize=512)
def prebuilt(statement: Executable) -> Prebuilt:
    """The Prebuilt of a statement built once elsewhere (a module's constant, a statement a
    builder caches): one per statement object, compiled once."""
    return Prebuilt(statement)


def _result_processors(types: tuple[Any, ...], dialect: "Dialect", description: Any
                       ) -> tuple[tuple[int, _Processor], ...]:
    out = []
    for index, (type_, column) in enumerate(zip(types, description, strict=True)):
        processor = type_.result_processor(dialect, column[1])
        if processor is not None:
            out.append((index, processor))
    return tuple(out)


def _rows(row: Any, results: tuple[tuple[int, _Processor], ...],
          fetched: Sequence[tuple[Any, ...]]) -> list[Any]:
    make = row._make
    if not results:
        return [make(values) for values in fetched]
    out = []
    for fetched_row in fetched:
        values = list(fetched_row)
        for index, processor in results:
            values[index] = processor(values[index])
        out.append(make(values))
    return out


def _compile(statement: Executable, dialect: "Dialect") -> _Plan | None:
    """The statement's plan; None when its SQL changes from run to run (a list parameter
    expanded into it) or a value is computed per run in a way this does not (a callable
    bind, a SQL default): it runs through SQLAlchemy."""
    compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    fixed: dict[str, Any] = {}
    processors: dict[str, _Processor] = {}
    required: set[str] = set()
    for bind, name in compiled.bind_names.items():
        if bind.expanding or bind.callable is not None:
            return None
        processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None:
            processors[name] = processor
        if bind.required:
            required.add(name)
        else:  # a value the statement holds (None too: NULL, as SQLAlchemy sends it)
            fixed[name] = processor(bind.value) if processor is not None else bind.value
    defaults = []
    for columns, attribute in ((compiled.insert_prefetch, "default"),
                               (compiled.update_prefetch, "onupdate")):
        for column in columns:
            default = getattr(column, attribute)
            if not (default.is_scalar or default.is_callable):
                return None
            fixed.pop(column.key, None)
            defaults.append((column.key, default.arg if default.is_callable else None,
                             default.arg, processors.get(column.key)))
    columns = _answered(statement)
    row: type | None = None
    if columns:
        keys = [getattr(column, "key", None) or getattr(column, "name", None) or f"c{index}"
                for index, column in enumerate(columns)]
        row = namedtuple("Row", keys, rename=True)  # type: ignore[misc,no-redef]
    names = frozenset(compiled.bind_names.values())
    elements = list(visitors.iterate(cast("ClauseElement", statement)))
    written = frozenset(column.key for element in elements if isinstance(element, Table)
                        for column in element.c) - names if any(
        isinstance(element, UpdateBase) for element in elements) else frozenset()
    return _Plan(compiled.string, fixed, processors, names, written,
                 frozenset(required), tuple(defaults), row,
                 tuple(column.type.dialect_impl(dialect) for column in columns), [None])


def _answered(statement: Executable) -> list[Any]:
    """The statement's result columns, in order (a SELECT's; an INSERT/UPDATE/DELETE's
    RETURNING, none without one)."""
    if isinstance(statement, Select):
        return list(statement.selected_columns)
    if isinstance(statement, UpdateBase):
        return list(statement.exported_columns)
    raise TypeError(f"not a SELECT, INSERT, UPDATE or DELETE: {type(statement).__name__}")


def _translated(connection: Any, dialect: "Dialect", error: Any, sql: str,
                values: dict[str, Any], cursor: Any) -> sa_exc.StatementError:
    """`error`, a driver's, as SQLAlchemy raises it; a connection it shows dead is
    invalidated first (SQLAlchemy does both when it runs the statement itself)."""
    dbapi_connection = connection.connection.dbapi_connection
    gone = dialect.is_disconnect(error, dbapi_connection, cursor)
    if gone:
        connection.invalidate(error)
    translated = sa_exc.DBAPIError.instance(
        sql, values, error, dialect.loaded_dbapi.Error,
        hide_parameters=connection.engine.hide_parameters, dialect=dialect,
        connection_invalidated=gone)
    return translated
