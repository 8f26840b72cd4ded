"""What users saw go wrong (issue 31), loop side, through HTTP and the real workers: a persona
sticks to its conversation, for every continue, schedule firing and wake-up the model
scheduled (item 1); a reply cut at the output limit ends `completed` with finish_reason
`length`, and a cut reply's tool calls are not run (2); a cancel stops the model call in
flight, and no further call is made for the job (3); a job's response says what each tool
call was given, what it returned and how it ended, cut at 2 KB (11). (Items 5 and 10 are
tested beside their kind: tests/integration/test_hooks.py, test_long_context.py.)

Nothing here asserts a duration: each test waits for an outcome and counts what the model
server was sent."""
from __future__ import annotations

import dataclasses
import threading

import pytest
import requests

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import Client, uid, wait_until

pytestmark = pytest.mark.integration


def system_prompt(request: dict) -> str:
    return request["messages"][0]["content"]


def offered(request: dict) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or []}


# --- item 1: a persona sticks to its conversation ----------------------------------------------

@pytest.fixture(scope="module")
def personas(stack):
    """A tenant of its own with two personas: BIG (the default: math and time) and SMALL
    (scheduler and time), each saying who it is in its system prompt."""
    name = uid("personas")
    tenant_id = stack.create_tenant(name)
    admin = Client(stack, stack.create_key("personas", admin=True, tenant=tenant_id))
    made = {}
    for persona, default, modules in (("BIG", True, ["math", "time"]),
                                      ("SMALL", False, ["scheduler", "time"])):
        response = admin.post("/v1/personas", json={
            "name": persona, "system_prompt": f"You are PROMPT-{persona}.",
            "is_default": default, "allowed_modules": modules})
        assert response.status_code == 201, response.text
        made[persona] = response.json()["id"]
    return {"client": admin, "tenant": name, **made}


def test_a_persona_named_once_answers_every_later_job_of_its_conversation(personas, llm):
    client = personas["client"]
    key = uid("persona").replace("-", "_")
    llm.script(key, [text(f"answer {n}") for n in range(6)])
    channel, user = uid("c"), uid("u")
    first = client.submit(f"script:{key} hello", channel=channel, user=user,
                          persona_id=personas["SMALL"])
    conversation_id = client.wait(first["id"])["conversation_id"]

    def next_job(path: str, **body) -> dict:
        response = client.post(path, json=body)
        assert response.status_code == 202, response.text
        return client.wait(response.json()["id"])

    # a continue, a schedule's firing, a message to the same place: all as SMALL
    next_job("/v1/continue", conversation_id=conversation_id, content="and then?")
    made = client.post("/v1/schedules", json={"conversation_id": conversation_id,
                                              "content": "a reminder", "delay_s": 0})
    assert made.status_code == 201, made.text
    fired = wait_until(lambda: client.get(f"/v1/schedules/{made.json()['id']}").json()
                       ["last_job_id"], what="the schedule fired")
    assert client.wait(fired)["status"] == "completed"
    again = client.submit(f"script:{key} hello again", channel=channel, user=user)
    assert client.wait(again["id"])["conversation_id"] == conversation_id
    # a request naming another persona answers as it, and it is the conversation's now
    next_job("/v1/continue", conversation_id=conversation_id, content="as BIG",
             persona_id=personas["BIG"])
    next_job("/v1/continue", conversation_id=conversation_id, content="still BIG?")

    prompts = [system_prompt(r) for r in llm.requests(key)]
    assert len(prompts) == 6
    who = ["SMALL" if "PROMPT-SMALL" in p else "BIG" if "PROMPT-BIG" in p else p
           for p in prompts]
    assert who == ["SMALL", "SMALL", "SMALL", "SMALL", "BIG", "BIG"]
    llm.assert_done(key)


def test_a_wake_up_the_model_scheduled_runs_as_its_persona_with_its_tools(stack, personas,
                                                                          llm):
    client, ref = personas["client"], uid("u")
    made = stack.agentq("users", "set", "api", ref, "--level", "user",
                        "--tenant", personas["tenant"])
    assert made.returncode == 0, made.stderr
    key = uid("wake").replace("-", "_")
    llm.script(key, [
        tool_calls(call("scheduler.add_job", {"content": "wake up and check",
                                              "delay_s": 1})),
        text("I will look again in a second."),
        text("Checked."),  # the wake-up
    ])
    job = client.wait(client.submit(f"script:{key} look again soon", user=ref,
                                    persona_id=personas["SMALL"])["id"])
    assert job["status"] == "completed", job
    woken = wait_until(lambda: len(llm.requests(key)) >= 3, what="the wake-up's model call")
    assert woken
    wake = llm.requests(key)[2]
    assert "PROMPT-SMALL" in system_prompt(wake)
    assert "scheduler-add_job" in offered(wake) and "math-evaluate" not in offered(wake)
    llm.assert_done(key)


# --- item 2: a reply cut at the output limit ---------------------------------------------------

def test_a_reply_cut_at_the_output_limit_ends_with_finish_reason_length(stack, admin_key,
                                                                        client, script):
    marker = script([text("The answer begins and then", finish_reason="length")])
    job = client.wait(client.submit(f"{marker} tell me everything")["id"])
    assert (job["status"], job["finish_reason"]) == ("completed", "length"), job
    assert job["response"]["content"] == "The answer begins and then"
    assert job["response"]["error"]["code"] == "length"
    end = [e for e in client.events(job["id"]) if e["type"] == "job_end"]
    assert [e["data"]["finish_reason"] for e in end] == ["length"]
    # the dashboard's filter offers it and finds the job by it
    ui = requests.Session()
    signed = ui.post(f"{stack.base}/ui/sign-in", data={"key": admin_key},
                     headers={"Origin": stack.base}, allow_redirects=False)
    assert signed.status_code == 302, signed.text
    page = ui.get(f"{stack.base}/ui/jobs", params={"finish_reason": "length"}, timeout=70)
    assert page.status_code == 200 and job["id"] in page.text
    assert 'value="length"' in page.text


def test_a_reply_cut_while_asking_for_a_tool_runs_no_tool(client, script, llm):
    cut = dataclasses.replace(
        tool_calls(call("math.evaluate", '{"expression": "6*7 + 1'), content="Let me add"),
        finish_reason="length")
    marker = script([cut])
    job = client.wait(client.submit(f"{marker} add it up")["id"])
    assert (job["status"], job["finish_reason"]) == ("completed", "length"), job
    assert job["response"]["error"]["tool_calls_not_run"] == ["math.evaluate"]
    assert job["response"]["metadata"]["tool_calls"] == []
    kinds = [e["type"] for e in client.events(job["id"])]
    assert "tool_execution_start" not in kinds and "tool_execution_end" not in kinds
    assert len(llm.requests(marker.removeprefix("script:"))) == 1  # not asked again


# --- item 3: a cancel stops the model call in flight -------------------------------------------

def test_a_cancel_aborts_the_model_call_in_flight_and_no_other_is_made(client, llm):
    key = uid("cancel").replace("-", "_")
    never = threading.Event()  # the model never answers by itself
    llm.script(key, [text("a late answer", hold=never)])
    abandoned = llm.abandoned
    try:
        job = client.submit(f"script:{key} think for a long time")
        wait_until(lambda: llm.requests(key), what="the model call began")
        cancelled = client.post(f"/v1/jobs/{job['id']}/cancel")
        assert cancelled.status_code == 202, cancelled.text
        ended = client.wait(job["id"])
        assert (ended["status"], ended["finish_reason"]) == ("cancelled", "cancelled"), ended
        # the call was aborted (the server saw its client go), and none followed it: no
        # retry, no fallback model
        wait_until(lambda: llm.abandoned > abandoned, what="the held call was abandoned")
        assert len(llm.requests(key)) == 1
    finally:
        never.set()
    llm.assert_done(key)


# --- item 11: the response says what was done ---------------------------------------------------

def test_the_response_lists_each_calls_arguments_result_and_status(client, script):
    long_text = "é" + "x" * 3000  # its JSON is over 2 KB, arguments and result alike
    marker = script([
        tool_calls(call("math.evaluate", {"expression": "6*7"}),
                   call("flaky.echo", {"text": long_text}),
                   call("flaky.always_fail", {})),
        text("done"),
    ])
    job = client.wait(client.submit(f"{marker} do three things")["id"])
    assert job["status"] == "completed", job
    math, echo, failing = job["response"]["metadata"]["tool_calls"]
    assert (math["name"], math["status"], math["success"], math["truncated"]) == (
        "math.evaluate", "succeeded", True, False)
    assert math["arguments"] == {"expression": "6*7"}
    assert math["result"]["result"] == 42 and math["error"] is None
    assert (echo["status"], echo["truncated"]) == ("succeeded", True)
    for cut in (echo["arguments"], echo["result"]):
        assert isinstance(cut, str) and len(cut.encode()) <= 2048 and "xxxx" in cut
    assert (failing["status"], failing["success"], failing["result"]) == (
        "failed", False, None)
    assert failing["error"]["code"] and failing["arguments"] == {}
