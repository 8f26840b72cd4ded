"""A tool turn on Postgres (issue 34: round trips per job): the calls and the message a
reply asks for go with its commit; the next step's claim reads the results, and their
messages go with the read of the next turn's context, which sees them."""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import select, text, update

from agentq.db import utcnow
from agentq.loop.execute import execute_tool_call
from agentq.models import Conversation, Job, Message, ToolCall
from agentq.testing.harness import calls
from agentq.testing.harness import text as reply
from agentq.tools.result import ToolResult
from tests.support.sql import blocked_by, sql_sent, wire_sent


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: the writes deferred are
    Postgres's."""
    return make_pg


def _round_trips(sent: list[str]) -> list[str]:
    """What went to Postgres, one string a round trip, its statements' preparing aside (a
    connection prepares a statement once, on its second run)."""
    return [s for s in sent
            if not s.startswith(("PREPARE", "DEALLOCATE", "SAVEPOINT agentq_prepare"))]


def _messages(h, job_id: str) -> tuple[Conversation, list[tuple[int, str]]]:
    with h.sessions() as session:
        conversation = session.get(Conversation, h.job(job_id).conversation_id)
        rows = session.execute(select(Message.seq, Message.role).where(
            Message.conversation_id == conversation.id).order_by(Message.seq)).all()
    return conversation, [tuple(r) for r in rows]


def test_a_replys_calls_message_and_events_go_with_its_commit(make):
    # given a job whose model asks for a tool
    h = make(calls(("math.evaluate", {"expression": "2+2"})))
    job_id = h.submit("2+2?", thread=f"t-{uuid.uuid4().hex[:8]}")
    # when its first step runs
    with sql_sent(h.sessions.kw["bind"]) as statements, wire_sent() as sent:
        [dispatch] = h.stepper.run(job_id, 0, "start")
    # then the reply's transaction was its compare-and-set, then one round trip with the
    # call, the message and the events in it, ended by the COMMIT (the step's first
    # transaction: the claim with the history, the question and the events with the COMMIT)
    wire = _round_trips(sent)
    assert len(wire) == 4 and wire[-1].rstrip().endswith("COMMIT")
    assert wire[1].rstrip().endswith("COMMIT")
    assert "INSERT INTO messages" in statements[1] and statements[1].startswith("WITH moved")
    assert "COMMIT" not in wire[-2]
    last = statements[-3:]
    assert last[0].startswith("INSERT INTO tool_calls")
    assert "INSERT INTO messages" in last[1] and "INSERT INTO job_events" in last[2]
    # and the rows are as before: the call pending and sent, the message numbered after
    # the question, the conversation's counter on it
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    with h.sessions() as session:
        call = session.execute(select(ToolCall).where(
            ToolCall.tool_use_id == tool_use_id)).scalar_one()
    assert call.status == "pending" and call.arguments == {"expression": "2+2"}
    conversation, messages = _messages(h, job_id)
    assert messages == [(1, "user"), (2, "tool_call")] and conversation.message_seq == 2


def test_a_turns_results_are_appended_with_the_read_of_the_next_context(make):
    # given a job whose tool has run
    h = make(calls(("math.evaluate", {"expression": "2+2"})), reply("4"))
    job_id = h.submit("2+2?", thread=f"t-{uuid.uuid4().hex[:8]}")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    for tool_use_id, _queue, _limit in dispatch.calls:
        execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions, join=False)
    # when the step after it runs
    with sql_sent(h.sessions.kw["bind"]) as statements, wire_sent() as sent:
        h.stepper.run(job_id, 1, "callback")
    # then it took five round trips: the claim with the calls' results and the turn's
    # messages, the results' message and the events with the COMMIT; the reply's
    # compare-and-set, the answer with the conversation let go of sent with the read of
    # the calls, the next job and the quota's waiters, the events with the COMMIT
    wire = _round_trips(sent)
    assert len(wire) == 5 and wire[1].rstrip().endswith("COMMIT")
    assert "INSERT INTO messages" in statements[1] and statements[1].startswith("WITH moved")
    # and the context the model was sent ends with the result the same round trip wrote
    sent_messages = h.router.requests[-1]["messages"]
    assert sent_messages[-1]["role"] == "tool"
    assert sent_messages[-1]["content"] == '{"result": 4, "expression": "2+2"}'
    assert h.job(job_id).status == "completed"
    conversation, messages = _messages(h, job_id)
    assert messages == [(1, "user"), (2, "tool_call"), (3, "tool_result"), (4, "assistant")]
    assert conversation.message_seq == 4


BLOCKED_WITHIN_S = 60
"""A failure bound for a step to be seen waiting on a row lock, never a measured margin."""


def test_a_result_committed_while_the_claim_waits_is_read_again_not_lost(make, pg_url):
    # given a job whose tool call is pending, and a tool worker storing its result that
    # holds the job's row (a result's transaction locks it first) and has not committed
    # (on an engine of its own: the step's connection never waits behind other tests'
    # checked-out ones in a shared pool)
    own = f"{pg_url}{'&' if '?' in pg_url else '?'}application_name=agentq_claim_waits"
    h = make(calls(("math.evaluate", {"expression": "2+2"})), reply("4"),
             AGENTQ_DATABASE_URL=own)
    job_id = h.submit("2+2?", thread=f"t-{uuid.uuid4().hex[:8]}")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    worker = h.sessions()
    worker.begin()
    worker.execute(select(Job.id).where(Job.id == uuid.UUID(job_id)).with_for_update())
    worker.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id).values(
        status="succeeded", finished_at=utcnow(),
        result=ToolResult.success({"result": 4, "expression": "2+2"}).to_record()))
    worker_pid = worker.execute(text("SELECT pg_backend_pid()")).scalar_one()
    # when the step after the tools claims the job meanwhile (its statement's snapshot is
    # taken before it waits for the row, so it sees the call pending)
    step = threading.Thread(target=h.stepper.run, args=(job_id, 1, "callback"), daemon=True)
    step.start()
    try:
        _wait_until_blocked_by(h, worker_pid, step)
    finally:  # never leave the row locked: every later test on this database would wait
        worker.commit()
        worker.close()
    step.join(BLOCKED_WITHIN_S)
    # then the step read the calls again and the model was sent the result, not "lost"
    assert not step.is_alive()
    assert h.router.requests[-1]["messages"][-1]["content"] == (
        '{"result": 4, "expression": "2+2"}')
    assert h.job(job_id).status == "completed"


def _wait_until_blocked_by(h, pid: int, step: threading.Thread) -> None:
    """Until some backend waits for one of `pid`'s locks (each look a transaction of its
    own: `blocked_by`; looked at in one long one, this test failed with the step waiting,
    and left the row locked)."""
    deadline = time.monotonic() + BLOCKED_WITHIN_S
    with h.sessions() as probe:
        while not blocked_by(probe, pid):
            if time.monotonic() > deadline:  # what the step and the database were doing
                with probe.begin():
                    activity = probe.execute(text(
                        "SELECT pid, state, wait_event_type, wait_event, left(query, 80) "
                        "FROM pg_stat_activity WHERE datname = current_database()")).all()
                pytest.fail(f"the step never waited for the job's row (its thread alive: "
                            f"{step.is_alive()}; worker {pid}; backends: {activity})")
            time.sleep(0.01)


def test_every_statement_of_a_tool_turn_job_is_prepared(make):
    # given one-tool jobs
    from agentq import prepared
    h = make(*(r for _ in range(3) for r in (
        calls(("math.evaluate", {"expression": "2+2"})), reply("4"))))
    # when they run from submit to end, each statement several times
    with sql_sent(h.sessions.kw["bind"]) as statements:
        for _ in range(3):
            h.drive(h.submit("2+2?", thread=f"t-{uuid.uuid4().hex[:8]}"))
    # then Postgres refused to prepare none of them: none is planned anew at each run (a
    # parameter it cannot type, as a JSON key bound as one, made the claim's so, and cost
    # its planning on every claim)
    refused = {statement for statement, _types in prepared._refused}
    assert [s[:80] for s in set(statements) if s in refused] == []


def test_a_first_step_reads_the_conversations_history_with_its_claim(make):
    # given a conversation with an earlier job's question and answer
    h = make(reply("4"), reply("5"))
    thread = f"t-{uuid.uuid4().hex[:8]}"
    h.drive(h.submit("2+2?", thread=thread))
    job_id = h.submit("and 2+3?", thread=thread)
    # when the next job's first step runs
    with wire_sent() as sent:
        h.stepper.run(job_id, 0, "start")
    # then its first transaction took two round trips, the claim (which read the history)
    # and the question with the events and the COMMIT (then the reply's three: the
    # compare-and-set, the answer with the read after it, the events with the COMMIT), and
    # the model was sent the history then the question
    assert len(_round_trips(sent)) == 5
    assert [(m["role"], m["content"]) for m in h.router.requests[-1]["messages"][1:]] == [
        ("user", "2+2?"), ("assistant", "4"), ("user", "and 2+3?")]
    conversation, messages = _messages(h, job_id)
    assert messages == [(1, "user"), (2, "assistant"), (3, "user"), (4, "assistant")]
    assert conversation.message_seq == 4


def test_a_message_numbered_after_a_seq_taken_meanwhile_is_refused_not_misnumbered(make):
    # given a conversation as one transaction read it, and a message another appended
    # since (a conversation its job holds has no other writer: this breaks that)
    from sqlalchemy.exc import IntegrityError

    from agentq.loop.store import append_after, append_messages
    h = make(reply("4"))
    job_id = h.submit("2+2?", thread=f"t-{uuid.uuid4().hex[:8]}")
    h.drive(job_id)
    conversation_id = h.job(job_id).conversation_id
    with h.sessions() as stale, h.sessions() as other:
        conversation = stale.get(Conversation, conversation_id)
        assert conversation.message_seq == 2
        append_messages(other, conversation_id, None, [("user", "meanwhile", None)])
        other.commit()
        # when the first appends after the seq it read, and commits
        # then the write fails (at once, or with the statement it was deferred to), and
        # neither its message nor its count is written
        with pytest.raises(IntegrityError):
            append_after(stale, conversation, None, [("user", "late", None)])
            stale.commit()
    conversation, messages = _messages(h, job_id)
    assert messages == [(1, "user"), (2, "assistant"), (3, "user")]
    assert conversation.message_seq == 3
