"""Any Postgres URL a user would write runs on psycopg2, the driver agentq installs."""
from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from agentq.config import Settings
from agentq.config.urls import libpq_url, normalize_database_url


@pytest.mark.parametrize("url", [
    "postgresql://u:p@db.example:5432/agentq",
    "postgres://u:p@db.example:5432/agentq",
    "postgresql+psycopg://u:p@db.example:5432/agentq",
    "postgresql+psycopg2://u:p@db.example:5432/agentq",
    "POSTGRES://u:p@db.example:5432/agentq",
])
def test_every_postgres_spelling_resolves_to_psycopg2(url):
    settings = Settings.from_env({"AGENTQ_DATABASE_URL": url})
    assert settings.database_url == "postgresql+psycopg2://u:p@db.example:5432/agentq"
    # SQLAlchemy loads the dialect and driver from the URL: psycopg2 must be what it picks
    engine = create_engine(settings.database_url)
    assert engine.dialect.driver == "psycopg2"
    engine.dispose()


def test_other_urls_are_left_alone(tmp_path):
    assert normalize_database_url("sqlite:///x.db") == "sqlite:///x.db"
    default = Settings.from_env({"AGENTQ_HOME": str(tmp_path)}).database_url
    assert default == f"sqlite:///{tmp_path / 'agentq.db'}"


def test_libpq_form_drops_the_driver():
    assert libpq_url("postgres://a@h/d") == "postgresql://a@h/d"
    assert libpq_url("postgresql+psycopg2://a@h/d?sslmode=require") == \
        "postgresql://a@h/d?sslmode=require"
