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
