"""Local tools through HTTP and real workers (DESIGN 1.2): with `math` local
(AGENTQ_LOCAL_MODULES), a job's math call runs inside the orchestrator's step, on a stack
whose only worker is the orchestrator: no tools worker runs, nothing is sent to a module
queue, and the job completes with its call recorded. A call past its limit is a tool error;
a turn mixing a local and a chord call waits for the chord's call, whose worker starts
later."""
from __future__ import annotations

import json
import textwrap

import pytest

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import TEST_ENV, Client, assert_one_tool_turn_told, wait_until
from tests.support.stack import own_stack, queue_depth

pytestmark = pytest.mark.integration

STALL = textwrap.dedent('''
    """A local tool that does not return until the test creates its release file."""
    import os
    import time
    from pathlib import Path

    from agentq.tools.manifest import define_module


    def wait(args, ctx):
        release = Path(os.environ["AGENTQ_TEST_SCRATCH"]) / "release"
        deadline = time.monotonic() + 600
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"released": True}


    MODULE = define_module({
        "module": "stall", "description": "Waits.", "local": True,
        "tools": [{"name": "stall.wait", "description": "Waits for the test.",
                   "parameters": {"type": "object", "properties": {},
                                  "additionalProperties": False},
                   "function": wait, "idempotent": True}]})
''')


@pytest.fixture(scope="module")
def local(servers_up, llm, tmp_path_factory):
    """A stack of its own whose only worker is the orchestrator; math and stall local."""
    packages = tmp_path_factory.mktemp("localtools")
    (packages / "localtools" / "stall").mkdir(parents=True)
    (packages / "localtools" / "__init__.py").write_text("")
    (packages / "localtools" / "stall" / "__init__.py").write_text(STALL)
    env = {**TEST_ENV, "AGENTQ_LOCAL_MODULES": "math,stall",
           "AGENTQ_LOCAL_TOOL_TIME_LIMIT_S": "1",
           "AGENTQ_TOOL_PACKAGES": "tool_workers,tests.support.testtools,localtools",
           "AGENTQ_DEFAULT_MODULES": "math,time,stall"}
    with own_stack("local_tools", llm.base_url, tmp_path_factory.mktemp("local"), env,
                   workers=("orchestrator",), pythonpath=packages) as stack:
        yield stack, Client(stack, stack.create_key("local", admin=True))
        (stack.scratch / "release").write_text("")  # a stalled tool's thread ends


def _calls(job: dict) -> list[dict]:
    return job["response"]["metadata"]["tool_calls"]


def _started(client: Client, job_id: str) -> dict[str, dict]:
    return {e["data"]["name"]: e["data"] for e in client.events(job_id)
            if e["type"] == "tool_execution_start"}


def test_a_local_tool_job_completes_with_no_tools_worker_and_nothing_on_its_queue(local,
                                                                                   script):
    stack, client = local
    assert set(stack.procs) == {"web", "orchestrator"}  # no tools worker at all
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("It is 42.")])
    job = client.wait(client.submit(f"{marker} what is 6*7?")["id"])
    assert (job["status"], job["finish_reason"]) == ("completed", "end_turn"), job
    assert job["response"]["content"] == "It is 42." and job["iterations"] == 2
    # the call is recorded as a chord's call is: its row's result, its events
    (recorded,) = _calls(job)
    assert (recorded["name"], recorded["status"], recorded["success"]) == (
        "math.evaluate", "succeeded", True)
    assert recorded["result"] == {"expression": "6*7", "result": 42}
    history = assert_one_tool_turn_told(client, job)
    assert json.loads(history[2]["content"])["result"] == {"expression": "6*7", "result": 42}
    started = _started(client, job["id"])["math.evaluate"]
    assert (started["local"], started["queue"]) == (True, "orchestrator")
    # nothing was sent to a module queue
    broker = stack.env["AGENTQ_BROKER_URL"]
    assert queue_depth(broker, "tools.math") == 0
    # the module list says which modules are local
    modules = {m["name"]: m for m in client.get("/v1/modules").json()["data"]}
    assert (modules["math"]["local"], modules["stall"]["local"],
            modules["time"]["local"]) == (True, True, False)


def test_registering_a_module_as_local_over_the_api_is_refused(local):
    _stack, client = local
    response = client.post("/v1/modules", json={"name": "weather", "kind": "http",
                                                 "url": "http://127.0.0.1:9/", "local": True})
    assert response.status_code == 422, response.text
    assert "local" in response.json()["error"]["details"]["fields"]


def test_a_local_call_past_its_limit_is_a_tool_error_and_the_job_completes(local, script):
    _stack, client = local
    marker = script([tool_calls(call("stall.wait", {})), text("It took too long.")])
    job = client.wait(client.submit(f"{marker} wait")["id"])
    assert (job["status"], job["finish_reason"]) == ("completed", "end_turn"), job
    (recorded,) = _calls(job)
    assert (recorded["status"], recorded["success"]) == ("failed", False)
    assert recorded["error"]["code"] == "tool_timeout", recorded
    assert job["response"]["content"] == "It took too long."


def test_a_mixed_turn_runs_the_local_call_and_ends_when_the_chord_call_is_in(local, script):
    stack, client = local
    broker = stack.env["AGENTQ_BROKER_URL"]
    marker = script([tool_calls(call("math.evaluate", {"expression": "2**10"}),
                                call("time.now", {"timezone": "UTC"})),
                     text("Both in.")])
    job_id = client.submit(f"{marker} both")["id"]
    # the local call has run and its result is stored; time's call waits on its queue,
    # which no worker consumes yet: the turn is not over
    wait_until(lambda: queue_depth(broker, "tools.time") == 1, 60,
               what="time.now's call sent to tools.time")
    ends = wait_until(lambda: [e["data"] for e in client.events(job_id)
                               if e["type"] == "tool_execution_end"], 60,
                      what="math.evaluate's result")
    assert [(e["name"], e["ok"]) for e in ends] == [("math.evaluate", True)]
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
    # when a tools worker starts, the chord's call runs and the turn ends
    stack.workers = (*stack.workers, "tools")
    stack.spawn("tools")
    job = client.wait(job_id)
    assert (job["status"], job["response"]["content"]) == ("completed", "Both in."), job
    assert [(c["name"], c["success"]) for c in _calls(job)] == [("math.evaluate", True),
                                                                ("time.now", True)]
    started = _started(client, job_id)
    assert (started["math.evaluate"]["queue"], started["time.now"]["queue"]) == (
        "orchestrator", "tools.time")
    assert queue_depth(broker, "tools.math") == 0
