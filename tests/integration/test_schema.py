"""The Alembic history builds exactly the schema the models describe, and goes both ways."""
from __future__ import annotations

import os

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from agentq import migrate
from agentq.config import Settings
from agentq.models import Base
from tests.support.stack import create_database, drop_database

pytestmark = pytest.mark.integration


def test_migrations_match_the_models_and_round_trip(servers_up):
    name = f"agentq_schema_{os.getpid()}"
    url = create_database(name)
    try:
        settings = Settings.from_env({"AGENTQ_DATABASE_URL": url})
        migrate.downgrade(settings, "base")
        migrate.upgrade(settings)
        engine = create_engine(settings.database_url)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(
                conn, opts={"compare_type": True}), Base.metadata)
        engine.dispose()
        assert diff == []
    finally:
        drop_database(name)


def test_sqlite_embedded_schema_round_trips(tmp_path):
    settings = Settings.from_env({"AGENTQ_HOME": str(tmp_path)})
    migrate.upgrade(settings)
    migrate.downgrade(settings, "base")
    migrate.upgrade(settings)
    assert (tmp_path / "agentq.db").exists()
