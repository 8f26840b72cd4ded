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


def blocked_by(session, pid: int) -> bool:
    """Whether some backend waits for one of backend `pid`'s locks, looked at in a
    transaction of its own: Postgres keeps one snapshot of pg_stat_activity per
    transaction, so a longer one never shows a backend opened after its first look."""
    from sqlalchemy import text
    with session.begin():
        return bool(session.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"),
            {"pid": pid}).scalar_one())
