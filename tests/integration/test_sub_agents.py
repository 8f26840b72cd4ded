"""Sub-agents through HTTP and real workers (API.md 1.2, docs/sub-agents.md): a parent's
`agents.delegate` calls start child jobs that run in parallel while the parent waits
(`waiting_for: children`, no step holding it); each child's answer, or its error, is its
call's result in the parent's next model call; a cancel of the parent ends its children;
past AGENTQ_MAX_AGENT_DEPTH (3) the call gets a tool error; a child whose orchestrator is
killed mid-step completes once. Outcomes are waited for, never timed: that the children ran
at once is seen in the scripted server's held replies."""
from __future__ import annotations

import json
import threading
import uuid

import pytest

from agentq.models import Job
from agentq.testing.scripted_llm import call, error, text, tool_calls
from tests.support.api import Client, uid, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def agents_client(stack) -> Client:
    """A tenant of its own whose default persona may delegate (module `agents`)."""
    tenant = stack.create_tenant(uid("agents-t"))
    client = Client(stack, stack.create_key("agents", admin=True, tenant=tenant))
    made = client.post("/v1/personas", json={
        "name": "Delegator", "allowed_modules": ["agents", "math"], "is_default": True})
    assert made.status_code == 201, made.text
    return client


@pytest.fixture()
def child_script(llm):
    """Scripts of the children: fresh keys, each used up by the end of the test."""
    keys: list[str] = []

    def make(replies) -> str:
        key = uid("k").replace("-", "_")
        keys.append(key)
        return llm.script(key, replies)
    yield make
    for key in keys:
        llm.assert_done(key)


def delegate(task: str, **more) -> dict:
    return call("agents.delegate", {"task": task, **more})


def tool_results(request: dict) -> list[dict]:
    return [json.loads(m["content"]) for m in request["messages"] if m.get("role") == "tool"]


def events_of(client: Client, job_id: str, kind: str) -> list[dict]:
    return [e["data"] for e in client.events(job_id) if e["type"] == kind]


def test_three_children_run_in_parallel_and_their_answers_reach_the_parent(
        stack, llm, agents_client, script, child_script):
    client, seen = agents_client, {}
    holds = [threading.Event() for _ in range(3)]
    markers = [child_script([text(f"answer {name}", hold=hold)])
               for name, hold in zip("ABC", holds, strict=True)]
    marker = script([
        tool_calls(*(delegate(f"{m} find {name}") for m, name in zip(markers, "ABC", strict=True))),
        text("all three answered",
             check=lambda request: seen.setdefault("results", tool_results(request))),
    ])
    job = client.submit(f"{marker} split this up")
    try:
        # all three children's model calls are in flight at once: none is answered yet
        wait_until(lambda: all(llm.requests(m.split(":")[1]) for m in markers),
                   what="three children asking the model together")
        parent = client.get(f"/v1/jobs/{job['id']}").json()
        assert parent["status"] == "waiting" and parent["waiting_for"] == "children"
        assert len(parent["children"]) == 3
        with stack.sessions()() as session:  # the waiting parent holds no step
            row = session.get(Job, uuid.UUID(job["id"]))
            assert row.step_owner is None and row.step_lease_until is None
    finally:
        for hold in holds:
            hold.set()
    done = client.wait(job["id"])
    assert done["status"] == "completed", done
    assert done["response"]["content"] == "all three answered"

    # each child's answer is its call's result, in call order
    results = seen["results"]
    assert [r["answer"] for r in results] == ["answer A", "answer B", "answer C"]
    children = done["children"]
    shown = done["response"]["metadata"]["tool_calls"]
    assert [(c["name"], c["status"], c["success"]) for c in shown] == [
        ("agents.delegate", "succeeded", True)] * 3

    # the children: jobs of their own, in new conversations, started as sub-agents
    started = {s["tool_use_id"]: s["job_id"]
               for s in events_of(client, job["id"], "child_started")}
    assert started == {c["tool_use_id"]: child for c, child in zip(shown, children, strict=True)}
    ended = events_of(client, job["id"], "child_ended")
    assert sorted(e["job_id"] for e in ended) == sorted(children)
    assert {e["status"] for e in ended} == {"completed"}
    conversations = {done["conversation_id"]}
    for child_id in children:
        child = client.get(f"/v1/jobs/{child_id}").json()
        assert child["parent_job_id"] == job["id"] and child["status"] == "completed"
        assert child["children"] == [] and child["conversation_id"] not in conversations
        conversations.add(child["conversation_id"])
        [turn] = events_of(client, child_id, "turn_start")
        assert turn["triggered_by"] == "sub_agent"
    assert done["parent_job_id"] is None

    # the children's tokens count in the parent's: its two calls and theirs (10 + 5 each)
    assert done["usage"]["input_tokens"] == 5 * 10
    assert done["usage"]["output_tokens"] == 5 * 5


def test_cancelling_the_parent_cancels_its_children(llm, agents_client, script,
                                                    child_script):
    client = agents_client
    holds = [threading.Event() for _ in range(2)]
    markers = [child_script([text("never read", hold=hold)]) for hold in holds]
    marker = script([tool_calls(*(delegate(f"{m} work long") for m in markers))])
    job = client.submit(f"{marker} start two long tasks")
    try:
        wait_until(lambda: all(llm.requests(m.split(":")[1]) for m in markers),
                   what="both children thinking")
        children = client.get(f"/v1/jobs/{job['id']}").json()["children"]
        assert len(children) == 2
        cancelled = client.post(f"/v1/jobs/{job['id']}/cancel")
        assert cancelled.status_code == 202, cancelled.text
        done = client.wait(job["id"])
        assert done["status"] == "cancelled", done
        for child_id in children:
            child = client.wait(child_id)
            assert child["status"] == "cancelled", child
            assert child["parent_job_id"] == job["id"]
    finally:
        for hold in holds:
            hold.set()


def test_beyond_the_depth_limit_the_call_gets_a_tool_error(agents_client, script,
                                                           child_script):
    client, seen = agents_client, {}
    # depth 0 → 1 → 2 → 3 (AGENTQ_MAX_AGENT_DEPTH's default); the fourth level is refused
    deepest = child_script([
        tool_calls(delegate("one level too deep")),
        text("could not delegate",
             check=lambda request: seen.setdefault("results", tool_results(request))),
    ])
    second = child_script([tool_calls(delegate(f"{deepest} go deeper")), text("two")])
    first = child_script([tool_calls(delegate(f"{second} go deeper")), text("one")])
    marker = script([tool_calls(delegate(f"{first} go deep")), text("top")])
    job = client.submit(f"{marker} nest")
    done = client.wait(job["id"])
    assert done["status"] == "completed" and done["response"]["content"] == "top", done

    [refused] = seen["results"]
    assert refused["error"]["code"] == "agent_depth_exceeded"
    # the chain: each level the parent of the next, the deepest with no child
    level, chain = done, []
    while level["children"]:
        [child_id] = level["children"]
        level = client.get(f"/v1/jobs/{child_id}").json()
        chain.append(level)
    assert len(chain) == 3 and chain[-1]["response"]["content"] == "could not delegate"


def test_a_failed_child_is_an_error_result_and_the_parent_completes(agents_client, script,
                                                                    child_script):
    client, seen = agents_client, {}
    failing = child_script([error(400, "the model refuses"), error(400, "the model refuses")])
    answering = child_script([text("fine")])
    marker = script([
        tool_calls(delegate(f"{failing} fail"), delegate(f"{answering} answer"),
                   call("agents.delegate", {"task": "x", "persona_id": str(uuid.uuid4())}),
                   call("agents.delegate", {})),
        text("one of four worked",
             check=lambda request: seen.setdefault("results", tool_results(request))),
    ])
    job = client.submit(f"{marker} try")
    done = client.wait(job["id"])
    assert done["status"] == "completed", done
    assert done["response"]["content"] == "one of four worked"

    failed, answered, no_persona, no_task = seen["results"]
    assert failed["error"]["code"] == "sub_agent_failed"
    assert "refuses" in failed["error"]["message"]
    assert answered["answer"] == "fine"
    assert no_persona["error"]["code"] == "persona_not_found"
    assert no_task["error"]["code"] == "invalid_arguments"
    assert len(done["children"]) == 2
    statuses = sorted(client.get(f"/v1/jobs/{c}").json()["status"] for c in done["children"])
    assert statuses == ["completed", "failed"]
    ended = {e["job_id"]: e["status"] for e in events_of(client, job["id"], "child_ended")}
    assert sorted(ended.values()) == ["completed", "failed"]


@pytest.fixture(scope="module")
def lab(servers_up, llm, tmp_path_factory):
    """A stack of its own (Redis, database, processes): its orchestrator is killed."""
    from tests.support.api import TEST_ENV
    from tests.support.stack import own_stack
    with own_stack("sub_agents", llm.base_url, tmp_path_factory.mktemp("sub-agents"),
                   TEST_ENV, workers=("orchestrator", "tools"), beat=True) as stack:
        tenant = stack.create_tenant(uid("agents-k"))
        client = Client(stack, stack.create_key("agents", admin=True, tenant=tenant))
        made = client.post("/v1/personas", json={
            "name": "Delegator", "allowed_modules": ["agents"], "is_default": True})
        assert made.status_code == 201, made.text
        yield stack, client


def test_a_child_whose_worker_is_killed_mid_step_completes_once(lab, llm, script,
                                                                child_script):
    """The orchestrator dies (SIGKILL) while the child's model call is in flight; started
    again, the sweeper re-drives the child's step: the child completes once, the parent
    gets its answer once, no second child is made."""
    import os
    import signal
    stack, client = lab
    seen, hold = {}, threading.Event()
    child = child_script([text("lost with its worker", hold=hold), text("answered once")])
    marker = script([
        tool_calls(delegate(f"{child} survive a crash")),
        text("the parent goes on",
             check=lambda request: seen.setdefault("results", tool_results(request))),
    ])
    job = client.submit(f"{marker} delegate through a crash")
    try:
        wait_until(lambda: llm.requests(child.split(":")[1]), what="the child thinking")
        orchestrator = stack.procs["orchestrator"]
        os.killpg(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait(timeout=30)
    finally:
        hold.set()  # its connection is gone: nobody reads this reply
    stack.spawn("orchestrator")
    done = client.wait(job["id"])
    assert done["status"] == "completed", done
    assert done["response"]["content"] == "the parent goes on"
    [result] = seen["results"]
    assert result["answer"] == "answered once"

    [child_id] = done["children"]
    answered = client.get(f"/v1/jobs/{child_id}").json()
    assert answered["status"] == "completed" and answered["iterations"] == 1
    types = [e["type"] for e in client.events(child_id)]
    assert types.count("job_start") == 1 and types.count("job_end") == 1
    assert len(events_of(client, job["id"], "child_started")) == 1
    assert [e["status"] for e in events_of(client, job["id"], "child_ended")] == ["completed"]
    assert len(llm.requests(child.split(":")[1])) == 2


def test_a_recorded_replay_of_a_parent_replays_its_children_recorded(llm, agents_client,
                                                                     script, child_script):
    client = agents_client
    child = child_script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                          text("it is 42")])
    marker = script([tool_calls(delegate(f"{child} compute 6*7")), text("the child says 42")])
    original = client.wait(client.submit(f"{marker} ask a sub-agent")["id"])
    assert original["status"] == "completed", original
    asked = len(llm.requests())

    replayed = client.post(f"/v1/jobs/{original['id']}/replay", json={"mode": "recorded"})
    assert replayed.status_code == 202, replayed.text
    job = client.wait(replayed.json()["id"])
    assert job["status"] == "completed" and job["response"]["content"] == "the child says 42"
    assert len(llm.requests()) == asked  # parent and child played back: no model called
    [replayed_child] = job["children"]
    [original_child] = original["children"]
    shown = client.get(f"/v1/jobs/{replayed_child}").json()
    assert shown["replay_of"] == original_child and shown["parent_job_id"] == job["id"]
    assert shown["response"]["content"] == "it is 42"
    assert "replay_diverged" not in [e["type"] for e in client.events(job["id"])]
