"""agentq.client (sync and async) on API.md 1.1's approvals and schedules, against the live
stack: approve and deny a call that waits (202; a second decision is a Conflict), make, read,
list and cancel a schedule (DELETE 204)."""
from __future__ import annotations

import asyncio

import pytest

from agentq.client import AgentQ, AsyncAgentQ, Conflict
from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import uid, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture()
def aq(stack, admin_key):
    with AgentQ(stack.base, api_key=admin_key) as client:
        yield client


def awaiting_call(aq, job_id: str) -> dict:
    return wait_until(lambda: next((e.data for e in aq.events(job_id)
                                    if e.type == "approval_required"), None),
                      what="approval_required")


def test_approve_and_deny_with_the_sync_client(aq, script):
    marker = script([tool_calls(call("flaky.guarded", {"text": "a"})), text("approved it"),
                     tool_calls(call("flaky.guarded", {"text": "b"})), text("denied it")])
    job = aq.submit(f"{marker} one", user=uid("u"), channel=uid("c"))
    waiting = awaiting_call(aq, job.id)
    approved = aq.approve(job.id, waiting["tool_use_id"], arguments={"text": "edited"})
    assert approved.id == job.id
    done = aq.wait(job.id, timeout_s=120)
    assert done.content == "approved it" and done.response.tool_calls[0].success
    with pytest.raises(Conflict):
        aq.deny(job.id, waiting["tool_use_id"], reason="too late")

    second = aq.continue_(done.conversation_id, f"{marker} two")
    waiting = awaiting_call(aq, second.id)
    aq.deny(second.id, waiting["tool_use_id"], reason="no")
    ended = aq.wait(second.id, timeout_s=120)
    assert ended.content == "denied it" and not ended.response.tool_calls[0].success
    [resolved] = [e.data for e in aq.events(second.id) if e.type == "approval_resolved"]
    assert (resolved["decision"], resolved["reason"]) == ("denied", "no")


def test_schedules_with_the_sync_and_async_clients(stack, aq, admin_key, script):
    marker = script([text("hello")])
    job = aq.wait(aq.submit(f"{marker} hi", user=uid("u"), channel=uid("c")).id)
    made = aq.create_schedule(job.conversation_id, "later", delay_s=3600,
                              metadata={"by": "client"})
    assert (made["status"], made["runs"], made["last_job_id"], made["cron"]) == (
        "active", 0, None, None)
    assert aq.schedule(made["id"])["content"] == "later"
    assert [s["id"] for s in aq.schedules(conversation_id=job.conversation_id)] == [made["id"]]
    assert aq.schedules(conversation_id=job.conversation_id, status="done") == []
    aq.cancel_schedule(made["id"])
    assert aq.schedule(made["id"])["status"] == "cancelled"  # readable, never fires

    async def scenario():
        async with AsyncAgentQ(stack.base, api_key=admin_key) as client:
            cron = await client.create_schedule(job.conversation_id, "every day",
                                                cron="0 9 * * *", timezone="Europe/Berlin")
            listed = await client.schedules(conversation_id=job.conversation_id)
            shown = await client.schedule(cron["id"])
            await client.cancel_schedule(cron["id"])
            await client.cancel_schedule(cron["id"])  # again: nothing changes
            return cron, listed, shown

    cron, listed, shown = asyncio.run(scenario())
    assert cron["cron"] == "0 9 * * *" and cron["status"] == "active" and cron["next_run_at"]
    assert [s["id"] for s in listed] == [cron["id"], made["id"]] and shown["firings"] == []
    assert aq.schedules(conversation_id=job.conversation_id, status="active") == []
    assert [(s["id"], s["status"]) for s in aq.schedules(
        conversation_id=job.conversation_id, status="cancelled")] == [
        (cron["id"], "cancelled"), (made["id"], "cancelled")]
