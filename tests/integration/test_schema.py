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
from tests.support.stack import scratch_database

pytestmark = pytest.mark.integration


def test_migrations_match_the_models_and_round_trip(servers_up):
    with scratch_database(f"agentq_schema_{os.getpid()}") as settings:
        migrate.downgrade(settings, "base")
        migrate.upgrade(settings)
        engine = create_engine(settings.database_url)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(
                conn, opts={"compare_type": True}), Base.metadata)
        engine.dispose()
        assert diff == []


def test_sqlite_embedded_schema_round_trips(tmp_path):
    settings = Settings.from_env({"AGENTQ_HOME": str(tmp_path)})
    migrate.upgrade(settings)
    migrate.downgrade(settings, "base")
    migrate.upgrade(settings)
    assert (tmp_path / "agentq.db").exists()


def _events_across_0024(settings: Settings, disable_keys: str, job_id: str) -> None:
    """Three events written at 0023, the history taken up through 0024, down below it and
    up again: the events are kept each way, under the key of their revision."""
    from sqlalchemy import text
    migrate.upgrade(settings, "0023_tenant_context_layers")
    engine = create_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(disable_keys))  # the events' job is not the point here
            for seq in (1, 2, 3):
                conn.execute(text(
                    "INSERT INTO job_events (id, job_id, seq, type, data, created_at) VALUES "
                    "(:id, :job, :seq, 'turn_start', '{\"turn\": 1}', CURRENT_TIMESTAMP)"),
                    {"id": f"{seq:032x}", "job": job_id, "seq": seq})
        migrate.upgrade(settings)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT seq FROM job_events WHERE job_id = :job "
                                     "ORDER BY seq"), {"job": job_id}).scalars().all() == [1, 2, 3]
        migrate.downgrade(settings, "0023_tenant_context_layers")
        with engine.connect() as conn:
            ids = conn.execute(text("SELECT id FROM job_events")).scalars().all()
        assert len(ids) == len(set(ids)) == 3 and all(ids)  # each given an id of its own
        migrate.upgrade(settings)
    finally:
        engine.dispose()


def test_job_events_keep_their_rows_across_the_natural_key_migration(servers_up):
    with scratch_database(f"agentq_schema_events_{os.getpid()}", migrated=False) as settings:
        _events_across_0024(settings, "SET session_replication_role = replica",
                            "a8f3c5a0-0000-4000-8000-000000000001")


def test_job_events_keep_their_rows_across_the_natural_key_migration_on_sqlite(tmp_path):
    settings = Settings.from_env({"AGENTQ_HOME": str(tmp_path)})
    _events_across_0024(settings, "PRAGMA foreign_keys = OFF",
                        "a8f3c5a0000040008000000000000001")
