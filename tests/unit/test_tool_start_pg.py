"""A tool call's start on Postgres (issue 34: round trips per job): its first delivery is
loaded and started in one statement, the job's row locked first; any other delivery is
decided as before, on the call read again under that lock."""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from agentq.db import lock_row
from agentq.loop import execute
from agentq.loop.uow import UnitOfWork
from agentq.models import Job, ToolCall
from agentq.testing.harness import calls
from tests.support.sql import sql_sent, wire_sent
from tests.support.tool_turns import pending_call

JOIN_S = 60
"""A failure bound for a thread that waits on a row lock, never a measured margin."""
TOOL = "files.create_document"


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: the statement folded is
    Postgres's."""
    return make_pg


def _prepare(h, tool_use_id: str, wire: list[str] | None = None
             ) -> tuple[execute.Prepared, list[str]]:
    """`execute._prepare` in a unit of work as `execute_tool_call` opens it; the statements
    sent (and, in `wire`, the round trips)."""
    with sql_sent(h.sessions.kw["bind"]) as statements, wire_sent() as sent:
        with UnitOfWork(h.sessions, durable=False, lone=True) as uow:
            prepared = execute._prepare(uow, tool_use_id, h.settings, h.registry, h.sessions)
    if wire is not None:
        wire.extend(s for s in sent if not s.startswith(("PREPARE", "DEALLOCATE")))
    return prepared, statements


def _call(h, tool_use_id: str) -> ToolCall:
    with h.sessions() as session:
        return session.execute(select(ToolCall).where(
            ToolCall.tool_use_id == tool_use_id)).scalar_one()


def test_a_calls_first_delivery_is_loaded_and_started_in_one_statement(make):
    # given a call no delivery has started
    h = make(calls((TOOL, {"title": "A", "content": "a"})))
    job_id, tool_use_id = pending_call(h)
    # when its first delivery comes
    wire: list[str] = []
    prepared, statements = _prepare(h, tool_use_id, wire)
    # then one statement read it with its job's row locked and started it: its attempt
    # counted and its lease taken, and the delivery runs it with its caller's context; that
    # statement was its transaction, one round trip with no BEGIN or COMMIT of its own
    assert len(statements) == 1 and "FOR UPDATE OF jobs" in statements[0]
    assert len(wire) == 1 and not wire[0].startswith("BEGIN") and "COMMIT" not in wire[0]
    assert isinstance(prepared, execute.Run) and prepared.name == TOOL
    assert prepared.ctx.job_id == str(job_id) and prepared.ctx.tool_use_id == tool_use_id
    call = _call(h, tool_use_id)
    assert call.attempts == 1 and call.status == "pending"
    assert call.lease_until == prepared.lease_until and call.started_at is not None


def test_a_copy_delivered_while_the_call_runs_starts_nothing(make):
    # given a call a live delivery runs (its lease not run out)
    h = make(calls((TOOL, {"title": "A", "content": "a"})))
    _job_id, tool_use_id = pending_call(h)
    first, _ = _prepare(h, tool_use_id)
    # when a copy is delivered
    prepared, statements = _prepare(h, tool_use_id)
    # then it waits for the other's result, and the call is as the first left it
    assert prepared == execute.rules.Elsewhere() and len(statements) == 1
    call = _call(h, tool_use_id)
    assert call.attempts == 1 and call.lease_until == first.lease_until


def test_an_idempotent_call_whose_delivery_died_is_started_again_on_a_fresh_read(make):
    # given an idempotent call whose delivery died (its lease ran out, no result)
    h = make(calls((TOOL, {"title": "A", "content": "a"})))
    _job_id, tool_use_id = pending_call(h)
    long_ago = datetime(2020, 1, 1, tzinfo=timezone.utc)
    with h.sessions() as session, session.begin():
        session.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id)
                        .values(attempts=1, started_at=long_ago, lease_until=long_ago))
    # when it is delivered again
    wire: list[str] = []
    prepared, statements = _prepare(h, tool_use_id, wire)
    # then it is read again with its job's row held, and started as its second delivery,
    # in a transaction of its own after the first statement's (which wrote nothing)
    assert isinstance(prepared, execute.Run) and len(statements) == 3
    assert _call(h, tool_use_id).attempts == 2
    assert len(wire) == 4 and not wire[0].startswith("BEGIN")
    assert wire[1].startswith("BEGIN; ") and wire[3] == "COMMIT"


def test_the_first_start_waits_for_the_jobs_row_without_holding_the_calls(make):
    # given a call, and a writer holding its job's row (a step, a cancel)
    h = make(calls((TOOL, {"title": "A", "content": "a"})))
    job_id, tool_use_id = pending_call(h)
    with h.sessions() as holder, holder.begin():
        lock_row(holder, Job, job_id, load=False)
        # when its first delivery comes meanwhile
        out: list[execute.Prepared] = []
        thread = threading.Thread(target=lambda: out.append(_prepare(h, tool_use_id)[0]),
                                  daemon=True)
        thread.start()
        thread.join(1.0)
        # then it waits for the job's row, not holding the call's
        assert thread.is_alive()
        with h.sessions() as other, other.begin():
            assert other.execute(select(ToolCall.id).where(ToolCall.tool_use_id == tool_use_id)
                                 .with_for_update(nowait=True)).first() is not None
    thread.join(JOIN_S)
    [prepared] = out
    assert isinstance(prepared, execute.Run)
    assert _call(h, tool_use_id).attempts == 1
    assert prepared.lease_until > datetime.now(timezone.utc) - timedelta(minutes=1)
