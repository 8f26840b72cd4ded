"""What the tests that run the real stack share: the stack's test settings (`TEST_ENV`),
the API through HTTP as a user sees it (`Client`), `uid` and `wait_until`.

The fixtures themselves (`stack`, `client`, `script`, ...) are in tests/conftest.py, so
that tests/integration and tests/security share one stack per session; benchmarks import
the same client from here."""
from __future__ import annotations

import os
import time
import uuid

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from tests.support.stack import REDIS_URL, Stack

__all__ = ["REDIS_URL", "uid", "wait_until"]

JOB_TIMEOUT_S = 120  # only reached when a test fails: a loaded machine is slow, not wrong
TEST_ENV = {
    "AGENTQ_MODEL": "primary-model", "AGENTQ_FALLBACK_MODELS": "fallback-model",
    "AGENTQ_LLM_RETRIES": "2", "AGENTQ_LLM_RETRY_BASE_S": "0.01",
    "AGENTQ_LLM_RETRY_MAX_S": "0.05", "AGENTQ_LLM_TIMEOUT_S": "5",
    # a step's lease: renewed while the step works, a third of it before it runs out. At 4 s
    # a loaded machine (load average 20) was late with a renewal, the sweeper re-drove a
    # live step and the re-driven step asked the scripted model again (test_turn_events,
    # test_context_layers ended `waiting_provider`). 20 s leaves the renewal 6 s; a test of
    # a re-drive (a lost step message, a killed worker) waits one deadline longer.
    "AGENTQ_STEP_DEADLINE_S": "20", "AGENTQ_SWEEP_INTERVAL_S": "1",
    "AGENTQ_TOOL_PACKAGES": "tool_workers,tests.support.testtools",
    "AGENTQ_DEFAULT_MODULES": "math,time,files,code,flaky,memory",
    "AGENTQ_SLOW_MODULES": "code", "AGENTQ_ORCHESTRATOR_CONCURRENCY": "20",
    "AGENTQ_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "AGENTQ_WEBHOOK_ALLOW_PRIVATE": "1", "AGENTQ_ATTACHMENT_ALLOW_PRIVATE": "1",
    "AGENTQ_WEBHOOK_RETRY_SCHEDULE_S": "0.5,0.5,0.5",
    # a provider outage: jobs wait (short delays) for up to 15 minutes, longer than any test
    # waits on a loaded machine (the test of a wait that runs out has a stack of its own
    # with a short window: test_provider_outage.py); the circuit opens
    # after 15 transient failures within 5 s, for 1.5 s
    "AGENTQ_PROVIDER_WAIT_S": "900", "AGENTQ_PROVIDER_RETRY_BASE_S": "0.2",
    "AGENTQ_PROVIDER_RETRY_MAX_S": "1.5", "AGENTQ_PROVIDER_BREAKER_FAILURES": "15",
    "AGENTQ_PROVIDER_BREAKER_WINDOW_S": "5", "AGENTQ_PROVIDER_BREAKER_OPEN_S": "1.5",
    "AGENTQ_MODULE_ALLOW_PRIVATE": "1", "AGENTQ_MODULE_SYNC_S": "0.5",
    "AGENTQ_MODULE_RETRY_S": "1",
    # the suite drives its stack from one key faster than a client should (schemathesis, a
    # burst of submits): 1,000 requests a second per key (the default is 50); a tenant's own
    # rate is tested in test_web_front.py
    "AGENTQ_QUOTA_REQUESTS_PER_SECOND": "1000",
    # the code sandbox's cgroups as this machine allows (tests/conftest.py)
    "AGENTQ_SANDBOX_CGROUP": os.environ.get("AGENTQ_SANDBOX_CGROUP", "required"),
    # the suite on the orchestrator's other pool: AGENTQ_TEST_ORCHESTRATOR_POOL=gevent
    "AGENTQ_ORCHESTRATOR_POOL": os.environ.get("AGENTQ_TEST_ORCHESTRATOR_POOL", "threads"),
}


class Client:
    """The API through HTTP, as a user sees it."""

    def __init__(self, stack: Stack, key: str):
        self.stack = stack
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {key}"
        # gunicorn closes an idle keep-alive connection (AGENTQ_HEADER_TIMEOUT_S, 20 s, and
        # up to half again); a GET sent on it just as
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


def wait_until(predicate, timeout_s: float = 60, every_s: float = 0.1, what: str = ""):
    """The predicate's first truthy value; fails after `timeout_s` (an outcome to wait for,
    never a duration to assert)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"not met within {timeout_s} s: {what}")


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def own_events_start(types: list[str]) -> str:
    """The first of a job's event types that the job itself wrote: a job whose first step
    starts after the step deadline (a loaded machine; the tests' deadline is 20 s) is
    re-driven by the sweeper first, so `job_redriven` may come before `job_start`."""
    return [t for t in types if t != "job_redriven"][0]


def assert_one_tool_turn_told(client: "Client", job: dict) -> list[dict]:
    """A completed one-tool job's events (job_start once, the tool's start and end, job_end
    last) and its conversation (question, call, result, answer); returns the conversation's
    messages."""
    types = [e["type"] for e in client.events(job["id"])]
    assert own_events_start(types) == "job_start"
    assert types[-1] == "job_end" and types.count("job_start") == 1
    assert "tool_execution_start" in types and "tool_execution_end" in types
    history = client.get(f"/v1/conversations/{job['conversation_id']}/messages").json()["data"]
    assert [m["role"] for m in history] == ["user", "tool_call", "tool_result", "assistant"]
    return history
