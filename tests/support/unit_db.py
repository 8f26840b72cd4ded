"""The unit tests' databases: a fresh, migrated one for each test, on SQLite (the default)
or on the suite's private Postgres (`AGENTQ_UNIT_DB=postgres`; CI runs the unit suite both
ways, `.ci/run`), so the code's Postgres branches are tested by the same tests as its SQLite
ones.

    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), "AGENTQ_X": "1"})

Either way the Alembic history is run once per test process into a template and each test
gets a copy: SQLite's backup API copies the template file; Postgres makes the database
`CREATE DATABASE … TEMPLATE` the migrated one (running the migrations took 2-11 s a test on a
loaded machine). One database per AGENTQ_HOME: a test that makes several settings for the
same home shares one database, as it would share one SQLite file. The Postgres databases a
test made are dropped when it ends (`drop_made`, tests/unit/conftest.py), the templates when
the session ends (`drop_templates`).

A test of something only one backend has names it: `settings(env, backend="sqlite")`; a
test given `AGENTQ_DATABASE_URL` keeps that database.
"""
from __future__ import annotations

import atexit
import itertools
import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

from agentq import migrate
from agentq.config import Settings

BACKENDS = ("sqlite", "postgres")
ENV = "AGENTQ_UNIT_DB"

_lock = threading.Lock()
_sqlite_template: Path | None = None
_pg_template: str | None = None
_made: dict[str, str] = {}
"""AGENTQ_HOME → the URL of the Postgres database made for it in this test."""
_names = itertools.count()


def _run_backend() -> str:
    """AGENTQ_UNIT_DB: `sqlite` (the default) or `postgres`."""
    value = os.environ.get(ENV, "sqlite").strip().lower() or "sqlite"
    if value not in BACKENDS:
        raise ValueError(f"{ENV}: expected sqlite or postgres, got {value!r}")
    return value


def settings(env: dict[str, str], *, backend: str | None = None) -> Settings:
    """Settings from `env` (it names AGENTQ_HOME) on a fresh migrated database of this
    run's backend (or `backend`)."""
    kind = backend or _run_backend()
    env = dict(env)
    if kind == "postgres" and not env.get("AGENTQ_DATABASE_URL"):
        env["AGENTQ_DATABASE_URL"] = _postgres_for(env["AGENTQ_HOME"])
        return Settings.from_env(env)
    return upgrade(Settings.from_env(env))


def upgrade(settings: Settings) -> Settings:
    """`migrate.upgrade(settings)`, by copying the template when `settings` names a SQLite
    file that does not exist yet (any other database is migrated as usual)."""
    url = settings.database_url
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else ""
    if not path or path == ":memory:" or Path(path).exists():
        migrate.upgrade(settings)
        return settings
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(_sqlite_template_file())
    target = sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    return settings


def drop_made() -> None:
    """Drop the Postgres databases made since the last call (the end of a test)."""
    with _lock:
        names = [url.rsplit("/", 1)[1] for url in _made.values()]
        _made.clear()
    if names:
        from tests.support.stack import drop_database
        for name in names:
            drop_database(name)


def drop_templates() -> None:
    """Drop this process's Postgres template (the end of the session: the suite's server
    stops after it)."""
    global _pg_template
    drop_made()
    with _lock:
        name, _pg_template = _pg_template, None
    if name is not None:
        from tests.support.stack import drop_database
        drop_database(name)


def _sqlite_template_file() -> Path:
    global _sqlite_template
    with _lock:
        if _sqlite_template is None or not _sqlite_template.exists():
            home = Path(tempfile.mkdtemp(prefix="agentq-test-template-"))
            made = Settings.from_env({"AGENTQ_HOME": str(home)})
            migrate.upgrade(made)
            _sqlite_template = Path(made.database_url.removeprefix("sqlite:///"))
            atexit.register(shutil.rmtree, home, True)
        return _sqlite_template


def _postgres_for(home: str) -> str:
    """The URL of the database made for `home` in this test: a copy of the migrated
    template (made first, once a process)."""
    from tests.support.stack import create_database, create_empty_database
    global _pg_template
    with _lock:
        if home not in _made:
            if _pg_template is None:
                _pg_template = f"agentq_unit_template_{os.getpid()}"
                create_database(_pg_template)
            name = f"agentq_unit_{os.getpid()}_{next(_names)}"
            _made[home] = create_empty_database(name, template=_pg_template)
        return _made[home]
