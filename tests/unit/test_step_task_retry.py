"""A step task that could not reach the database is tried again by Celery (its
DATABASE_RETRIES), on real Postgres: the job goes on at once, not at the sweeper's next
re-drive (the step deadline, 300 s by default). The benchmark's burst of 300 first steps
saw 270 of them time out on the connection pool, and each of those jobs waited five
minutes for the sweeper. The task runs eagerly (`apply`): Celery then runs its retries at
once, in order, as a worker would run them after their countdowns."""
from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from agentq.loop.step import Stepper
from agentq.models import ToolCall
from agentq.testing.harness import calls, text
from tasks import base, orchestrator, tools


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: the
    database errors tested are psycopg2's."""
    return make_pg


class Unreachable:
    """Sessions from `sessions`, but the first `failures` fail as a database that is away
    (or a pool with no free connection) fails them."""

    def __init__(self, sessions, failures: list[BaseException]):
        self.sessions, self.failures = sessions, list(failures)
        self.failed = 0

    def __call__(self):
        if self.failures:
            self.failed += 1
            raise self.failures.pop(0)
        return self.sessions()


def _services(monkeypatch, h, sessions) -> None:
    stepper = Stepper(h.settings, h.router, h.registry, sessions)
    monkeypatch.setattr(base, "_services",
                        base.Services(h.settings, sessions, h.registry, h.router, stepper))


def test_a_step_that_could_not_reach_the_database_is_tried_again_and_the_job_goes_on(
        make, monkeypatch, caplog):
    # given a queued job, and a database that refuses the step's first two connections
    h = make(text("4"))
    job_id = h.submit()
    away = OperationalError("BEGIN", {}, Exception("could not connect to server"))
    busy = PoolTimeout("QueuePool limit of size 10 overflow 20 reached")
    sessions = Unreachable(h.sessions, [away, busy])
    _services(monkeypatch, h, sessions)
    # when its step task runs
    result = orchestrator.step.apply(args=(job_id, 0), kwargs={"cause": "start"})
    # then the task tried again until the database answered, and the job completed
    assert sessions.failed == 2
    assert result.successful(), result.traceback
    assert h.job(job_id).status == "completed"
    assert len(h.router.requests) == 1  # the failed tries never reached the model
    # and each retry was told at WARNING (Celery's own line is at INFO, not heard)
    told = [r for r in caplog.records if r.getMessage() == "task will be tried again"]
    assert [(r.levelname, r.task, r.error, r.retries) for r in told] == [
        ("WARNING", "orchestrator.step", "OperationalError", 0),
        ("WARNING", "orchestrator.step", "TimeoutError", 1)]


def test_a_step_whose_database_stays_away_gives_up_to_the_sweeper(make, monkeypatch):
    # given a database away for longer than the task's retries
    h = make(text("4"))
    job_id = h.submit()
    away = OperationalError("BEGIN", {}, Exception("could not connect to server"))
    sessions = Unreachable(h.sessions, [away] * 20)
    _services(monkeypatch, h, sessions)
    # when its step task runs
    result = orchestrator.step.apply(args=(job_id, 0), kwargs={"cause": "start"})
    # then it stopped after its retries, the job untouched and still live: the sweeper's
    assert sessions.failed == 1 + base.DATABASE_RETRIES["max_retries"]
    assert result.failed() and isinstance(result.result, OperationalError)
    job = h.job(job_id)
    assert job.status == "queued" and job.step_owner is None


def test_a_tool_task_that_could_not_reach_the_database_runs_its_call_on_a_retry(
        make, monkeypatch):
    # given a job whose first step asked for a tool call, sent to a tool worker whose first
    # session fails (the pool had no free connection)
    h = make(calls(("math.evaluate", {"expression": "6*7"})), text("42"))
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    (call,) = h.rows(ToolCall, job_id)
    busy = PoolTimeout("QueuePool limit of size 10 overflow 20 reached")
    sessions = Unreachable(h.sessions, [busy])
    _services(monkeypatch, h, sessions)
    # when its tool task runs
    result = tools.execute.apply(args=(call.tool_use_id,))
    # then the call ran on the retry and its result is stored: the task did not fail (its
    # error callback would have answered the call `tool_task_failed`, never run)
    assert sessions.failed == 1
    assert result.successful(), result.traceback
    (call,) = h.rows(ToolCall, job_id)
    assert call.status == "succeeded" and call.result["result"]["result"] == 42
    assert call.attempts == 1


def test_a_reply_whose_write_could_not_reach_the_database_is_written_when_it_answers(
        make, monkeypatch, caplog):
    caplog.set_level("INFO", logger="agentq.db")  # riding_out logs the retried write
    # given a queued job, and a database that goes away while the model answers: the
    # reply's write fails twice
    h = make(text("4"))
    job_id = h.submit()
    away = OperationalError("BEGIN", {}, Exception("could not connect to server"))
    failures = [away, away]

    def sessions():
        if h.router.requests and failures:
            raise failures.pop(0)
        return h.sessions()
    _services(monkeypatch, h, sessions)
    # when its step task runs
    result = orchestrator.step.apply(args=(job_id, 0), kwargs={"cause": "start"})
    # then the reply was kept and written once the database answered: the model was asked
    # once (not billed twice), and the job completed with its answer
    assert not failures
    assert result.successful(), result.traceback
    assert len(h.router.requests) == 1
    job = h.job(job_id)
    assert job.status == "completed" and job.response["content"] == "4"
    assert any(r.getMessage() == "model reply stored after the database came back"
               for r in caplog.records)
