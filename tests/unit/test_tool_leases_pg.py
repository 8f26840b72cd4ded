"""A running tool call's lease lives on its `tool_calls` row alone (issue 34: the jobs row
is touched only when the job's state changes). Its renewals write the call, not the job
(its start: tests/unit/test_claim_pg.py); the sweeper reads the leases of the job's current
turn to tell a slow tool (its worker renews) from a dead one (its lease ran out), on real
Postgres."""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import update

from agentq.db import utcnow
from agentq.loop.effects import NextStep
from agentq.loop.execute import Run, _prepare, tool_leases
from agentq.loop.uow import UnitOfWork
from agentq.models import Job, ToolCall
from agentq.testing.harness import Harness, calls, text
from tests.support.sql import sql_sent


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: the statements sent are what
    is counted."""
    return make_pg


def _a_tool_turn(h: Harness) -> tuple[str, str]:
    """A job whose first step asked for one tool call: its id and the call's."""
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    (call,) = h.rows(ToolCall, job_id)
    return job_id, call.tool_use_id


def _start(h: Harness, tool_use_id: str) -> Run:
    """A delivery of the call starts it (what the tool task does before running the tool)."""
    with UnitOfWork(h.sessions, durable=False) as unit:
        prepared = _prepare(unit, tool_use_id, h.settings, h.registry, h.sessions)
    assert isinstance(prepared, Run)
    return prepared


def _the_deadline_passes(h: Harness, job_id: str) -> None:
    """A whole step deadline goes by without the job's row being written."""
    with h.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
            last_progress_at=utcnow() - timedelta(hours=1)))


def test_a_renewal_writes_the_call_and_not_its_job(make):
    # given a started call whose tool runs
    h = make(calls(("math.evaluate", {"expression": "6*7"})), text("42"))
    job_id, tool_use_id = _a_tool_turn(h)
    run = _start(h, tool_use_id)
    keeper = tool_leases(h.settings, h.sessions)
    with keeper.hold(job_id, tool_use_id, run.lease_until):
        # when its worker renews the lease
        with sql_sent(h.sessions.kw["bind"]) as statements:
            assert keeper.renew([tool_use_id]) == 1
    # then one statement, on tool_calls only
    assert [s.split()[:2] for s in statements] == [["UPDATE", "tool_calls"]]
    assert h.job(job_id).redrive_after is None
    (call,) = h.rows(ToolCall, job_id)
    assert call.lease_until > run.lease_until


def test_the_sweeper_leaves_a_slow_tool_alone_and_re_drives_a_dead_one(make):
    # given a started call, and a whole deadline gone by since its job's last progress
    h = make(calls(("math.evaluate", {"expression": "6*7"})), text("42"))
    job_id, tool_use_id = _a_tool_turn(h)
    _start(h, tool_use_id)
    _the_deadline_passes(h, job_id)
    # when the sweeper passes while the call's lease lives (its worker renews it)
    # then it leaves the job alone
    assert h.sweep() == []
    # when the lease runs out unrenewed (the worker died)
    with h.sessions() as session, session.begin():
        session.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id)
                        .values(lease_until=utcnow() - timedelta(seconds=1)))
    # then the turn is re-driven
    assert h.sweep() == [NextStep(job_id, 1, "sweeper")]


def test_a_live_lease_of_an_earlier_turn_holds_nothing(make):
    # given a job re-driven into its next turn (its step crashed), while a call of its
    # first turn still holds a lease
    h = make(calls(("math.evaluate", {"expression": "6*7"})), text("42"))
    job_id, tool_use_id = _a_tool_turn(h)
    _start(h, tool_use_id)
    with h.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(iteration=2))
    _the_deadline_passes(h, job_id)
    # when the sweeper passes, then the job is re-driven: only its current turn's calls count
    assert h.sweep() == [NextStep(job_id, 2, "sweeper")]
