"""Hooks as installed entry points (group `agentq.hooks`): tests/support/hooks_dist is a site
directory holding an installed distribution (its module and .dist-info with
entry_points.txt), which a stack of this module's own (own Redis server, own database) has
on its path. A before_turn hook stops
a job with a reason; a hook that raises is logged and the job goes on."""
from __future__ import annotations

import time

import pytest

from agentq.testing.scripted_llm import call, error, text, tool_calls
from tests.support.api import TEST_ENV, Client, uid, wait_until
from tests.support.hook_log import DIST, _calls
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hooked(servers_up, llm, tmp_path_factory):
    hook_log = tmp_path_factory.mktemp("hooks-log") / "calls.jsonl"
    with own_stack("hooks", llm.base_url, tmp_path_factory.mktemp("hooked"),
                   {**TEST_ENV, "AGENTQ_TEST_HOOK_LOG": str(hook_log)},
                   pythonpath=DIST) as stack:
        yield stack, Client(stack, stack.create_key("hooks", admin=True)), hook_log


def test_a_hook_stops_a_job_before_its_model_call(hooked, script):
    stack, client, hook_log = hooked
    marker = script([])
    job = client.wait(client.submit(f"{marker} HOOK-STOP now")["id"])
    assert (job["status"], job["finish_reason"]) == ("completed", "hook"), job
    assert job["iterations"] == 0
    assert job["response"]["error"]["message"] == "stopped by the test hook"
    events = client.events(job["id"])
    kinds = [e["type"] for e in events]
    assert kinds.index("hook_stopped") < kinds.index("job_end")
    stopped = next(e["data"] for e in events if e["type"] == "hook_stopped")
    assert stopped["hook"] == "test_hooks"
    messages = client.get(f"/v1/conversations/{job['conversation_id']}/messages").json()
    assert messages["data"][-1]["content"] == "[Agent stopped: hook]"
    assert [c["hook"] for c in _calls(hook_log, job["id"])] == ["before_turn"]


def test_a_hook_that_raises_never_fails_the_job(hooked, script):
    stack, client, hook_log = hooked
    marker = script([tool_calls(call("math.evaluate", {"expression": "2+2"})),
                     text("4, and HOOK-RAISE again")])
    job = client.wait(client.submit(f"{marker} HOOK-RAISE what is 2+2?")["id"])
    assert (job["status"], job["finish_reason"]) == ("completed", "end_turn"), job
    assert job["response"]["content"] == "4, and HOOK-RAISE again"
    calls = [c["hook"] for c in _calls(hook_log, job["id"], expect=4)]
    assert calls == ["before_turn", "after_turn", "before_turn", "after_turn"]
    while b"hook failed" not in stack.logs["orchestrator"].read_bytes():
        time.sleep(0.1)  # never logged: the test's timeout


def test_on_error_and_after_turn_hear_a_failed_model_call(hooked, script):
    stack, client, hook_log = hooked
    # a 400 is not transient (a 5xx would park the job to wait for its provider):
    # the call fails at once, on each of the two models
    marker = script([error(400, "bad request"), error(400, "bad request")])
    job = client.wait(client.submit(f"{marker} go")["id"])
    assert (job["status"], job["finish_reason"]) == ("failed", "error")
    calls = _calls(hook_log, job["id"], expect=3)
    # the turn ended in the error: on_error, then after_turn with the error
    assert [c["hook"] for c in calls] == ["before_turn", "on_error", "after_turn"]
    assert calls[1]["error"]["code"]
    assert calls[2]["error"] == calls[1]["error"] and calls[2]["turn"] == 1
    events = client.events(job["id"])
    kinds = [e["type"] for e in events]
    assert kinds.count("turn_start") == kinds.count("turn_end") == 1
    assert kinds.index("turn_end") < kinds.index("job_end")
    assert next(e["data"] for e in events if e["type"] == "turn_end")["error"]["code"]


def test_before_turn_runs_once_a_turn_however_often_its_provider_is_tried(hooked, llm):
    """Issue 31 item 5: during a provider outage the turn's step runs again at each
    attempt (the job waits for its provider between them); the turn is still one turn."""
    stack, client, hook_log = hooked
    key = uid("outage").replace("-", "_")
    llm.script(key, [text("back again")])
    llm.storm(key, [error(503, "overloaded")])
    try:
        job = client.submit(f"script:{key} hello")
        wait_until(lambda: sum(e["type"] == "waiting_provider"
                               for e in client.events(job["id"])) >= 3,
                   what="the turn's step ran three times, waiting for its provider between")
    finally:
        llm.calm(key)
    ended = client.wait(job["id"])
    assert (ended["status"], ended["response"]["content"]) == ("completed", "back again")
    calls = [c["hook"] for c in _calls(hook_log, job["id"], expect=2)]
    assert calls == ["before_turn", "after_turn"]
    llm.assert_done(key)
