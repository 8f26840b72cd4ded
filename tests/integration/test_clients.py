"""Clients of running jobs through HTTP: busy conversations, cancel, events, idempotency."""
from __future__ import annotations

import json
import threading
import uuid

import pytest
from sqlalchemy import func, select

from agentq.models import TokenLog, ToolCall
from agentq.testing.scripted_llm import call, held, text, tool_calls
from tests.support.api import uid, wait_until

pytestmark = pytest.mark.integration



def status_of(client, job_id):
    return client.get(f"/v1/jobs/{job_id}").json()["status"]


def history(client, conversation_id):
    return client.get(f"/v1/conversations/{conversation_id}/messages").json()["data"]


def no_orphan_tool_calls(messages):
    calls = {json.loads(m["content"])["tool_use_id"] for m in messages if m["role"] == "tool_call"}
    results = {json.loads(m["content"])["tool_use_id"] for m in messages
               if m["role"] == "tool_result"}
    return calls == results


def test_queue_runs_the_second_message_after_the_first_in_order(client, script, gate):
    user, channel = uid("u"), uid("c")
    def sees_first_answer(request):
        contents = [m.get("content") for m in request["messages"]]
        assert "first answer" in contents and contents[-1].endswith("second")
    marker = script([text("first answer", hold=gate),
                     text("second answer", check=sees_first_answer)])
    first = client.submit(f"{marker} first", user=user, channel=channel)
    wait_until(lambda: status_of(client, first["id"]) == "running", timeout_s=120)
    second = client.submit(f"{marker} second", user=user, channel=channel, on_busy="queue")
    assert second["id"] != first["id"] and second["status"] == "queued"
    assert status_of(client, second["id"]) == "queued"
    gate.set()
    a, b = client.wait(first["id"]), client.wait(second["id"])
    assert a["response"]["content"] == "first answer"
    assert b["response"]["content"] == "second answer"
    assert b["started_at"] >= a["finished_at"]


def test_steer_reaches_the_model_before_its_next_decision(client, script, tool_gate):
    user, channel = uid("u"), uid("c")
    def sees_steering(request):
        users = [m["content"] for m in request["messages"] if m["role"] == "user"]
        assert users[-1] == "actually, use metric units"
        assert request["messages"][-1]["role"] == "user"
    marker = script([tool_calls(call("flaky.gated", tool_gate.args())),
                     text("Metric it is.", check=sees_steering)])
    job = client.submit(f"{marker} convert", user=user, channel=channel)
    tool_gate.wait_started()  # the tool runs until the steering is in
    steered = client.submit("actually, use metric units", user=user, channel=channel,
                            on_busy="steer")
    assert steered["id"] == job["id"]
    tool_gate.open()
    done = client.wait(job["id"])
    assert done["status"] == "completed" and done["response"]["content"] == "Metric it is."
    types = [e["type"] for e in client.events(job["id"])]
    assert types.index("steering_injected") < types.index("job_end")


def test_interrupt_cancels_the_running_job_cleanly_and_starts_the_new_one(client, script,
                                                                          tool_gate):
    user, channel = uid("u"), uid("c")
    marker = script([tool_calls(call("flaky.gated", tool_gate.args()),
                                call("flaky.gated", tool_gate.args())),
                     text("new answer")])
    old = client.submit(f"{marker} long task", user=user, channel=channel)
    tool_gate.wait_started()  # the old job is inside its tool calls when interrupted
    new = client.submit(f"{marker} never mind", user=user, channel=channel,
                        on_busy="interrupt")
    assert new["id"] != old["id"]
    tool_gate.open()
    ended, answered = client.wait(old["id"]), client.wait(new["id"])
    assert ended["status"] == "cancelled" and ended["finish_reason"] == "cancelled"
    assert answered["status"] == "completed" and answered["response"]["content"] == "new answer"
    assert no_orphan_tool_calls(history(client, old["conversation_id"]))


def test_reject_answers_409_naming_the_running_job(client, script, gate):
    user, channel = uid("u"), uid("c")
    marker = script([text("slow", hold=gate)])
    job = client.submit(f"{marker} go", user=user, channel=channel)
    response = client.post("/v1/messages", json={
        "platform": "api", "platform_user_id": user, "platform_channel_id": channel,
        "content": "again", "on_busy": "reject"})
    assert response.status_code == 409
    assert response.json()["error"]["details"]["job_id"] == job["id"]
    gate.set()
    client.wait(job["id"])


def test_cancel_mid_llm_call_aborts_it_and_bills_nothing(client, script, stack, gate):
    marker = script([held(tool_calls(call("math.evaluate", {"expression": "1+1"})), gate)])
    job = client.submit(f"{marker} go")
    wait_until(lambda: status_of(client, job["id"]) == "running", timeout_s=120)
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    # the call in flight is aborted (issue 31): the job ends while the model still holds it
    ended = client.wait(job["id"])
    gate.set()
    assert ended["status"] == "cancelled"
    with stack.sessions()() as s:
        logs = s.execute(select(func.count()).select_from(TokenLog).where(
            TokenLog.job_id == uuid.UUID(job["id"]))).scalar_one()
        calls = s.execute(select(func.count()).select_from(ToolCall).where(
            ToolCall.job_id == uuid.UUID(job["id"]))).scalar_one()
    # no reply came back, so nothing is billed and none of its calls ran
    assert logs == 0 and calls == 0
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 409


def test_cancel_mid_tool_batch_answers_every_call(client, script, tool_gate):
    marker = script([tool_calls(call("flaky.gated", tool_gate.args()),
                                call("math.evaluate", {"expression": "2"}))])
    job = client.submit(f"{marker} go")
    tool_gate.wait_started()  # cancelled while a call of the batch runs
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    tool_gate.open()
    ended = client.wait(job["id"])
    assert ended["status"] == "cancelled"
    assert no_orphan_tool_calls(history(client, ended["conversation_id"]))


def test_cancelling_a_queued_follow_up_removes_it(client, script, gate):
    user, channel = uid("u"), uid("c")
    marker = script([text("one", hold=gate), text("three")])
    first = client.submit(f"{marker} one", user=user, channel=channel)
    second = client.submit(f"{marker} two", user=user, channel=channel)
    third = client.submit(f"{marker} three", user=user, channel=channel)
    assert client.post(f"/v1/jobs/{second['id']}/cancel").status_code == 202
    assert status_of(client, second["id"]) == "cancelled"
    gate.set()
    assert client.wait(first["id"])["status"] == "completed"
    assert client.wait(third["id"])["response"]["content"] == "three"


def read_sse(client, job_id, last_event_id=None):
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    events = []
    with client.http.get(client.url(f"/v1/jobs/{job_id}/events"), headers=headers,
                         stream=True, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        current = {}
        for line in response.iter_lines(decode_unicode=True):
            if line.startswith("id: "):
                current["id"] = int(line[4:])
            elif line.startswith("event: "):
                current["event"] = line[7:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
            elif line == "" and current:
                events.append(current)
                current = {}
    return events


def test_events_stream_until_job_end_and_resume_after_last_event_id(client, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "3*3"}), delay_s=0.5),
                     text("nine", delay_s=0.5)])
    job = client.submit(f"{marker} go")
    live = read_sse(client, job["id"])
    assert live[-1]["event"] == "job_end"
    assert [e["id"] for e in live] == list(range(1, len(live) + 1))
    resumed = read_sse(client, job["id"], last_event_id=live[2]["id"])
    assert [e["id"] for e in resumed] == [e["id"] for e in live[3:]]


def test_idempotency_under_concurrent_duplicates(client, script, stack):
    marker = script([text("once")])
    body = {"platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
            "content": f"{marker} hello"}
    key = uid("idem")
    answers = []

    def post():
        answers.append(client.http.post(client.url("/v1/messages"), json=body, timeout=30,
                                        headers={"Idempotency-Key": key}))
    threads = [threading.Thread(target=post) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {r.status_code for r in answers} == {202}
    assert len({r.json()["id"] for r in answers}) == 1
    client.wait(answers[0].json()["id"])
    other = client.post("/v1/messages", json={**body, "content": "different"},
                        headers={"Idempotency-Key": key})
    assert other.status_code == 422


def _waited(client, response) -> dict:
    """The job a `?wait=` answer names, once ended: 200 holds the ended job; 202 (the wait ran
    out first, as on a loaded machine) a live one, polled until it ends."""
    assert response.status_code in (200, 202), response.text
    job = response.json()
    if response.status_code == 200:
        assert job["status"] in ("completed", "failed", "cancelled")
        return job
    return client.wait(job["id"])


def test_wait_on_submit_and_continue_and_embed(client, script):
    marker = script([text("first"), text("continued")])
    submitted = _waited(client, client.post("/v1/messages", params={"wait": 20}, json={
        "platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
        "content": f"{marker} hi"}))
    assert submitted["status"] == "completed"
    conversation_id = submitted["conversation_id"]
    cont = _waited(client, client.post("/v1/continue", params={"wait": 20},
                                       json={"conversation_id": conversation_id,
                                             "content": f"{marker} background job done"}))
    assert cont["response"]["content"] == "continued"
    assert cont["conversation_id"] == conversation_id
    missing = client.post("/v1/continue", json={"conversation_id": str(uuid.uuid4()),
                                                "content": "x"})
    assert missing.status_code == 404
    embedding = client.post("/v1/embed", json={"text": "hello"})
    assert embedding.status_code == 200 and len(embedding.json()["embedding"]) == 16
