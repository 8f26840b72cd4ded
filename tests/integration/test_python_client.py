"""agentq.client (sync and async) against the live stack: submit with idempotency, wait,
events and their live stream, cancel, batches, replay, deliveries, and the webhook verifier
on a real delivery."""
from __future__ import annotations

import asyncio
import time

import pytest

from agentq.client import (
    AgentQ,
    AsyncAgentQ,
    Conflict,
    NotFound,
    Timeout,
    WebhookVerificationError,
    verify_webhook,
)
from agentq.testing.scripted_llm import call, held, text, tool_calls
from tests.support.api import TEST_ENV, own_events_start, uid

pytestmark = pytest.mark.integration


def until(predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture()
def aq(stack, admin_key):
    with AgentQ(stack.base, api_key=admin_key) as client:
        yield client


def test_submit_wait_and_read_a_job_with_a_tool_call(aq, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("It is 42.")])
    job = aq.submit(f"{marker} What is 6*7?", user=uid("u"), channel=uid("c"),
                    metadata={"ticket": 7})
    assert job.status in ("queued", "running") and not job.ended
    done = aq.wait(job.id, timeout_s=120)
    assert done.status == "completed" and done.finish_reason == "end_turn"
    assert done.content == "It is 42." and done.metadata == {"ticket": 7}
    assert [(c.name, c.success) for c in done.response.tool_calls] == [("math.evaluate", True)]
    assert done.usage.input_tokens > 0 and done.finished_at >= done.created_at
    types = [e.type for e in aq.events(job.id)]
    assert own_events_start(types) == "job_start"  # job_redriven may come first
    assert types[-1] == "job_end" and "tool_execution_end" in types
    history = aq.messages(done.conversation_id)
    assert [m["role"] for m in history][0] == "user"


def test_the_same_idempotency_key_gives_the_same_job(aq, script):
    marker = script([text("once")])
    user, channel, key = uid("u"), uid("c"), uid("idem")
    first = aq.submit(f"{marker} hi", user=user, channel=channel, idempotency_key=key)
    again = aq.submit(f"{marker} hi", user=user, channel=channel, idempotency_key=key)
    assert again.id == first.id
    assert aq.wait(first.id, timeout_s=120).content == "once"


def test_stream_yields_each_event_once_in_order_until_job_end(aq, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "1+1"}), delay_s=0.5),
                     text("two", delay_s=0.5)])
    job = aq.submit(f"{marker} go", user=uid("u"), channel=uid("c"))
    streamed = list(aq.stream(job.id))
    assert [e.seq for e in streamed] == sorted({e.seq for e in streamed})
    assert streamed[-1].type == "job_end"
    assert [e.seq for e in streamed] == [e.seq for e in aq.events(job.id)]
    # resuming after an event gives only what came after it
    resumed = list(aq.stream(job.id, after=streamed[2].seq))
    assert [e.seq for e in resumed] == [e.seq for e in streamed[3:]]


def test_wait_gives_up_with_the_job_as_last_seen(aq, script, gate):
    marker = script([text("slow", hold=gate)])
    job = aq.submit(f"{marker} go", user=uid("u"), channel=uid("c"))
    with pytest.raises(Timeout) as caught:
        aq.wait(job.id, timeout_s=0)
    assert caught.value.job.id == job.id and not caught.value.job.ended
    gate.set()
    assert aq.wait(job.id, timeout_s=120).content == "slow"


def test_cancel_a_running_job_then_a_second_cancel_is_a_conflict(aq, script, gate):
    marker = script([held(tool_calls(call("math.evaluate", {"expression": "1+1"})), gate)])
    job = aq.submit(f"{marker} go", user=uid("u"), channel=uid("c"))
    until(lambda: aq.job(job.id).status == "running")  # in the model call, held
    aq.cancel(job.id)
    gate.set()
    ended = aq.wait(job.id, timeout_s=120)
    assert ended.status == "cancelled"
    with pytest.raises(Conflict) as caught:
        aq.cancel(job.id)
    assert caught.value.status == 409 and caught.value.code


def test_an_absent_job_is_not_found_in_the_error_shape(aq):
    with pytest.raises(NotFound) as caught:
        aq.job("00000000-0000-0000-0000-000000000000")
    assert caught.value.status == 404 and caught.value.message


def test_a_batch_runs_and_its_results_come_in_request_order(aq, script):
    marker = script([text("a"), text("b"), text("c")])
    requests = [{"platform": "api", "platform_user_id": uid("u"),
                 "platform_channel_id": uid("c"), "content": f"{marker} {n}",
                 "custom_id": f"r{n}"} for n in range(3)]
    batch = aq.submit_batch(requests, max_concurrency=1)
    assert batch.counts.total == 3
    done = aq.wait_batch(batch.id, timeout_s=180, poll_s=0.2)
    assert done.status == "completed" and done.counts.completed == 3
    results = list(aq.batch_results(batch.id))
    assert [r.custom_id for r in results] == ["r0", "r1", "r2"]
    assert sorted(r.job.content for r in results) == ["a", "b", "c"]
    assert all(r.job.batch_id == batch.id for r in results)


def test_a_recorded_replay_answers_as_the_original(aq, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "2*3"})),
                     text("six")])
    original = aq.wait(aq.submit(f"{marker} go", user=uid("u"), channel=uid("c")).id,
                       timeout_s=120)
    replay = aq.wait(aq.replay(original.id, mode="recorded").id, timeout_s=120)
    assert replay.replay_of == original.id and replay.content == "six"


def test_the_webhook_verifier_accepts_a_real_delivery_and_refuses_a_forgery(
        aq, script, receiver):
    url = receiver.url("/client")
    marker = script([text("Done.")])
    job = aq.wait(aq.submit(f"{marker} hi", user=uid("u"), channel=uid("c"),
                            callback_url=url).id, timeout_s=120)
    delivered = receiver.wait_for("/client", 1)[0]
    secret = TEST_ENV["AGENTQ_WEBHOOK_SECRET"]
    event = verify_webhook(secret, delivered["body"], delivered["headers"])
    assert event.type == "job.completed" and event.job.id == job.id
    assert event.id == delivered["webhook_id"] and event.job.content == "Done."
    assert [d.event_id for d in aq.deliveries(job.id)] == [event.id]
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, delivered["body"].replace(b"Done.", b"Paid."),
                       delivered["headers"])
    with pytest.raises(WebhookVerificationError):
        verify_webhook("whsec_" + "QUJD" * 8, delivered["body"], delivered["headers"])


def test_the_async_client_submits_streams_and_cancels(stack, admin_key, script, gate):
    marker = script([tool_calls(call("math.evaluate", {"expression": "3*3"})), text("nine"),
                     held(tool_calls(call("math.evaluate", {"expression": "1+1"})), gate)])

    async def scenario():
        async with AsyncAgentQ(stack.base, api_key=admin_key) as aq:
            job = await aq.submit(f"{marker} go", user=uid("u"), channel=uid("c"))
            types = [e.type async for e in aq.stream(job.id)]
            done = await aq.wait(job.id, timeout_s=120)
            second = await aq.submit(f"{marker} again", user=uid("u"), channel=uid("c"))
            while (await aq.job(second.id)).status != "running":  # in the model call, held
                await asyncio.sleep(0.05)
            await aq.cancel(second.id)
            gate.set()
            cancelled = await aq.wait(second.id, timeout_s=120)
            with pytest.raises(NotFound):
                await aq.job("00000000-0000-0000-0000-000000000000")
            return types, done, cancelled

    types, done, cancelled = asyncio.run(scenario())
    assert own_events_start(types) == "job_start"
    assert types[-1] == "job_end"
    assert done.content == "nine" and cancelled.status == "cancelled"


@pytest.fixture()
def run_async(stack, admin_key):
    """Runs `scenario(aq)` with an AsyncAgentQ on the live stack; returns its result."""
    def run(scenario):
        async def main():
            async with AsyncAgentQ(stack.base, api_key=admin_key) as aq:
                return await scenario(aq)
        return asyncio.run(main())
    return run


def test_the_async_client_runs_a_batch_and_reads_its_results_in_request_order(
        run_async, script):
    marker = script([text("a"), text("b"), text("c")])
    requests = [{"platform": "api", "platform_user_id": uid("u"),
                 "platform_channel_id": uid("c"), "content": f"{marker} {n}",
                 "custom_id": f"r{n}"} for n in range(3)]

    async def scenario(aq):
        batch = await aq.submit_batch(requests, max_concurrency=1)
        done = await aq.wait_batch(batch.id, timeout_s=180, poll_s=0.2)
        return batch, done, await aq.batch_results(batch.id), await aq.batch(batch.id)

    batch, done, results, again = run_async(scenario)
    assert batch.counts.total == 3 and not batch.ended
    assert done.status == "completed" and done.counts.completed == 3 and done.ended
    assert again == done
    assert [r.custom_id for r in results] == ["r0", "r1", "r2"]
    assert [r.batch_index for r in results] == [0, 1, 2]
    assert sorted(r.job.content for r in results) == ["a", "b", "c"]
    assert all(r.job.batch_id == batch.id and r.job.status == "completed" for r in results)


def test_the_async_client_cancels_a_batch(run_async, script, gate, llm):
    marker = script([held(text("first"), gate)])
    requests = [{"platform": "api", "platform_user_id": uid("u"),
                 "platform_channel_id": uid("c"), "content": f"{marker} {n}"}
                for n in range(3)]

    async def scenario(aq):
        batch = await aq.submit_batch(requests, max_concurrency=1)
        while not llm.requests(marker.split(":", 1)[1]):  # the first job, held in its call
            await asyncio.sleep(0.05)
        cancelled = await aq.cancel_batch(batch.id)
        gate.set()
        done = await aq.wait_batch(batch.id, timeout_s=180, poll_s=0.2)
        with pytest.raises(Conflict):
            await aq.cancel_batch(batch.id)
        with pytest.raises(NotFound):
            await aq.batch("00000000-0000-0000-0000-000000000000")
        return cancelled, done, await aq.batch_results(batch.id)

    cancelled, done, results = run_async(scenario)
    assert cancelled.id == done.id
    assert done.status == "cancelled" and done.ended
    # the held reply came back after the cancel: no job of the batch completed
    assert done.counts.total == 3 and done.counts.completed == 0
    assert done.counts.cancelled + done.counts.failed == 3
    assert {r.job.status for r in results} <= {"cancelled", "failed"}
    assert sorted(r.batch_index for r in results) == [r.batch_index for r in results]


def test_the_async_client_replays_a_job_and_a_batch_of_jobs(run_async, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "2*3"})), text("six"),
                     text("seven")])

    async def scenario(aq):
        first = await aq.wait((await aq.submit(f"{marker} go", user=uid("u"),
                                               channel=uid("c"))).id, timeout_s=120)
        second = await aq.wait((await aq.submit(f"{marker} again", user=uid("u"),
                                                channel=uid("c"))).id, timeout_s=120)
        replay = await aq.wait((await aq.replay(first.id, mode="recorded")).id,
                               timeout_s=120)
        batch = await aq.replay_batch(job_ids=[first.id, second.id], mode="recorded")
        done = await aq.wait_batch(batch.id, timeout_s=180, poll_s=0.2)
        return first, second, replay, done, await aq.batch_results(batch.id)

    first, second, replay, done, results = run_async(scenario)
    assert (first.content, second.content) == ("six", "seven")
    assert replay.replay_of == first.id and replay.content == "six"
    assert [c.name for c in replay.response.tool_calls] == ["math.evaluate"]
    assert done.status == "completed" and done.counts.completed == 2
    by_original = {r.job.replay_of: r.job for r in results}
    assert set(by_original) == {first.id, second.id}
    assert by_original[first.id].content == "six" and by_original[second.id].content == "seven"
