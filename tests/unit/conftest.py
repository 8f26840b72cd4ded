"""Unit tests run without a broker: every unit of work hands its effects to an in-process
runner (`agentq.runner`). By default it only records them; a test that drives a job
installs one with a stepper (`make`: `agentq.testing.harness.Harness`).

Their databases are the test's own (tests/support/unit_db.py): SQLite, or Postgres with
AGENTQ_UNIT_DB=postgres. `make_pg` makes harnesses on Postgres whatever that says, for the
tests of what only Postgres does (SKIP LOCKED, the claim's compare-and-set, prepared
statements); those share one database a test module (`pg_url`), each test's harness
cancelling the jobs earlier tests left running."""
from __future__ import annotations

import os

import pytest
from sqlalchemy import update

from agentq.db import dispose_engines
from agentq.models import Job
from agentq.runner import InProcessRunner
from agentq.testing.harness import Harness, ScriptedModel
from agentq.tools.registry import discover
from tests.support import unit_db
from tests.support.stack import create_database, drop_database


@pytest.fixture(autouse=True)
def effects():
    """The effects this test's units of work committed (`effects.sent`)."""
    with InProcessRunner().installed() as runner:
        yield runner


@pytest.fixture(autouse=True)
def _quotas_read_afresh():
    """Each test reads its tenants' quotas from its own database: the per-process cache
    (agentq.tenants.cached_quotas, 5 s) is keyed by tenant id, and the default tenant has
    the same id in every test's database."""
    from agentq.tenants import forget_cached_quotas
    forget_cached_quotas()
    yield
    forget_cached_quotas()


@pytest.fixture(autouse=True)
def _engines():
    """Each test's engines are closed after it, and the Postgres databases it made (with
    AGENTQ_UNIT_DB=postgres) dropped."""
    yield
    dispose_engines()
    unit_db.drop_made()


@pytest.fixture(scope="session", autouse=True)
def _templates():
    """The Postgres template of this test process is dropped at the end of the session."""
    yield
    unit_db.drop_templates()


@pytest.fixture(scope="session")
def modules():
    """agentq's own tool modules (tool_workers)."""
    return discover()


@pytest.fixture
def make(tmp_path, modules):
    """A harness per call, on this test's database (one per test, whatever the calls'
    settings); at teardown every scripted reply must have been asked for (a test states
    exactly the conversation it expects)."""
    made: list[Harness] = []

    def factory(*replies, forever=None, **env) -> Harness:
        settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), **env})
        made.append(Harness(settings, modules, ScriptedModel(*replies, forever=forever)))
        return made[-1]
    yield factory
    for harness in made:
        harness.router.assert_done()


@pytest.fixture(scope="module")
def pg_url(servers_up):
    """A migrated Postgres database for this test module."""
    name = f"agentq_unit_pg_{os.getpid()}"
    yield create_database(name)
    drop_database(name)


@pytest.fixture
def make_pg(tmp_path, pg_url, modules):
    """Harnesses on Postgres always (the module's database: `pg_url`), a step deadline of
    10 s; jobs earlier tests left queued or running are cancelled first, so each test sees
    only its own. Unlike `make`, replies may be left over: these tests stop a job midway
    (a claim, a crash) and look at its rows."""
    def factory(*replies, **env) -> Harness:
        settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), "AGENTQ_DATABASE_URL": pg_url,
                                     "AGENTQ_STEP_DEADLINE_S": "10", **env})
        h = Harness(settings, modules, ScriptedModel(*replies))
        with h.sessions() as session, session.begin():
            session.execute(update(Job).where(Job.status.in_(("queued", "running")))
                            .values(status="cancelled"))
        return h
    return factory
