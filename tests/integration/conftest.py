"""Integration fixtures: a fresh Postgres database migrated by Alembic, a Redis broker, the
real API (gunicorn) and real Celery workers on their queues, and a scripted
OpenAI-compatible server that the real `openai` SDK in the workers talks to.

Postgres and Redis must answer on 127.0.0.1 (`.ci/run` starts them). Outside CI, when they
do not, these tests are skipped with a message; under CI=true they fail.
"""
from __future__ import annotations

import os
import time
import uuid

import pytest
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from tests.support.scripted_llm import ScriptedLLM
from tests.support.stack import (REDIS_URL, Stack, StackError, answers, create_database,
                                 drop_database, flush_redis)

__all__ = ["REDIS_URL", "uid"]

JOB_TIMEOUT_S = 30
TEST_ENV = {
    "AGENTQ_MODEL": "primary-model", "AGENTQ_FALLBACK_MODELS": "fallback-model",
    "AGENTQ_LLM_RETRIES": "2", "AGENTQ_LLM_RETRY_BASE_S": "0.01",
    "AGENTQ_LLM_RETRY_MAX_S": "0.05", "AGENTQ_LLM_TIMEOUT_S": "5",
    "AGENTQ_STEP_DEADLINE_S": "4", "AGENTQ_SWEEP_INTERVAL_S": "1",
    "AGENTQ_TOOL_PACKAGES": "tool_workers,tests.support.testtools",
    "AGENTQ_DEFAULT_MODULES": "math,time,files,code,flaky",
    "AGENTQ_SLOW_MODULES": "code", "AGENTQ_ORCHESTRATOR_CONCURRENCY": "20",
    "AGENTQ_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "AGENTQ_WEBHOOK_ALLOW_PRIVATE": "1",
    "AGENTQ_WEBHOOK_RETRY_SCHEDULE_S": "0.5,0.5,0.5",
}


@pytest.fixture(scope="session")
def servers_up():
    missing = [name for name, port in (("PostgreSQL", 5432), ("Redis", 6379))
               if not answers("127.0.0.1", port)]
    if missing:
        message = f"{' and '.join(missing)} not answering on 127.0.0.1"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message + " (run .ci/run, which starts them)")


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


class Client:
    """The API through HTTP, as a user sees it."""

    def __init__(self, stack: Stack, key: str):
        self.stack = stack
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {key}"
        # gunicorn closes an idle keep-alive connection after 2 s; a GET sent on it just as
        # it closes is retried once on a new connection, as any HTTP client should (never
        # a POST: it is not idempotent)
        retry = Retry(total=1, connect=1, read=1, status=0, allowed_methods={"GET"},
                      raise_on_status=False)
        self.http.mount("http://", HTTPAdapter(max_retries=retry))

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
    return stack.create_key("integration", admin=True)


@pytest.fixture()
def client(stack, admin_key) -> Client:
    return Client(stack, admin_key)


@pytest.fixture()
def script(llm, request):
    """A fresh script key for this test; the test's LLM calls must all be consumed."""
    key = uid("s").replace("-", "_")
    yield lambda replies: llm.script(key, replies)
    llm.assert_done(key)
