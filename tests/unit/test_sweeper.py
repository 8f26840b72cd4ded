"""The sweeper tells poison from backlog (issue 11), on real Postgres (SKIP LOCKED and the
claim's compare-and-set behave as in production).

Poison: a step a worker CLAIMED and never finished (its lease ran out) counts; after
AGENTQ_MAX_REDRIVES such crashes the job fails. Backlog: a re-drive nobody claimed never
counts; it is sent again after a delay that doubles up to AGENTQ_REDRIVE_BACKOFF_MAX_S.
"""
from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import update

from agentq.db import utcnow
from agentq.loop.effects import JobEnded, NextStep
from agentq.loop.sweeper import backlog, redrive_delay_s
from agentq.models import Job
from agentq.testing.harness import Harness, calls, text
from tests.support import unit_db


@pytest.fixture
def make(make_pg):
    return make_pg


def _time_passes(h: Harness, job_id: str, *, past_backoff: bool = True) -> None:
    """The deadline (and, unless told otherwise, the re-drive delay) has run out."""
    past = utcnow() - timedelta(hours=1)
    values = {"last_progress_at": past}
    if past_backoff:
        values["redrive_after"] = past
    with h.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(**values))


def _a_worker_claims_and_dies(h: Harness, job_id: str) -> None:
    """A worker takes the step (the real claim) and is killed before it progresses."""
    job = h.job(job_id)
    with h.sessions() as session, session.begin():
        assert h.stepper._claim(session, job.id, job.iteration, uuid.uuid4().hex) is not None
        session.execute(update(Job).where(Job.id == job.id).values(
            step_lease_until=utcnow() - timedelta(seconds=1)))


def _backlog(h: Harness) -> int:
    with h.sessions() as session:
        return backlog(session)


def test_a_job_nobody_consumes_is_redriven_with_backoff_and_never_failed(make):
    # given a job whose messages no worker ever takes, and a budget of one crash
    h = make(text("done"), AGENTQ_MAX_REDRIVES="1", AGENTQ_REDRIVE_BACKOFF_MAX_S="80")
    job_id = h.submit()
    delays = []
    for _ in range(8):  # many deadlines: an orchestrator down for a long while
        # when the deadline passes but not the backoff: nothing is sent
        _time_passes(h, job_id, past_backoff=False)
        if h.job(job_id).redrive_after is not None:
            assert h.sweep() == []
        # when the backoff passes too: it is re-driven, never failed
        _time_passes(h, job_id)
        before = utcnow()
        assert h.sweep() == [NextStep(job_id, 0, "sweeper")]
        job = h.job(job_id)
        assert job.status == "queued" and job.claimed_attempts == 0
        delays.append(round((job.redrive_after - before).total_seconds()))
    # then the waits double from the deadline up to the cap
    assert [abs(d - e) <= 1 for d, e in zip(delays, [10, 20, 40, 80, 80, 80, 80, 80],
                                               strict=True)] \
        == [True] * 8, delays
    # and the backlog shows it
    assert _backlog(h) == 1
    # when a worker finally takes it, it completes and leaves the backlog
    assert h.stepper.run(job_id, 0, "sweeper") == [JobEnded(job_id, "completed")]
    assert _backlog(h) == 0
    assert h.job(job_id).status == "completed"


def test_a_step_that_keeps_crashing_fails_after_max_claimed_attempts(make):
    # given a job whose step kills its worker each time it is taken
    h = make(AGENTQ_MAX_REDRIVES="2")
    job_id = h.submit()
    rounds = []
    for _ in range(3):
        _a_worker_claims_and_dies(h, job_id)
        _time_passes(h, job_id, past_backoff=False)  # a crash is re-driven without backoff
        rounds.append(h.sweep())
    # then two re-drives, and the third crash fails it
    assert rounds == [[NextStep(job_id, 0, "sweeper")], [NextStep(job_id, 0, "sweeper")],
                      [JobEnded(job_id, "failed")]]
    job = h.job(job_id)
    assert (job.status, job.finish_reason) == ("failed", "error")
    assert job.response["error"]["code"] == "stalled"
    assert job.response["error"]["claimed_attempts"] == 3
    # and a later sweep leaves the ended job alone
    _time_passes(h, job_id)
    assert h.sweep() == []


def test_unclaimed_redrives_do_not_spend_the_crash_budget(make):
    # given a budget of one crash, and a job left unconsumed for many re-drives
    h = make(text("done"), AGENTQ_MAX_REDRIVES="1")
    job_id = h.submit()
    for _ in range(5):
        _time_passes(h, job_id)
        assert h.sweep() == [NextStep(job_id, 0, "sweeper")]
    # when a worker then takes it and dies once
    _a_worker_claims_and_dies(h, job_id)
    _time_passes(h, job_id, past_backoff=False)
    # then it is re-driven (one crash is within budget), not failed
    assert h.sweep() == [NextStep(job_id, 0, "sweeper")]
    assert (h.job(job_id).claimed_attempts, h.job(job_id).status) == (1, "queued")
    # and the next worker completes it; progress resets the counts
    assert h.stepper.run(job_id, 0, "sweeper") == [JobEnded(job_id, "completed")]


def test_progress_resets_the_crash_count(make):
    # given a one-tool job whose first step crashed once (budget: one crash)
    h = make(calls(("math.evaluate", {"expression": "6*7"})), text("42"),
             AGENTQ_MAX_REDRIVES="1")
    job_id = h.submit()
    _a_worker_claims_and_dies(h, job_id)
    _time_passes(h, job_id, past_backoff=False)
    assert h.sweep() == [NextStep(job_id, 0, "sweeper")]
    # when the re-driven step advances the job (the model asks for a tool)
    effects = h.stepper.run(job_id, 0, "sweeper")
    assert effects and h.job(job_id).iteration == 1
    job = h.job(job_id)
    # then its crash count and re-drive state start over
    assert (job.claimed_attempts, job.redrives, job.redrive_after) == (0, 0, None)
    # and a crash of the next step is again within budget
    _a_worker_claims_and_dies(h, job_id)
    _time_passes(h, job_id, past_backoff=False)
    assert h.sweep() == [NextStep(job_id, 1, "sweeper")]


def test_the_delay_doubles_from_the_deadline_to_the_cap(tmp_path):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), "AGENTQ_STEP_DEADLINE_S": "20",
                                "AGENTQ_REDRIVE_BACKOFF_MAX_S": "300"})
    assert [redrive_delay_s(settings, n) for n in range(6)] == [20, 40, 80, 160, 300, 300]
    assert redrive_delay_s(settings, 10_000) == 300


# --- a step whose model call outlasts the deadline keeps its lease (issue 11, CI) --------

def _the_deadline_runs_out(h: Harness, job_id: str) -> None:
    """A whole step deadline passes: the claim's lease is behind us."""
    past = utcnow() - timedelta(seconds=1)
    with h.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
            last_progress_at=past - timedelta(hours=1), step_lease_until=past))


def test_a_model_call_longer_than_the_deadline_is_not_made_twice(make):
    # given a job whose model call outlasts the step deadline, this process renewing its
    # step's lease meanwhile (the keeper's thread, driven here by hand)
    swept = []

    def slow_model():
        _the_deadline_runs_out(h, job_id)
        assert h.stepper.leases.renew() == 1
        swept.extend(h.sweep())
        return text("done")

    h = make(slow_model)
    job_id = h.submit()
    # when the step runs, the sweeper passing while the model thinks
    effects = h.stepper.run(job_id, 0, "start")
    # then the sweeper took the step for alive: nothing re-driven, one model call, the
    # reply kept
    assert swept == []
    assert effects == [JobEnded(job_id, "completed")]
    assert len(h.router.requests) == 1
    assert h.job(job_id).response["content"] == "done"
    # and nothing is held once the step has ended
    assert h.stepper.leases.renew() == 0


def test_without_renewal_the_sweeper_takes_the_step_for_dead(make):
    # given the same slow model call, but a worker that renews nothing (it died)
    swept = []

    def slow_model():
        _the_deadline_runs_out(h, job_id)
        swept.extend(h.sweep())
        return text("done")

    h = make(slow_model)
    job_id = h.submit()
    effects = h.stepper.run(job_id, 0, "start")
    # then the job is re-driven, and the late reply is discarded (its lease is gone)
    assert swept == [NextStep(job_id, 0, "sweeper")]
    assert effects == []
    assert h.job(job_id).iteration == 0


def test_the_keeper_thread_renews_held_leases(make, pg_url, tmp_path):
    # given a keeper holding a claimed step whose lease has run out (its deadline is long,
    # so a renewed lease cannot lapse again while the test runs, however loaded the machine)
    from agentq.loop.leases import LeaseKeeper
    h = make(text("done"))
    job_id = h.submit()
    owner = uuid.uuid4().hex
    with h.sessions() as session, session.begin():
        assert h.stepper._claim(session, uuid.UUID(job_id), 0, owner) is not None
    _the_deadline_runs_out(h, job_id)
    # and another step whose lease has an hour left
    other, other_owner = h.submit(user="u-2"), uuid.uuid4().hex
    with h.sessions() as session, session.begin():
        assert h.stepper._claim(session, uuid.UUID(other), 0, other_owner) is not None
        session.execute(update(Job).where(Job.id == uuid.UUID(other)).values(
            step_lease_until=utcnow() + timedelta(hours=1)))
    far = h.job(other).step_lease_until
    keeper = LeaseKeeper(h.sessions, deadline_s=600.0)
    # when it holds both steps, its thread pushes the due lease ahead (no time limit: it
    # waits for the renewal to happen)
    with keeper.hold(other, other_owner, far), \
            keeper.hold(job_id, owner, h.job(job_id).step_lease_until):
        while h.job(job_id).step_lease_until <= utcnow():
            time.sleep(0.05)
        # then the lease runs a whole deadline from the renewal, and the sweeper leaves
        # the job alone
        assert h.job(job_id).step_lease_until > utcnow() + timedelta(seconds=300)
        assert h.sweep() == []
        # and the lease not yet due (an hour left, more than a third of a deadline) was
        # not written
        assert h.job(other).step_lease_until == far


def test_a_hold_wakes_the_keeper_only_for_a_lease_due_sooner(make):
    # given a keeper waiting for the one lease it holds (due in about an hour)
    import contextlib

    from agentq.loop.leases import LeaseKeeper
    h = make()
    keeper = LeaseKeeper(h.sessions, deadline_s=600.0)
    with contextlib.ExitStack() as held:
        held.enter_context(keeper.hold(uuid.uuid4(), "first",
                                       utcnow() + timedelta(hours=1)))
        while keeper._wakes_at is None:  # its thread has started and is waiting
            time.sleep(0.01)
        woken = keeper.wakeups
        # when 1,000 steps start whose leases are due later, as in-flight steps' are
        for i in range(1000):
            held.enter_context(keeper.hold(uuid.uuid4(), f"later-{i}",
                                           utcnow() + timedelta(hours=2)))
        # then its thread was not woken for any of them
        assert keeper.wakeups == woken
        # and a lease due now wakes it at once
        held.enter_context(keeper.hold(uuid.uuid4(), "due", utcnow()))
        while keeper.wakeups == woken:
            time.sleep(0.01)
