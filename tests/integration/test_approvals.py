"""Human approval through HTTP and real workers: a call of a `requires_approval` tool pauses
its job in `waiting` (no step holds it), with an `approval_required` event and a signed
`job.approval_required` webhook (data: the job plus `tool_call`); approve (`202`) runs it
(edited arguments checked against the schema), deny and the timeout give the model a tool
error, each with an `approval_resolved` event saying the decision; cancel works while
waiting, and the other calls of the turn run meanwhile. Outcomes are waited for, never
timed."""
from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import select

from agentq.models import Job, ToolCall
from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import uid, wait_until

pytestmark = pytest.mark.integration
WAIT_S = 60


def waiting(client, job_id: str) -> dict:
    def check():
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["status"] == "waiting" else None
    return wait_until(check, what=f"job {job_id} waiting")


def approval_event(client, job_id: str, name: str) -> dict:
    return wait_until(lambda: next((e["data"] for e in client.events(job_id)
                                    if e["type"] == "approval_required"
                                    and e["data"]["name"] == name), None),
                      what="approval_required")


def tool_messages(request: dict) -> list[dict]:
    return [json.loads(m["content"]) for m in request["messages"] if m.get("role") == "tool"]


def test_approve_runs_the_call_with_edited_arguments_while_the_rest_ran_meanwhile(
        stack, client, script, receiver):
    seen = {}
    marker = script([
        tool_calls(call("flaky.guarded", {"text": "rm -rf"}), call("flaky.echo",
                                                                   {"text": "meanwhile"})),
        text("done", check=lambda request: seen.setdefault("results", tool_messages(request))),
    ])
    url = receiver.url("/approval-" + uid("a"))
    job = client.submit(f"{marker} go", callback_url=url)
    shown = waiting(client, job["id"])
    assert shown["waiting_for"] == "approval"
    request = approval_event(client, job["id"], "flaky.guarded")
    assert request["arguments"] == {"text": "rm -rf"} and request["expires_at"]
    tool_use_id = request["tool_use_id"]

    # the other call of the turn ran; no step holds the job
    wait_until(lambda: any(e["type"] == "tool_execution_end" and e["data"]["name"] ==
                           "flaky.echo" and e["data"]["ok"] for e in client.events(job["id"])),
               what="flaky.echo ran meanwhile")
    with stack.sessions()() as session:
        row = session.get(Job, uuid.UUID(job["id"]))
        assert row.status == "waiting" and row.step_owner is None
        assert row.step_lease_until is None

    # the signed webhook names the call and its arguments
    path = url.split(str(receiver.server.server_port))[1]
    [hook] = receiver.wait_for(path, 1)
    assert hook["verified"] is True
    assert hook["payload"]["type"] == "job.approval_required"
    assert hook["payload"]["data"]["id"] == job["id"]
    assert hook["payload"]["data"]["status"] == "waiting"
    assert hook["payload"]["data"]["tool_call"] == {
        "tool_use_id": tool_use_id, "name": "flaky.guarded", "arguments": {"text": "rm -rf"}}

    # arguments that do not fit the schema are refused; nothing changes
    bad = client.post(f"/v1/jobs/{job['id']}/tool_calls/{tool_use_id}/approve",
                      json={"arguments": {"text": 5}})
    assert bad.status_code == 422 and "arguments" in bad.json()["error"]["details"]["fields"]
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "waiting"

    approved = client.post(f"/v1/jobs/{job['id']}/tool_calls/{tool_use_id}/approve",
                           json={"arguments": {"text": "ls"}})
    assert approved.status_code == 202, approved.text
    assert approved.json()["id"] == job["id"]
    ended = client.wait(job["id"])
    assert ended["status"] == "completed" and ended["waiting_for"] is None
    by_name = {m.get("echo") for m in seen["results"]}
    assert by_name == {"ls", "meanwhile"}
    types = [e["type"] for e in client.events(job["id"])]
    assert types.index("approval_required") < types.index("approval_resolved")
    resolved = next(e["data"] for e in client.events(job["id"])
                    if e["type"] == "approval_resolved")
    assert resolved["decision"] == "approved" and resolved["tool_use_id"] == tool_use_id
    assert resolved["arguments"] == {"text": "ls"} and resolved["edited"] is True
    assert "approval_granted" not in types and "approval_denied" not in types
    again = client.post(f"/v1/jobs/{job['id']}/tool_calls/{tool_use_id}/approve")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"


def test_deny_gives_the_model_a_denied_error(client, script):
    seen = {}
    marker = script([
        tool_calls(call("flaky.guarded", {"text": "x"})),
        text("ok, not doing it",
             check=lambda request: seen.setdefault("results", tool_messages(request))),
    ])
    job = client.submit(f"{marker} go")
    waiting(client, job["id"])
    tool_use_id = approval_event(client, job["id"], "flaky.guarded")["tool_use_id"]
    denied = client.post(f"/v1/jobs/{job['id']}/tool_calls/{tool_use_id}/deny",
                         json={"reason": "not today"})
    assert denied.status_code == 202, denied.text
    ended = client.wait(job["id"])
    assert ended["status"] == "completed"
    [result] = seen["results"]
    assert result["error"]["code"] == "denied" and "not today" in result["error"]["message"]
    [shown] = ended["response"]["metadata"]["tool_calls"]
    assert (shown["name"], shown["success"], shown["tool_use_id"], shown["status"],
            shown["arguments"], shown["error"]["code"]) == (
        "flaky.guarded", False, tool_use_id, "failed", {"text": "x"}, "denied")
    events = client.events(job["id"])
    assert [(e["data"]["decision"], e["data"]["reason"]) for e in events
            if e["type"] == "approval_resolved"] == [("denied", "not today")]


def test_an_approval_that_never_comes_times_out_as_a_denial(client, script):
    seen = {}
    marker = script([
        tool_calls(call("flaky.guarded_briefly", {"text": "x"})),
        text("nobody answered",
             check=lambda request: seen.setdefault("results", tool_messages(request))),
    ])
    job = client.submit(f"{marker} go")
    ended = client.wait(job["id"], timeout_s=WAIT_S)
    assert ended["status"] == "completed"
    [result] = seen["results"]
    assert result["error"]["code"] == "approval_timeout"
    assert [(e["data"]["decision"], e["data"]["code"]) for e in client.events(job["id"])
            if e["type"] == "approval_resolved"] == [("timed_out", "approval_timeout")]


@pytest.mark.parametrize("how", ["deny", "timeout"])
def test_a_refused_call_is_announced_and_the_job_ends_with_its_webhook(client, script,
                                                                       receiver, how):
    """Deny and the approval timeout: the `job.approval_required` webhook named the call,
    an `approval_resolved` event says the decision, and the job's end is delivered as for
    any job (API.md has no webhook of its own for the decision)."""
    tool = "flaky.guarded" if how == "deny" else "flaky.guarded_briefly"
    marker = script([tool_calls(call(tool, {"text": "x"})), text(f"fine, {how}")])
    url = receiver.url(f"/refused-{how}-" + uid("r"))
    path = url.split(str(receiver.server.server_port))[1]
    job = client.submit(f"{marker} go", callback_url=url)
    tool_use_id = approval_event(client, job["id"], tool)["tool_use_id"]
    if how == "deny":
        denied = client.post(f"/v1/jobs/{job['id']}/tool_calls/{tool_use_id}/deny",
                             json={"reason": "no"})
        assert denied.status_code == 202, denied.text
    ended = client.wait(job["id"], timeout_s=WAIT_S)
    assert ended["status"] == "completed"
    hooks = receiver.wait_for(path, 2)
    assert all(h["verified"] for h in hooks)
    by_type = {h["payload"]["type"]: h["payload"] for h in hooks}
    assert set(by_type) == {"job.approval_required", "job.completed"}
    assert by_type["job.approval_required"]["data"]["tool_call"] == {
        "tool_use_id": tool_use_id, "name": tool, "arguments": {"text": "x"}}
    assert by_type["job.completed"]["data"]["id"] == job["id"]
    assert by_type["job.completed"]["data"]["response"]["content"] == f"fine, {how}"
    [resolved] = [e["data"] for e in client.events(job["id"])
                  if e["type"] == "approval_resolved"]
    assert resolved["tool_use_id"] == tool_use_id and resolved["name"] == tool
    assert resolved["decision"] == ("denied" if how == "deny" else "timed_out")
    late = client.post(f"/v1/jobs/{job['id']}/tool_calls/{tool_use_id}/approve")
    assert late.status_code == 409 and late.json()["error"]["code"] == "conflict"


def test_cancel_works_while_waiting(stack, client, script):
    marker = script([tool_calls(call("flaky.guarded", {"text": "x"}))])
    job = client.submit(f"{marker} go")
    waiting(client, job["id"])
    tool_use_id = approval_event(client, job["id"], "flaky.guarded")["tool_use_id"]
    cancelled = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    ended = client.wait(job["id"])
    assert ended["status"] == "cancelled"
    with stack.sessions()() as session:
        status = session.execute(select(ToolCall.status).where(
            ToolCall.tool_use_id == tool_use_id)).scalar_one()
    assert status == "cancelled"
    late = client.post(f"/v1/jobs/{job['id']}/tool_calls/{tool_use_id}/approve")
    assert late.status_code == 409


def test_approval_routes_bad_input(stack, client, script):
    marker = script([tool_calls(call("flaky.guarded", {"text": "x"})), text("fine")])
    job = client.submit(f"{marker} go")
    waiting(client, job["id"])
    tool_use_id = approval_event(client, job["id"], "flaky.guarded")["tool_use_id"]
    base = f"/v1/jobs/{job['id']}/tool_calls"
    assert client.post(f"{base}/tool_nope/approve").status_code == 404
    assert client.post(f"/v1/jobs/{uuid.uuid4()}/tool_calls/{tool_use_id}/approve"
                       ).status_code == 404
    assert client.post(f"{base}/{tool_use_id}/approve", json={"arguments": "x"}
                       ).status_code == 422
    assert client.post(f"{base}/{tool_use_id}/approve", json={"surprise": 1}
                       ).status_code == 422
    assert client.post(f"{base}/{tool_use_id}/deny", json={"reason": "x" * 3000}
                       ).status_code == 422
    assert client.post(f"{base}/{tool_use_id}/deny", data="reason",
                       headers={"Content-Type": "text/plain"}).status_code == 415
    other = stack.create_key("appr-other", admin=True,
                             tenant=stack.create_tenant(uid("appr-t")))
    from tests.support.api import Client
    stranger = Client(stack, other)
    assert stranger.post(f"{base}/{tool_use_id}/deny").status_code == 404
    foreign = stranger.post(f"{base}/{tool_use_id}/approve")
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "waiting"
    assert client.post(f"{base}/{tool_use_id}/approve").status_code == 202  # empty body
    assert client.wait(job["id"])["status"] == "completed"


def test_a_persona_can_require_approval_of_any_tool(stack, script):
    from tests.support.api import Client
    client = Client(stack, stack.create_key("appr-persona", admin=True,
                                            tenant=stack.create_tenant(uid("appr-p"))))
    persona = client.post("/v1/personas", json={"name": "Careful",
                                                "requires_approval": ["flaky.echo"]})
    assert persona.status_code == 201 and persona.json()["requires_approval"] == ["flaky.echo"]
    marker = script([tool_calls(call("flaky.echo", {"text": "hi"})), text("echoed")])
    job = client.submit(f"{marker} go")  # the tenant's default persona: its first
    waiting(client, job["id"])
    tool_use_id = approval_event(client, job["id"], "flaky.echo")["tool_use_id"]
    assert client.post(f"/v1/jobs/{job['id']}/tool_calls/{tool_use_id}/approve"
                       ).status_code == 202
    ended = client.wait(job["id"])
    assert ended["status"] == "completed"
    assert ended["response"]["metadata"]["tool_calls"][0]["success"] is True
