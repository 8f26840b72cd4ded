"""agentq behind PgBouncer in transaction mode, with its defaults: statements are prepared on
their second run on a connection (AGENTQ_DB_PREPARE_THRESHOLD=2, the README says to set 0
behind such a pooler). A client connection's transactions move between PgBouncer's server
connections, where its prepared statements do not exist: each such connection fails one
statement as a database blip (an API answer 503, a task retried) and stops preparing
(agentq/prepared.py). What a user sees: every job completes, no answer is a 500, and a
well-behaved client (one that resends a 503 after Retry-After, a submit with its
Idempotency-Key) gets every answer. A step whose write failed that way asks the model again
(as after any database blip): the model here answers from the conversation, statelessly."""
from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests
from sqlalchemy.engine import make_url

from tests.integration.conftest import TEST_ENV, uid
from tests.support.scripted_llm import ScriptedLLM, react_responder
from tests.support.services import PgBouncer, require_pgbouncer
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration

JOBS = 12


@pytest.fixture(scope="module")
def pooled(servers_up, tmp_path_factory):
    require_pgbouncer()
    scratch = Path(tempfile.mkdtemp(prefix="agentq-pgbouncer-"))
    bouncer = PgBouncer(scratch, pool_size=3).start()
    llm = ScriptedLLM(responder=react_responder()).start()
    try:
        with own_stack("pgbouncer", llm.base_url, tmp_path_factory.mktemp("pgbouncer"),
                       TEST_ENV, beat=True,
                       database_via=lambda url: bouncer.url(make_url(url).database)) as stack:
            yield stack, stack.create_key("pgbouncer", admin=True)
    finally:
        llm.stop()
        bouncer.stop()
        shutil.rmtree(scratch, ignore_errors=True)


class PatientClient:
    """Resends a 503 after its Retry-After (a submit with the same Idempotency-Key), as the
    API asks; counts the 503s; any other answer but the expected one fails the test."""

    def __init__(self, base: str, key: str):
        self.base, self.unavailable = base, 0
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {key}"

    def _call(self, method: str, path: str, expected: int, **kw) -> dict:
        for _ in range(50):
            response = self.http.request(method, self.base + path, timeout=70, **kw)
            if response.status_code == 503:
                assert response.json()["error"]["code"] == "unavailable", response.text
                self.unavailable += 1
                time.sleep(min(float(response.headers["Retry-After"]), 2.0))
                continue
            assert response.status_code == expected, (response.status_code, response.text)
            return response.json()
        raise AssertionError(f"{method} {path}: 503 fifty times")

    def submit(self, content: str) -> str:
        return self._call("POST", "/v1/messages", 202, headers={
            "Idempotency-Key": str(uuid.uuid4())}, json={
            "platform": "api", "platform_user_id": uid("u"),
            "platform_channel_id": uid("c"), "content": content})["id"]

    def wait(self, job_id: str, timeout_s: float = 120) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self._call("GET", f"/v1/jobs/{job_id}", 200, params={"wait": 5})
            if job["status"] in ("completed", "failed", "cancelled"):
                return job
        raise AssertionError(f"job {job_id} did not end within {timeout_s} s")


def test_every_job_completes_behind_a_transaction_pooler_with_the_defaults(pooled):
    stack, key = pooled
    client = PatientClient(stack.base, key)
    ids = [client.submit("What is 6*7? Use the calculator.") for _ in range(JOBS)]
    jobs = [client.wait(job_id) for job_id in ids]
    assert [(j["status"], j["finish_reason"]) for j in jobs] == \
        [("completed", "end_turn")] * JOBS, jobs
    assert {j["response"]["content"] for j in jobs} == {"The answer is 42."}
    logs = "".join(path.read_text(errors="replace") for path in stack.logs.values())
    print(f"503s resent: {client.unavailable}; connections that stopped preparing: "
          f"{logs.count('preparing stops on it')}")
