"""Events as seed 001 names them: message_start/message_end for user, steering and assistant
messages, turn_start.triggered_by, a turn_end for every turn (a failed model call too), and
follow-ups made from late steering that are visible before job_end."""
from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import select

from agentq.models import JobInput
from agentq.testing.scripted_llm import call, error, text, tool_calls
from tests.support.api import uid, wait_until

pytestmark = pytest.mark.integration


def _inputs(stack, job_id: str) -> list:
    """The steering stored for a job."""
    with stack.sessions()() as s:
        return s.execute(select(JobInput.id).where(
            JobInput.job_id == uuid.UUID(job_id))).all()


def _compact(events: list[dict]) -> list[tuple]:
    """(type, role or triggered_by) pairs, for comparing orders. A re-drive (the sweeper's,
    when a loaded machine is late renewing a step's lease) is recovery, not part
    of the order, and is left out."""
    out = []
    for e in events:
        if e["type"] == "job_redriven":
            continue
        d = e["data"]
        detail = d.get("triggered_by") or d.get("role") or ""
        out.append((e["type"], detail))
    return out


def test_a_tool_job_emits_the_seeds_events_in_order(client, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})), text("42")])
    job = client.wait(client.submit(f"{marker} what is 6*7?")["id"])
    assert job["status"] == "completed" and job["follow_up_job_id"] is None
    events = client.events(job["id"])
    assert _compact(events) == [
        ("job_start", ""),
        ("message_start", "user"), ("message_end", "user"),
        ("turn_start", "user"),
        ("message_start", "assistant"), ("message_end", "assistant"),
        ("tool_execution_start", ""), ("tool_execution_end", ""),
        ("turn_end", ""),
        ("turn_start", "continuation"),
        ("message_start", "assistant"), ("message_end", "assistant"),
        ("turn_end", ""),
        ("job_end", ""),
    ]
    question = events[1]["data"]
    assert question["kind"] == "question" and marker in question["content"]
    turn_starts = [e["data"]["turn"] for e in events if e["type"] == "turn_start"]
    turn_ends = [e["data"]["turn"] for e in events if e["type"] == "turn_end"]
    assert turn_starts == turn_ends == [1, 2]


def test_a_failed_model_call_still_ends_its_turn(client, script):
    # a 400 is not transient (a 5xx would park the job to wait for its provider):
    # the call fails at once, on each of the two models
    marker = script([error(400, "bad request"), error(400, "bad request")])
    job = client.wait(client.submit(f"{marker} go")["id"])
    assert (job["status"], job["finish_reason"]) == ("failed", "error")
    events = client.events(job["id"])
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["turn_end", "job_end"]
    assert events[-2]["data"]["turn"] == 1 and events[-2]["data"]["error"]["code"]
    assert kinds.count("turn_start") == kinds.count("turn_end") == 1


def test_steering_is_a_user_message_and_triggers_its_turn(client, script, tool_gate):
    user, channel = uid("u"), uid("c")
    marker = script([tool_calls(call("flaky.gated", tool_gate.args())), text("Metric.")])
    job = client.submit(f"{marker} convert", user=user, channel=channel)
    tool_gate.wait_started()  # the job's tool runs until the steering is in
    steered = client.submit("use metric units", user=user, channel=channel, on_busy="steer")
    assert steered["id"] == job["id"]
    assert steered["steering"]["status"] in ("queued", "injected")
    tool_gate.open()
    done = client.wait(job["id"])
    assert done["status"] == "completed"
    events = client.events(job["id"])
    steering = [e["data"] for e in events if e["type"] == "message_end"
                and e["data"].get("kind") == "steering"]
    assert steering == [{"role": "user", "kind": "steering", "content": "use metric units"}]
    second = [e["data"] for e in events if e["type"] == "turn_start"][1]
    assert second["triggered_by"] == "steering"


def test_late_steering_becomes_a_visible_follow_up_before_job_end(client, script, stack,
                                                                  gate):
    user, channel = uid("u"), uid("c")
    # the job's only model call answers once told; steering sent meanwhile comes too late
    marker = script([text("First answer.", hold=gate), text("Follow-up answer.")])
    job = client.submit(f"{marker} first", user=user, channel=channel)
    wait_until(lambda: "message_start" in [
        e["type"] for e in client.events(job["id"]) if e["data"].get("role") == "assistant"],
        timeout_s=60)
    answers = []
    steer = threading.Thread(target=lambda: answers.append(client.post(
        "/v1/messages", params={"wait": 60}, json={
            "platform": "api", "platform_user_id": user, "platform_channel_id": channel,
            "content": f"{marker} and also this", "on_busy": "steer"})))
    steer.start()
    # once the steering is stored, the model answers (the job ends with it unread)
    wait_until(lambda: _inputs(stack, job["id"]), timeout_s=60)
    gate.set()
    steer.join()
    [response] = answers  # the job's last step, after the gate, ends well within the wait
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["id"] == job["id"] and answer["status"] == "completed"
    steering = answer["steering"]
    assert steering["status"] == "deferred"
    follow_up_id = steering["follow_up_job_id"]
    assert follow_up_id and follow_up_id in steering["message"]
    assert answer["follow_up_job_id"] == follow_up_id
    # the event naming it comes before job_end, where streams close
    kinds = [e["type"] for e in client.events(job["id"])]
    assert kinds.index("steering_deferred") < kinds.index("job_end")
    assert client.get(f"/v1/jobs/{job['id']}").json()["follow_up_job_id"] == follow_up_id
    follow_up = client.wait(follow_up_id)
    assert follow_up["response"]["content"] == "Follow-up answer."
    first_turn = [e["data"] for e in client.events(follow_up_id) if e["type"] == "turn_start"]
    assert first_turn[0]["triggered_by"] == "follow_up"
