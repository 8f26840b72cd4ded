"""A job accepted while the broker is away starts within seconds of its return.

With Redis unreachable, `POST /v1/messages` still answers 202 (the job is in Postgres) but
its first step cannot be sent. The job was left to the sweeper, which waits out a step
deadline (300 s by default) before it re-drives a job: the jobs of a short outage started
4 min 13 s after Redis was back. Now a step that was not sent marks its job due, and the
first sweep after the broker's return (AGENTQ_SWEEP_INTERVAL_S) sends it.

The stack here has its own Redis (killed and started again on the same port) and the
default 300 s step deadline, so a job that waited for the deadline would fail the test."""
from __future__ import annotations

import os
import time

import pytest

from agentq.testing.scripted_llm import text
from tests.support.api import TEST_ENV, Client, uid
from tests.support.services import PrivateRedis
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration
STARTED_WITHIN_S = 60
"""From the broker's return to the job's answer: a sweep interval (1 s here), the workers'
reconnection, one model call; far below the 300 s step deadline."""


@pytest.fixture(scope="module")
def outage_stack(servers_up, llm, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("broker-away")
    redis = PrivateRedis(scratch).start()
    env = {**TEST_ENV, "AGENTQ_STEP_DEADLINE_S": "300", "AGENTQ_SWEEP_INTERVAL_S": "1"}
    try:
        with own_stack("broker_away", llm.base_url, scratch, env, beat=True,
                       broker_url=redis.url) as stack:
            yield stack, redis, Client(stack, stack.create_key("away", admin=True))
    finally:
        redis.stop()


def test_a_job_accepted_while_redis_is_away_starts_soon_after_it_is_back(outage_stack,
                                                                         script):
    stack, redis, client = outage_stack
    marker = script([text("back again")])
    redis.kill()  # the broker (and the results backend) gone
    try:
        submitted = client.post("/v1/messages", json={
            "platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
            "content": f"{marker} hello"})
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
    finally:
        redis.start()  # the same port: every process finds it again
    back = time.monotonic()
    job = client.wait(job_id, timeout_s=STARTED_WITHIN_S)
    assert job["status"] == "completed", job
    assert job["response"]["content"] == "back again"
    assert time.monotonic() - back < STARTED_WITHIN_S


def test_submit_wait_says_the_broker_is_unreachable_and_follows_the_job_to_its_answer(
        outage_stack, script):
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from tests.support.stack import ROOT
    stack, redis, client = outage_stack
    marker = script([text("answered after the outage")])
    key = client.http.headers["Authorization"].removeprefix("Bearer ")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTQ_", "OPENAI_"))}
    redis.kill()
    lines: list[str] = []
    try:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("agentq")), "submit", "--wait", "--url",
             stack.base, "--key", key, "--channel", uid("c"), "--timeout", "150",
             f"{marker} hello"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not any("unreachable" in line for line in lines):
            assert process.poll() is None, lines
            assert time.monotonic() < deadline, lines
            time.sleep(0.2)
    finally:
        redis.start()
    with process.stdout, process.stderr:
        out = process.stdout.read()
        process.wait(timeout=180)
        reader.join(timeout=10)
    told = [line for line in lines if "unreachable" in line]
    assert "the API's broker is unreachable (GET /health/ready)" in told[0], lines
    assert process.returncode == 0, lines
    assert out.strip() == "answered after the outage"
