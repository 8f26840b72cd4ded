"""A job's end on Postgres (issue 34: round trips per job): its answer is stored by the
statement that lets its conversation go, sent with the read of its calls, the
conversation's next job and the tenant's quota waiters; the rows a client sees are those
of before."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, update

from agentq.models import Conversation, Message
from agentq.testing.harness import calls, text
from tests.support.sql import sql_sent


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: the statements folded are
    Postgres's."""
    return make_pg


def _conversation(h, job_id: str) -> tuple[Conversation, list[tuple[int, str, str]]]:
    """The job's conversation and its messages (seq, role, content), in order."""
    with h.sessions() as session:
        conversation = session.get(Conversation, h.job(job_id).conversation_id)
        messages = session.execute(
            select(Message.seq, Message.role, Message.content)
            .where(Message.conversation_id == conversation.id).order_by(Message.seq)).all()
    return conversation, [tuple(m) for m in messages]


def test_the_answer_is_stored_by_the_statement_that_lets_the_conversation_go(make):
    # given a job whose turn runs a tool (its calls are in its response)
    h = make(calls(("math.evaluate", {"expression": "2+2"})), text("4"))
    job_id = h.submit("2+2?", thread=f"t-{uuid.uuid4().hex[:8]}")
    # when it runs to its end
    with sql_sent(h.sessions.kw["bind"]) as statements:
        h.drive(job_id)
    # then each write of its conversation's row stored a message (the question, the
    # turn's, the answer): the last one let the conversation go, and the statement after
    # it read the calls with the next job and the quota's waiters
    written = [s for s in statements if "UPDATE conversations" in s]
    assert all("INSERT INTO messages" in s for s in written)
    assert "active_job_id=CASE" in written[-1]
    after = statements[statements.index(written[-1]) + 1]
    assert "FROM tool_calls" in after and "quota_waiters" in after
    # and the rows are as before: the answer last, numbered gap-free; the conversation
    # free and idle from the answer on; the response lists the call
    job = h.job(job_id)
    conversation, messages = _conversation(h, job_id)
    assert job.status == "completed" and job.response["content"] == "4"
    assert [(c["name"], c["result"]) for c in job.response["metadata"]["tool_calls"]] == [
        ("math.evaluate", {"result": 4, "expression": "2+2"})]
    assert [seq for seq, _, _ in messages] == list(range(1, len(messages) + 1))
    assert messages[-1][1:] == ("assistant", "4")
    assert conversation.message_seq == len(messages)
    assert conversation.active_job_id is None
    with h.sessions() as session:
        answered_at = session.execute(select(Message.created_at).where(
            Message.conversation_id == conversation.id, Message.seq == len(messages))
        ).scalar_one()
    assert conversation.last_active_at == answered_at


def test_a_job_that_no_longer_holds_its_conversation_still_stores_its_answer(make):
    # given a job whose conversation was let go of while it ran (nothing owns it)
    h = make(text("4"))
    job_id = h.submit("2+2?", thread=f"t-{uuid.uuid4().hex[:8]}")
    conversation_id = h.job(job_id).conversation_id
    with h.sessions() as session, session.begin():
        session.execute(update(Conversation).where(Conversation.id == conversation_id)
                        .values(active_job_id=None))
    with h.sessions() as session:
        idle_since = session.get(Conversation, conversation_id).last_active_at
    # when it answers and ends
    h.stepper.run(job_id, 0, "start")
    # then its answer is stored after its question, and the conversation it did not hold is
    # left as it was (nobody's, its idle clock not moved)
    conversation, messages = _conversation(h, job_id)
    assert h.job(job_id).status == "completed"
    assert [m[1:] for m in messages] == [("user", "2+2?"), ("assistant", "4")]
    assert conversation.message_seq == 2
    assert conversation.active_job_id is None and conversation.last_active_at == idle_since


def test_a_job_end_reads_the_next_job_and_the_quota_waiters_in_one_statement(make):
    # given a quota of one running job: one running, one behind it in its conversation,
    # one in another conversation waiting for the quota
    h = make(text("one"), text("two"), text("three"), AGENTQ_QUOTA_RUNNING_JOBS="1")
    t1, t2 = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    first, behind = h.submit("a?", thread=t1), h.submit("b?", thread=t1)
    other = h.submit("c?", thread=t2)
    assert (h.job(behind).waiting_for, h.job(other).waiting_for) == ("conversation", "quota")
    # when the first ends
    with sql_sent(h.sessions.kw["bind"]) as statements:
        h.stepper.run(first, 0, "start")
    # then the next job was read with the quota's waiters, after the conversation was let
    # go of, and took the conversation (the quota held it: it is still full)
    (read,) = [s for s in statements if "quota_waiters" in s]
    assert statements.index(read) > next(
        i for i, s in enumerate(statements) if "UPDATE conversations" in s)
    conversation, _ = _conversation(h, first)
    assert conversation.active_job_id == uuid.UUID(behind)
    # and when each ends in turn, the one waiting for the quota starts and all answer
    h.drive(behind)
    h.drive(other)
    jobs = [h.job(j) for j in (first, behind, other)]
    assert [j.status for j in jobs] == ["completed"] * 3
    assert [j.response["content"] for j in jobs] == ["one", "two", "three"]


def test_a_job_end_with_nobody_behind_it_starts_a_quota_waiter(make):
    # given a quota of one running job: one running, one waiting for the quota elsewhere
    h = make(text("one"), text("two"), AGENTQ_QUOTA_RUNNING_JOBS="1")
    first = h.submit("a?", thread=f"t-{uuid.uuid4().hex[:8]}")
    other = h.submit("b?", thread=f"t-{uuid.uuid4().hex[:8]}")
    assert h.job(other).waiting_for == "quota"
    # when the first ends
    sent = h.stepper.run(first, 0, "start")
    # then the waiter was admitted by that end, its first step sent
    assert h.job(other).waiting_for is None
    assert [(e.job_id, e.iteration) for e in sent if type(e).__name__ == "NextStep"] == [
        (other, 0)]
    h.drive(other)
    assert h.job(other).response["content"] == "two"


def test_steering_too_late_for_the_last_turn_becomes_the_next_job_of_the_conversation(make):
    # given a job whose user steers it while its last model call runs
    thread = f"t-{uuid.uuid4().hex[:8]}"

    def steered_while_thinking():
        h.submit("and 3+3?", thread=thread, on_busy="steer")
        return text("4")
    h = make(steered_while_thinking, text("6"))
    first = h.submit("2+2?", thread=thread)
    # when the job answers without another turn
    h.stepper.run(first, 0, "start")
    # then the steering became a follow-up job, which took the conversation and runs
    follow_up = h.job(first).follow_up_job_id
    assert h.job(first).status == "completed" and follow_up is not None
    conversation, messages = _conversation(h, first)
    assert conversation.active_job_id == follow_up
    assert [m[1:] for m in messages] == [("user", "2+2?"), ("assistant", "4")]
    h.drive(str(follow_up))
    assert h.job(str(follow_up)).response["content"] == "6"
    _, messages = _conversation(h, first)
    assert [m[1:] for m in messages][2:] == [("user", "and 3+3?"), ("assistant", "6")]
