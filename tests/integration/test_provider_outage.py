"""Provider outages park jobs, not fail them: through the real stack (HTTP, Celery workers,
Postgres, Redis), with the scripted provider answering 429 (with and without Retry-After),
500 and hanging past the client's timeout for as long as a test says, then recovering.

The test settings (tests/support/api.py) make the delays short (0.2 to 1.5 s) and
the window long (15 minutes: no job of a loaded machine runs out of it), with a circuit that
opens after 15 transient failures; the test of a window that runs out has a stack of its own
with a 3 s window. No test asserts a
duration: each waits for outcomes, with generous timeouts."""
from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import func, select

from agentq.models import FileRecord, Job, JobEvent, Message, TokenLog, ToolCall
from agentq.testing.scripted_llm import call, error, hang, text, tool_calls
from tests.support.api import TEST_ENV, Client, uid
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration

WAIT_TIMEOUT_S = 120
STORM = [error(429, "slow down", headers={"retry-after": "1"}), error(429, "slow down"),
         error(500, "overloaded"), hang(8)]  # the client gives up after 5 s


def later_turns(request: dict) -> bool:
    """Requests that carry a tool's result: the storm hits after the tools ran."""
    return any(m.get("role") == "tool" for m in request.get("messages") or ())


def wait_until(what, check, timeout_s: float = WAIT_TIMEOUT_S, pause_s: float = 0.3):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(pause_s)


def counts(stack, job_id: str) -> dict[str, object]:
    job_uuid = uuid.UUID(job_id)
    with stack.sessions()() as s:
        def n(model, *where):
            return s.execute(select(func.count()).select_from(model).where(
                model.job_id == job_uuid, *where)).scalar_one()
        events = s.execute(select(JobEvent.type).where(JobEvent.job_id == job_uuid)
                           .order_by(JobEvent.seq)).scalars().all()
        return {
            "messages": s.execute(select(Message.role).where(Message.job_id == job_uuid)
                                  .order_by(Message.seq)).scalars().all(),
            "token_logs": s.execute(select(TokenLog.iteration).where(
                TokenLog.job_id == job_uuid).order_by(TokenLog.iteration)).scalars().all(),
            "tool_calls": n(ToolCall), "files": n(FileRecord),
            "tool_attempts": s.execute(select(ToolCall.attempts).where(
                ToolCall.job_id == job_uuid)).scalars().all(),
            "events": events,
            "job": s.get(Job, job_uuid),
        }


def test_a_storm_parks_jobs_which_complete_once_the_provider_recovers(client, llm, stack):
    # given more jobs than the orchestrator has threads (20), each writing a document and
    # then meeting a provider storm on its second model call
    # (a script per job: a job parked by the open circuit before its first call may make
    # that call after other jobs' second calls, so one shared script would hand it the
    # wrong reply)
    jobs = 24
    keys = [uid("storm").replace("-", "_") for _ in range(jobs)]
    for key in keys:
        llm.script(key, [tool_calls(call("files.create_document",
                                         {"title": "Report", "content": "# Hello"})),
                         text("Done: the report is stored.")])
        llm.storm(key, STORM, when=later_turns)
    try:
        ids = [client.submit(f"script:{key} write a report")["id"] for key in keys]

        # then every job waits for the provider: status waiting, waiting_for provider, and a
        # waiting_provider event that says when it tries again; none holds a step lease
        def all_waiting():
            shown = [client.get(f"/v1/jobs/{i}").json() for i in ids]
            return all(j["status"] == "waiting" for j in shown) and shown
        shown = wait_until("every job waiting for the provider", all_waiting)
        assert {j["waiting_for"] for j in shown} == {"provider"}
        for job_id in ids:
            waiting = [e for e in client.events(job_id) if e["type"] == "waiting_provider"]
            assert waiting and waiting[-1]["data"]["next_attempt_at"]
        with stack.sessions()() as s:
            holders = s.execute(select(func.count()).select_from(Job).where(
                Job.id.in_([uuid.UUID(i) for i in ids]), Job.waiting_for == "provider",
                Job.step_owner.is_not(None))).scalar_one()
        assert holders == 0
        # the circuit opened: far fewer calls reached the provider than the jobs' own retries
        # would have made (each job's step makes up to 6 attempts: 3 per model)
        assert sum(llm.storm_served[key] for key in keys) < jobs * 6
    finally:
        # when the provider recovers
        for key in keys:
            llm.calm(key)

    # then every job completes, once: no job failed, nothing was done twice
    ended = [client.wait(i, timeout_s=WAIT_TIMEOUT_S) for i in ids]
    assert [j["status"] for j in ended] == ["completed"] * jobs
    assert all(j["response"]["content"] == "Done: the report is stored." for j in ended)
    for job_id in ids:
        c = counts(stack, job_id)
        assert c["messages"] == ["user", "tool_call", "tool_result", "assistant"], c
        assert c["token_logs"] == [1, 2]
        assert (c["tool_calls"], c["files"], c["tool_attempts"]) == (1, 1, [1])
        events = c["events"]
        # the question, two replies
        assert events.count("turn_start") == 2 and events.count("message_end") == 3, events
        assert events.count("tool_execution_end") == 1 and events.count("job_end") == 1
        assert events.count("waiting_provider") >= 1
        job = c["job"]
        assert (job.waiting_for, job.provider_attempts, job.provider_wait_since) == (
            None, 0, None)
    for key in keys:
        llm.assert_done(key)


@pytest.fixture(scope="module")
def short_window(servers_up, llm, tmp_path_factory):
    """A stack of its own whose jobs wait at most 3 s for their provider."""
    with own_stack("short_wait", llm.base_url, tmp_path_factory.mktemp("short-wait"),
                   {**TEST_ENV, "AGENTQ_PROVIDER_WAIT_S": "3"}) as stack:
        yield Client(stack, stack.create_key("short-wait", admin=True))


def test_a_provider_that_never_recovers_fails_the_job_after_the_window(short_window, llm):
    client = short_window
    key = uid("down").replace("-", "_")
    llm.storm(key, [error(503, "unavailable"), error(429, headers={"retry-after": "1"})])
    try:
        job_id = client.submit(f"script:{key} hello")["id"]
        wait_until("the job to wait", lambda: client.get(f"/v1/jobs/{job_id}").json()[
            "status"] == "waiting")
        job = client.wait(job_id, timeout_s=WAIT_TIMEOUT_S)
    finally:
        llm.calm(key)
    assert (job["status"], job["finish_reason"]) == ("failed", "error")
    assert job["waiting_for"] is None
    error_ = job["response"]["error"]
    assert error_["code"] == "provider_unavailable"
    assert error_["attempts_made"] >= 2
    types = [e["type"] for e in client.events(job_id)]
    assert types.count("waiting_provider") >= 1 and types[-1] == "job_end"


def test_a_bad_request_fails_at_once(client, script):
    marker = script([error(400, "bad request"), error(400, "bad request")])
    job = client.wait(client.submit(f"{marker} hello")["id"])
    assert (job["status"], job["finish_reason"]) == ("failed", "error")
    assert job["response"]["error"]["code"] == "provider_error"
    assert "waiting_provider" not in [e["type"] for e in client.events(job["id"])]


def test_cancelling_a_waiting_job_ends_it_without_waiting_for_the_provider(client, llm):
    key = uid("cancel").replace("-", "_")
    llm.storm(key, [error(500)])
    try:
        job_id = client.submit(f"script:{key} hello")["id"]
        wait_until("the job to wait", lambda: client.get(f"/v1/jobs/{job_id}").json()[
            "status"] == "waiting")
        response = client.post(f"/v1/jobs/{job_id}/cancel")
        assert response.status_code == 202, response.text
        job = client.wait(job_id, timeout_s=WAIT_TIMEOUT_S)
    finally:
        llm.calm(key)
    # it ended cancelled (had the cancel been left to the next attempt after the window,
    # it would have ended failed, provider_unavailable)
    assert (job["status"], job["finish_reason"]) == ("cancelled", "cancelled")
