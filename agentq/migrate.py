"""Run the Alembic history: `agentq db upgrade` and the tests' schema both come from here."""
from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from agentq.config import Settings, get_settings

SCRIPT_LOCATION = Path(migrations.__file__).resolve().parent


def alembic_config(settings: Settings | None = None) -> Config:
    settings = settings or get_settings()
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    cfg.set_main_option("sqlalchemy.url", settings.database_url.replace("%", "%%"))
    cfg.set_main_option("file_template", "%%(year)d%%(month).2d%%(day).2d_%%(rev)s_%%(slug)s")
    return cfg


def upgrade(settings: Settings | None = None, revision: str = "head") -> None:
    settings = settings or get_settings()
    if settings.database_url.startswith("sqlite:///"):
        path = settings.database_url.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings), revision)


def create_database_if_missing(settings: Settings | None = None) -> str | None:
    """A Postgres database named by the URL that does not exist yet is created (through the
    server's `postgres` database, as the URL's user); returns its name when it was made."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    settings = settings or get_settings()
    url = make_url(settings.database_url)
    if url.get_backend_name() != "postgresql" or not url.database:
        return None
    engine = create_engine(url, poolclass=_null_pool())
    try:
        with engine.connect():
            return None
    except OperationalError as exc:
        if "does not exist" not in str(exc.orig):
            raise
    finally:
        engine.dispose()
    admin = create_engine(url.set(database="postgres"), poolclass=_null_pool(),
                          isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            name = url.database.replace('"', '""')
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return url.database


def _null_pool():
    from sqlalchemy.pool import NullPool
    return NullPool


def downgrade(settings: Settings | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(settings), revision)


def revision(message: str, settings: Settings | None = None) -> None:
    command.revision(alembic_config(settings), message=message, autogenerate=True)
