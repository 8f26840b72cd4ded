"""A job whose provider keeps failing with transient errors waits, then goes on: driven
without Celery (a scripted router, SQLite), as tests/unit/test_step.py does."""
from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import update

from agentq.db import utcnow
from agentq.errors import ProviderError
from agentq.loop.effects import DispatchTools, JobEnded, NextStep
from agentq.loop.execute import execute_tool_call
from agentq.loop.provider_wait import sweep_provider_waits
from agentq.loop.submit import cancel
from agentq.loop.uow import UnitOfWork
from agentq.models import Job, JobEvent, Message, TokenLog, ToolCall
from agentq.testing.harness import calls, text
from agentq.views import job_object

WAIT_ENV = {"AGENTQ_PROVIDER_WAIT_S": "600", "AGENTQ_PROVIDER_RETRY_BASE_S": "10",
            "AGENTQ_PROVIDER_RETRY_MAX_S": "60"}


def storm(retry_after_s=None) -> ProviderError:
    return ProviderError("every model failed", [{"model": "m", "error": "HTTP 429",
                                                 "status": 429}],
                         transient=True, retry_after_s=retry_after_s)


def due_now(h, job_id: str) -> None:
    """The job's next attempt time has come (instead of sleeping until it)."""
    with h.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
            provider_next_attempt_at=utcnow() - timedelta(seconds=1)))


def event_types(h, job_id: str) -> list[str]:
    return [e.type for e in h.rows(JobEvent, job_id, JobEvent.seq)]


def test_a_transient_failure_parks_the_job_with_a_delayed_step(make):
    h = make(storm(retry_after_s=7.0), **WAIT_ENV)
    job_id = h.submit()
    before = utcnow()
    effects = h.stepper.run(job_id, 0, "start")
    [step] = effects
    assert isinstance(step, NextStep)
    assert (step.job_id, step.iteration, step.cause) == (job_id, 0, "provider")
    assert step.not_before >= before + timedelta(seconds=7)  # Retry-After honoured
    job = h.job(job_id)
    assert (job.status, job.waiting_for, job.provider_attempts) == ("running", "provider", 1)
    assert job.step_owner is None and job.step_lease_until is None  # no worker holds it
    shown = job_object(job)
    assert (shown["status"], shown["waiting_for"]) == ("waiting", "provider")
    [waiting] = [e for e in h.rows(JobEvent, job_id) if e.type == "waiting_provider"]
    assert waiting.data["next_attempt_at"] == step.not_before.isoformat()
    assert waiting.data["attempt"] == 1 and waiting.data["error"] == "HTTP 429"
    assert h.rows(TokenLog, job_id) == []


def test_an_early_or_duplicate_step_claims_nothing(make):
    h = make(storm(), **WAIT_ENV)
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    assert h.stepper.run(job_id, 0, "provider") == []  # before its time: not called
    assert len(h.router.requests) == 1
    assert h.job(job_id).waiting_for == "provider"


def test_the_job_goes_on_when_the_provider_recovers_without_duplicates(make):
    # given a turn that ran a tool, then a provider that fails twice, then answers
    h = make(calls(("math.evaluate", {"expression": "6*7"})), storm(), storm(),
             text("42"), **WAIT_ENV)
    job_id = h.submit("6 times 7?")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    assert isinstance(dispatch, DispatchTools)
    for tool_use_id, _queue, _limit in dispatch.calls:
        execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    [again] = h.stepper.run(job_id, 1, "callback")
    assert (again.cause, h.job(job_id).provider_attempts) == ("provider", 1)
    due_now(h, job_id)
    [again] = h.stepper.run(job_id, 1, again.cause)
    job = h.job(job_id)
    assert (job.waiting_for, job.provider_attempts) == ("provider", 2)
    # when the provider answers
    due_now(h, job_id)
    effects = h.stepper.run(job_id, 1, again.cause)
    # then the job completes as if nothing happened
    assert effects == [JobEnded(job_id, "completed")]
    job = h.job(job_id)
    assert (job.status, job.waiting_for, job.provider_attempts) == ("completed", None, 0)
    assert job_object(job)["status"] == "completed"
    assert job.response["content"] == "42"
    assert [m.role for m in h.rows(Message, job_id, Message.seq)] == [
        "user", "tool_call", "tool_result", "assistant"]
    assert len(h.rows(ToolCall, job_id)) == 1
    assert [log.iteration for log in h.rows(TokenLog, job_id)] == [1, 2]
    types = event_types(h, job_id)
    assert types.count("turn_start") == 2 and types.count("turn_end") == 2, types
    assert types.count("waiting_provider") == 2
    # the question, two replies
    assert types.count("tool_execution_end") == 1 and types.count("message_end") == 3
    # a late duplicate of the delayed message does nothing
    assert h.stepper.run(job_id, 1, "provider") == []


def test_after_the_window_the_job_fails_with_provider_unavailable(make):
    h = make(storm(), storm(), AGENTQ_PROVIDER_WAIT_S="600")
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    with h.sessions() as session, session.begin():  # the window has passed
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
            provider_wait_since=utcnow() - timedelta(seconds=601),
            provider_next_attempt_at=utcnow()))
    effects = h.stepper.run(job_id, 0, "provider")
    assert effects == [JobEnded(job_id, "failed")]
    job = h.job(job_id)
    assert (job.status, job.finish_reason) == ("failed", "error")
    error = job.response["error"]
    assert error["code"] == "provider_unavailable"
    assert error["attempts_made"] == 2 and "HTTP 429" in error["message"]
    assert job_object(job)["waiting_for"] is None


def test_a_non_transient_error_fails_at_once(make):
    h = make(ProviderError("bad request", [{"model": "m", "error": "HTTP 400",
                                            "status": 400}]), **WAIT_ENV)
    job_id = h.submit()
    assert h.stepper.run(job_id, 0, "start") == [JobEnded(job_id, "failed")]
    job = h.job(job_id)
    assert job.response["error"]["code"] == "provider_error"
    assert "waiting_provider" not in event_types(h, job_id)


def test_cancelling_a_waiting_job_ends_it_now(make):
    h = make(storm(), **WAIT_ENV)
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    with UnitOfWork(h.sessions) as uow:
        cancel(uow, uow.session.get(Job, uuid.UUID(job_id)))
    effects = uow.sent
    [step] = [e for e in effects if isinstance(e, NextStep)]
    assert step.not_before is None
    assert h.stepper.run(job_id, step.iteration, step.cause) == [JobEnded(job_id,
                                                                          "cancelled")]
    assert len(h.router.requests) == 1  # the provider was not called again


def test_the_sweeper_resends_an_overdue_attempt_without_counting_it(make):
    h = make(storm(), text("back"), **WAIT_ENV)
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    assert h.sent_by(sweep_provider_waits, h.settings, h.sessions) == []  # not overdue
    with h.sessions() as session, session.begin():  # its delayed message was lost
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
            provider_next_attempt_at=utcnow() - timedelta(hours=1)))
    [resent] = h.sent_by(sweep_provider_waits, h.settings, h.sessions)
    assert (resent.job_id, resent.iteration) == (job_id, 0)
    assert h.job(job_id).redrives == 0
    assert h.stepper.run(job_id, 0, resent.cause) == [JobEnded(job_id, "completed")]
