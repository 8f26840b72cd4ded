"""Batches and replay through HTTP with real workers."""
from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select

from agentq.models import Job
from agentq.testing.scripted_llm import call, error, text, tool_calls

pytestmark = pytest.mark.integration
LINE = re.compile(r"echo-(\w+) line (\d+)")


class Echo:
    """Answers any request whose last user message reads `echo-<tag> line <n>`."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.delay_s = 0.0
        self.free = None
        """When set, only this many requests are answered at once; the rest wait for `gate`."""
        self.gate = threading.Event()
        self._answered = itertools.count()

    def __str__(self) -> str:
        return self.tag

    def __call__(self, request):
        users = [m.get("content") or "" for m in request["messages"] if m["role"] == "user"]
        match = LINE.search(users[-1]) if users else None
        if match and match.group(1) == self.tag:
            held = self.free is not None and next(self._answered) >= self.free
            return text(f"answer {match.group(2)}", delay_s=self.delay_s,
                        hold=self.gate if held else None)
        return None


@pytest.fixture()
def echo(llm):
    responder = Echo()
    llm.responder = responder
    yield responder
    responder.gate.set()  # nothing stays held past the test
    llm.responder = None


def lines(tag, n, **extra):
    return [{"platform": "api", "platform_user_id": f"bu-{tag}-{i % 7}",
             "platform_channel_id": f"bc-{tag}-{i}", "content": f"echo-{tag} line {i}",
             "custom_id": f"l-{i}", **extra} for i in range(n)]


def post_jsonl(client, rows, **params):
    body = "\n".join(json.dumps(r) for r in rows) + "\n"
    return client.post("/v1/batches", data=body, params=params,
                       headers={"Content-Type": "application/x-ndjson"})


def wait_batch(client, batch_id, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.get(f"/v1/batches/{batch_id}").json()
        if batch["status"] in ("completed", "cancelled"):
            return batch
        time.sleep(0.25)
    raise AssertionError(f"batch did not end: {batch}")


def results(client, batch_id):
    response = client.get(f"/v1/batches/{batch_id}/results")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def test_jsonl_batch_runs_to_ordered_results(client, echo):
    created = post_jsonl(client, lines(echo, 200))
    assert created.status_code == 202, created.text
    assert created.json()["counts"]["total"] == 200
    batch = wait_batch(client, created.json()["id"])
    assert batch["status"] == "completed" and batch["counts"]["completed"] == 200
    rows = results(client, batch["id"])
    assert [r["custom_id"] for r in rows] == [f"l-{i}" for i in range(200)]
    assert [r["response"]["content"] for r in rows] == [f"answer {i}" for i in range(200)]
    assert {r["batch_id"] for r in rows} == {batch["id"]}


def test_a_bad_line_rejects_the_whole_batch(client, stack, echo):
    rows = lines(echo, 5)
    del rows[2]["content"]
    response = post_jsonl(client, rows)
    assert response.status_code == 422
    details = response.json()["error"]["details"]
    assert details["line"] == 3 and "content" in details["fields"]
    with stack.sessions()() as s:
        made = s.execute(select(func.count()).select_from(Job).where(
            Job.content.like(f"echo-{echo} %"))).scalar_one()
    assert made == 0


def test_lines_sharing_a_conversation_run_in_request_order(client, echo, llm):
    rows = [{"platform": "api", "platform_user_id": f"same-{echo}",
             "platform_channel_id": f"same-{echo}", "content": f"echo-{echo} line {i}"}
            for i in range(5)]
    batch = wait_batch(client, client.post("/v1/batches", json={"requests": rows}).json()["id"])
    ordered = results(client, batch["id"])
    history = client.get(f"/v1/conversations/{ordered[0]['conversation_id']}/messages").json()
    users = [m["content"] for m in history["data"] if m["role"] == "user"]
    assert users == [f"echo-{echo} line {i}" for i in range(5)]


def test_cancel_half_way_keeps_finished_jobs(client, echo):
    # given a batch of 30 whose model answers 4 requests, then holds the rest until told
    echo.free = 4
    created = client.post("/v1/batches", json={"requests": lines(echo, 30),
                                                "max_concurrency": 2})
    batch_id = created.json()["id"]
    while client.get(f"/v1/batches/{batch_id}").json()["counts"]["completed"] < 4:
        time.sleep(0.1)  # never: the test's timeout
    # when it is cancelled while at most 2 jobs wait on the model
    assert client.post(f"/v1/batches/{batch_id}/cancel").status_code == 202
    echo.gate.set()  # the held replies come back after the cancel
    batch = wait_batch(client, batch_id)
    # then the 4 finished jobs keep their results and no other job completes
    counts = batch["counts"]
    assert batch["status"] == "cancelled"
    assert counts["completed"] == 4 and counts["cancelled"] + counts["failed"] == 26
    assert counts["total"] == 30
    finished = [r for r in results(client, batch_id) if r["status"] == "completed"]
    assert sorted(r["response"]["content"] for r in finished) == sorted(
        f"answer {r['custom_id'][2:]}" for r in finished)
    assert client.post(f"/v1/batches/{batch_id}/cancel").status_code == 409


def test_a_chat_message_is_not_queued_behind_a_big_batch(client, echo, script):
    created = post_jsonl(client, lines(echo, 2000))
    assert created.status_code == 202, created.text
    batch_id = created.json()["id"]
    marker = script([text("chat answer")])
    chat = client.submit(f"{marker} hello")
    answered = client.wait(chat["id"], timeout_s=60)
    batch = client.get(f"/v1/batches/{batch_id}").json()
    assert answered["status"] == "completed"
    assert batch["status"] == "running" and batch["counts"]["completed"] < 2000
    client.post(f"/v1/batches/{batch_id}/cancel")
    wait_batch(client, batch_id)


def test_recorded_replay_calls_no_provider_and_matches(client, script, llm):
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("It is 42.")])
    original = client.wait(client.submit(f"{marker} what is 6*7")["id"])
    key = marker.split(":")[1]
    calls_before = len(llm.requests(key))
    replayed = client.post(f"/v1/jobs/{original['id']}/replay", json={"mode": "recorded"})
    assert replayed.status_code == 202 and replayed.json()["replay_of"] == original["id"]
    job = client.wait(replayed.json()["id"])
    assert job["status"] == "completed" and job["response"]["content"] == "It is 42."
    assert job["conversation_id"] != original["conversation_id"]
    assert len(llm.requests(key)) == calls_before
    compared = client.get(f"/v1/jobs/{job['id']}/compare").json()
    assert compared["same_answer"] and compared["same_tool_calls"]
    assert "replay_diverged" not in [e["type"] for e in client.events(job["id"])]
    assert client.get(f"/v1/jobs/{original['id']}").json() == original


def test_recorded_replay_notes_a_changed_tool_result(client, script):
    marker = script([tool_calls(call("time.now", {"timezone": "UTC"})), text("noted")])
    original = client.wait(client.submit(f"{marker} what time")["id"])
    time.sleep(0.01)
    job = client.wait(client.post(f"/v1/jobs/{original['id']}/replay",
                                  json={"mode": "recorded"}).json()["id"])
    diverged = [e for e in client.events(job["id"]) if e["type"] == "replay_diverged"]
    assert job["status"] == "completed" and job["response"]["content"] == "noted"
    assert diverged and diverged[0]["data"]["tool"] == "time.now"
    assert diverged[0]["data"]["turn"] == 1


def test_live_replay_on_another_model(client, script):
    marker = script([text("from primary"), text("from other", expect_model="other-model")])
    original = client.wait(client.submit(f"{marker} hi")["id"])
    job = client.wait(client.post(f"/v1/jobs/{original['id']}/replay",
                                  json={"mode": "live", "model": "other-model"}).json()["id"])
    assert job["response"]["content"] == "from other"
    compared = client.get(f"/v1/jobs/{job['id']}/compare").json()
    assert compared["original"]["content"] == "from primary"
    assert compared["replay"]["content"] == "from other" and not compared["same_answer"]


def test_bulk_replay_of_the_failed_jobs_of_a_window(client, script):
    since = datetime.now(timezone.utc).isoformat()
    marker = script([error(400), error(400), error(400), error(400),
                     text("second try"), text("second try")])
    # a platform of this test's own: a job of an earlier test that fails in the window
    # (this process's stack is shared by its test files) is not this test's to replay
    platform = f"bulk-{uuid.uuid4().hex[:8]}"
    failed = [client.wait(client.submit(f"{marker} {i}", platform=platform)["id"])
              for i in range(2)]
    assert {j["status"] for j in failed} == {"failed"}
    created = client.post("/v1/batches/replay", json={
        "filter": {"status": "failed", "since": since, "platform": platform}, "mode": "live"})
    assert created.status_code == 202, created.text
    assert created.json()["metadata"]["matched"] == 2
    batch = wait_batch(client, created.json()["id"])
    rows = results(client, batch["id"])
    assert sorted(r["replay_of"] for r in rows) == sorted(j["id"] for j in failed)
    assert {r["response"]["content"] for r in rows} == {"second try"}
