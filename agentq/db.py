"""Engine and sessions: one engine per process and URL, sessions short-lived.

A step never holds a connection while the model thinks: it opens a session to claim and read,
closes it, calls the model, then opens another to write.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

from sqlalchemy import create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from agentq.config import Settings, get_settings

_lock = threading.Lock()
_engines: dict[str, Engine] = {}
_makers: dict[str, sessionmaker] = {}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def make_engine(settings: Settings) -> Engine:
    url = settings.database_url
    if url.startswith("sqlite"):
        if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
            from pathlib import Path
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size * 2,
        pool_pre_ping=True,
        pool_recycle=1800,
    )


def engine_for(settings: Settings | None = None) -> Engine:
    settings = settings or get_settings()
    with _lock:
        engine = _engines.get(settings.database_url)
        if engine is None:
            engine = _engines[settings.database_url] = make_engine(settings)
        return engine


def session_factory(settings: Settings | None = None) -> sessionmaker:
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


def lock_row(session: Session, model, ident):
    """`model`'s row with this id, locked for the transaction (None when there is none).

    FOR NO KEY UPDATE: inserts of rows that reference it (their foreign key takes KEY
    SHARE) are not blocked by it. The object is re-read (populate_existing), so what the
    caller sees is what it locked. The one lock helper: jobs, conversations and batches are
    locked through it, always in that order (a batch's row only ever first, alone)."""
    query = select(model).where(model.id == ident)
    if session.bind.dialect.name == "postgresql":
        query = query.with_for_update(key_share=True)
    return session.execute(query.execution_options(populate_existing=True)
                           ).scalar_one_or_none()


def relax_durability(session: Session) -> None:
    """This transaction may be lost in a database crash without harm: what it records is
    re-done by the next delivery or the sweeper (a claim, a tool's start). Skipping its
    disk flush saves a sync per step on Postgres."""
    if session.bind.dialect.name == "postgresql":
        session.connection().exec_driver_sql("SET LOCAL synchronous_commit = off")


def dispose_engines() -> None:
    """Forget engines (after a fork, or in tests that switch databases)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _makers.clear()
