"""A tool call's result stored on Postgres (issue 34: round trips per job): the job's row
locked, the result stored on a pending call and its event written, in one statement, and
the event announced after the commit as before."""
from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import select

from agentq.db import lock_row
from agentq.loop import execute, store
from agentq.loop.execute import CallOutcome
from agentq.models import Job, JobEvent, ToolCall
from agentq.testing.harness import calls
from tests.support.sql import sql_sent, wire_sent
from tests.support.tool_turns import pending_call

JOIN_S = 60
"""A failure bound for a thread that waits on a row lock, never a measured margin."""
TOOL = "files.create_document"
RESULT = {"ok": True, "result": {"file_id": "f-1"}, "error": None, "attempts": 1}


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: the statement folded is
    Postgres's."""
    return make_pg


def _finish(h, job_id: uuid.UUID, tool_use_id: str, record: dict) -> CallOutcome:
    return execute._finish(tool_use_id, job_id, TOOL, "succeeded", record, h.settings,
                           h.sessions)


def _events(h, job_id: uuid.UUID) -> tuple[list[tuple[int, str]], int]:
    with h.sessions() as session:
        rows = session.execute(select(JobEvent.seq, JobEvent.type)
                               .where(JobEvent.job_id == job_id)
                               .order_by(JobEvent.seq)).all()
        return [tuple(r) for r in rows], session.get(Job, job_id).event_seq


def test_a_result_is_stored_with_its_event_in_one_statement_and_announced(make, monkeypatch):
    # given a call of a job's turn (joined by the chord, the default), and an observer of
    # the events committed
    h = make(calls((TOOL, {"title": "A", "content": "a"})), AGENTQ_TOOL_JOIN="chord")
    job_id, tool_use_id = pending_call(h)
    heard: list[tuple[str, list[dict]]] = []
    monkeypatch.setattr(store, "_event_hooks", [lambda job, events: heard.append((job, events))])
    # when its result is stored
    with sql_sent(h.sessions.kw["bind"]) as statements, wire_sent() as wire:
        outcome = _finish(h, job_id, tool_use_id, RESULT)
    # then one statement locked the job, stored the result and wrote its event, a
    # transaction of its own: one round trip, no BEGIN or COMMIT sent for it
    assert outcome == CallOutcome(tool_use_id, "succeeded")
    assert len(statements) == 1 and "FOR NO KEY UPDATE" in statements[0]
    [sent] = [s for s in wire if not s.startswith(("PREPARE", "DEALLOCATE"))]
    assert not sent.startswith("BEGIN") and not sent.endswith("COMMIT")
    with h.sessions() as session:
        call = session.execute(select(ToolCall).where(ToolCall.tool_use_id == tool_use_id)
                               ).scalar_one()
        assert call.status == "succeeded" and call.result == RESULT
        assert call.finished_at is not None
    events, counter = _events(h, job_id)
    assert [seq for seq, _ in events] == list(range(1, counter + 1))
    assert events[-1] == (counter, "tool_execution_end")
    # and the observers heard of it after the commit, as the API shows it
    [(job, [event])] = heard
    assert job == str(job_id) and event["seq"] == counter
    assert event["type"] == "tool_execution_end" and event["data"] == {
        "tool_use_id": tool_use_id, "name": TOOL, "ok": True, "error": None, "attempts": 1}


def test_a_second_result_of_a_call_writes_nothing(make):
    # given a call whose result is stored
    h = make(calls((TOOL, {"title": "A", "content": "a"})))
    job_id, tool_use_id = pending_call(h)
    _finish(h, job_id, tool_use_id, RESULT)
    before = _events(h, job_id)
    # when another delivery stores one too
    with sql_sent(h.sessions.kw["bind"]) as statements:
        outcome = _finish(h, job_id, tool_use_id, {**RESULT, "result": {"file_id": "f-2"}})
    # then it is a duplicate: the first result stays, no event, the counter unmoved
    assert outcome == CallOutcome(tool_use_id, "duplicate") and len(statements) == 1
    # (the next step is named by the first store only: tool_join=database)
    assert _events(h, job_id) == before
    with h.sessions() as session:
        assert session.execute(select(ToolCall.result).where(
            ToolCall.tool_use_id == tool_use_id)).scalar_one() == RESULT


def test_the_jobs_row_is_locked_before_the_calls(make):
    # given a call, and a writer holding its job's row (a step's claim, a cancel)
    h = make(calls((TOOL, {"title": "A", "content": "a"})))
    job_id, tool_use_id = pending_call(h)
    with h.sessions() as holder, holder.begin():
        lock_row(holder, Job, job_id, load=False)
        # when the result is stored meanwhile
        out: list[CallOutcome] = []
        thread = threading.Thread(target=lambda: out.append(
            _finish(h, job_id, tool_use_id, RESULT)), daemon=True)
        thread.start()
        thread.join(1.0)
        # then it waits for the job's row without holding the call's (as the holder, which
        # may write the call next, takes them in that order)
        assert thread.is_alive()
        with h.sessions() as other, other.begin():
            assert other.execute(select(ToolCall.id).where(ToolCall.tool_use_id == tool_use_id)
                                 .with_for_update(nowait=True)).first() is not None
    thread.join(JOIN_S)
    # and, the turn's last call (tool_join=database), names the next step
    assert out == [CallOutcome(tool_use_id, "succeeded", (str(job_id), 1))]
