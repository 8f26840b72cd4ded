"""What SQL a block of a test sent: for tests that count or inspect statements."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import event
from sqlalchemy.engine import Engine


@contextmanager
def sql_sent(engine: Engine) -> Iterator[list[str]]:
    """The SQL `engine` sends while the block runs, in order (each statement's text as
    SQLAlchemy hands it to the driver)."""
    statements: list[str] = []

    def listener(conn, cursor, statement, *rest) -> None:
        statements.append(statement)
    event.listen(engine, "before_cursor_execute", listener)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", listener)


@contextmanager
def wire_sent() -> Iterator[list[str]]:
    """What agentq's psycopg2 connections (`agentq.prepared`) send while the block runs,
    one string a round trip: BEGIN and COMMIT as they go, folded or alone."""
    from agentq import prepared
    strings: list[str] = []
    plain = prepared._PLAIN_EXECUTE

    def counted(cursor, query, vars=None):
        strings.append(query if isinstance(query, str) else str(query))
        return plain(cursor, query, vars)
    prepared._PLAIN_EXECUTE = counted
    try:
        yield strings
    finally:
        prepared._PLAIN_EXECUTE = plain
