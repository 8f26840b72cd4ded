"""Integration fixtures: a fresh Postgres database migrated by Alembic, a Redis broker, the
real API (gunicorn) and real Celery workers on their queues, and a scripted
OpenAI-compatible server that the real `openai` SDK in the workers talks to.

Postgres and Redis must answer on 127.0.0.1 (`.ci/run` starts them). Outside CI, when they
do not, these tests are skipped with a message; under CI=true they fail.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from tests.support.scripted_llm import ScriptedLLM

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = os.environ.get("AGENTQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AGENTQ_TEST_REDIS", "redis://127.0.0.1:6379/9")
READY_TIMEOUT_S = 60
JOB_TIMEOUT_S = 30


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def servers_up():
    missing = [name for name, port in (("PostgreSQL", 5432), ("Redis", 6379))
               if not _answers("127.0.0.1", port)]
    if missing:
        message = f"{' and '.join(missing)} not answering on 127.0.0.1"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message + " (run .ci/run, which starts them)")


@pytest.fixture(scope="session")
def database_url(servers_up):
    import psycopg2
    name = f"agentq_it_{os.getpid()}"
    admin = psycopg2.connect(PG_ADMIN_URL)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cur.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://")
    url = f"{url}/{name}"
    from agentq import migrate
    from agentq.config import Settings
    migrate.upgrade(Settings.from_env({"AGENTQ_DATABASE_URL": url}))
    yield url
    from agentq.db import dispose_engines
    dispose_engines()
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture(scope="session")
def llm():
    server = ScriptedLLM().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stack(database_url, llm, tmp_path_factory):
    """The Procfile's processes, configured for tests (short deadlines, tiny backoffs)."""
    import redis
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    client.close()
    scratch = tmp_path_factory.mktemp("stack")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTQ_", "OPENAI_"))}
    env.update({
        "AGENTQ_DATABASE_URL": database_url, "AGENTQ_BROKER_URL": REDIS_URL,
        "AGENTQ_HOME": str(scratch), "AGENTQ_TEST_SCRATCH": str(scratch),
        "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "sk-test",
        "AGENTQ_MODEL": "primary-model", "AGENTQ_FALLBACK_MODELS": "fallback-model",
        "AGENTQ_LLM_RETRIES": "2", "AGENTQ_LLM_RETRY_BASE_S": "0.01",
        "AGENTQ_LLM_RETRY_MAX_S": "0.05", "AGENTQ_LLM_TIMEOUT_S": "5",
        "AGENTQ_STEP_DEADLINE_S": "4", "AGENTQ_SWEEP_INTERVAL_S": "1",
        "AGENTQ_TOOL_PACKAGES": "tool_workers,tests.support.testtools",
        "AGENTQ_DEFAULT_MODULES": "math,time,files,code,flaky",
        "AGENTQ_SLOW_MODULES": "code", "AGENTQ_ORCHESTRATOR_CONCURRENCY": "20",
        "AGENTQ_PUBLIC_URL": f"http://127.0.0.1:{port}", "PORT": str(port),
        "AGENTQ_LOG_LEVEL": "INFO", "PYTHONPATH": str(ROOT),
        "PYTHONWARNINGS": "ignore",
    })
    agentq = str(Path(sys.executable).with_name("agentq"))
    commands = {
        "web": [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}",
                "--workers", "1", "--threads", "16", "api.wsgi:app"],
        "orchestrator": [agentq, "worker", "orchestrator"],
        "tools": [agentq, "worker", "tools"],
        "tools-slow": [agentq, "worker", "tools-slow"],
        "maintenance": [agentq, "worker", "maintenance"],
        "beat": [agentq, "beat"],
    }
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    for name, cmd in commands.items():
        logs[name] = scratch / f"{name}.log"
        with logs[name].open("wb") as out:
            procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = {"orchestrator", "tools", "tools-slow", "maintenance"}
    while pending and time.monotonic() < deadline:
        pending = {n for n in pending if b" ready." not in logs[n].read_bytes()}
        for name, proc in procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited: {logs[name].read_text()[-3000:]}")
        time.sleep(0.2)
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{base}/health", timeout=1).ok:
                break
        except requests.ConnectionError:
            time.sleep(0.2)
    if pending:
        pytest.fail(f"not ready: {pending}")
    stack = Stack(base, env, procs, logs, database_url)
    yield stack
    for proc in procs.values():
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs.values():
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Stack:
    def __init__(self, base, env, procs, logs, database_url):
        self.base, self.env, self.procs, self.logs = base, env, procs, logs
        self.database_url = database_url

    def settings(self):
        from agentq.config import Settings
        return Settings.from_env(self.env)

    def sessions(self):
        from agentq.db import session_factory
        return session_factory(self.settings())

    def agentq(self, *args: str) -> subprocess.CompletedProcess:
        agentq = str(Path(sys.executable).with_name("agentq"))
        return subprocess.run([agentq, *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=60)


class Client:
    """The API through HTTP, as a user sees it."""

    def __init__(self, stack: Stack, key: str):
        self.stack = stack
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {key}"

    def url(self, path: str) -> str:
        return self.stack.base + path

    def post(self, path: str, **kw) -> requests.Response:
        return self.http.post(self.url(path), timeout=70, **kw)

    def get(self, path: str, **kw) -> requests.Response:
        return self.http.get(self.url(path), timeout=70, **kw)

    def submit(self, content: str, **fields) -> dict:
        body = {"platform": "api", "platform_user_id": fields.pop("user", uid("u")),
                "platform_channel_id": fields.pop("channel", uid("c")), "content": content,
                **fields}
        response = self.post("/v1/messages", json=body)
        assert response.status_code == 202, response.text
        return response.json()

    def wait(self, job_id: str, timeout_s: float = JOB_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            response = self.get(f"/v1/jobs/{job_id}", params={"wait": 5})
            assert response.status_code == 200, response.text
            job = response.json()
            if job["status"] in ("completed", "failed", "cancelled"):
                return job
        raise AssertionError(f"job {job_id} did not end within {timeout_s} s: {job}")

    def events(self, job_id: str) -> list[dict]:
        return self.get(f"/v1/jobs/{job_id}/events").json()["data"]


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def admin_key(stack) -> str:
    result = stack.agentq("keys", "create", "integration", "--admin")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture()
def client(stack, admin_key) -> Client:
    return Client(stack, admin_key)


@pytest.fixture()
def script(llm, request):
    """A fresh script key for this test; the test's LLM calls must all be consumed."""
    key = uid("s").replace("-", "_")
    yield lambda replies: llm.script(key, replies)
    llm.assert_done(key)
