"""Context budget planning counts what a recall will add; history older than the history
read is summarised (a backlog), never dropped; after compaction the context must fit the
model's window, else more is compacted, else the job fails saying so."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from agentq import memory
from agentq.db import utcnow
from agentq.llm.types import LLMReply
from agentq.loop.compaction_plan import (
    SUMMARY_SYSTEM_PROMPT,
    after_summary,
    cap_chars,
    next_round,
    plan_compaction,
    turns,
)
from agentq.loop.context import (
    Layers,
    StoredMessage,
    estimate_tokens,
    fit_memories,
    fits,
    memory_reserve,
    memory_tokens,
    tokens_of,
)
from agentq.models import Conversation, ConversationSummary, Job, JobEvent, Message, User
from agentq.testing.harness import MODEL, Harness
from tests.support import unit_db
from tests.support.stored_messages import in_run as _inrun
from tests.support.stored_messages import user_message as _user

# --- planning, as functions ------------------------------------------------------------

def test_the_memory_reserve_counts_before_the_recall():
    layers = Layers("sys", None, [], _user(1), _inrun(2, 3))
    size = tokens_of(layers, 1000)
    budget = int(size / 0.8) + 5  # just under the threshold without memories
    assert plan_compaction(layers, budget, 0.8, 1000, 2) is None
    reserved = Layers("sys", None, [], _user(1), _inrun(2, 3), memory_reserve=200)
    assert tokens_of(reserved, 1000) == size + 200
    assert plan_compaction(reserved, budget, 0.8, 1000, 2) is not None


def test_recalled_memories_replace_their_reserve_and_keep_to_it():
    reserve = memory_reserve(5, 2000, 1000)
    assert reserve == 150  # 15% of the budget: five 2,000-char memories would be 2,500+
    assert memory_reserve(5, 100, 100_000) == memory_tokens(["x" * 100] * 5)
    memories = ["a" * 200, "b" * 200, "c" * 200, "d" * 200]
    kept = fit_memories(memories, reserve)
    assert kept == memories[:len(kept)] and 1 <= len(kept) < 4  # best first, within it
    assert memory_tokens(kept) <= reserve
    layers = Layers("sys", None, [], _user(1), [], memories=tuple(kept), memory_reserve=reserve)
    plain = Layers("sys", None, [], _user(1), [])
    assert tokens_of(layers, 1000) - tokens_of(plain, 1000) <= reserve + 1


def _history(start: int, n: int, chars: int = 100) -> list[StoredMessage]:
    return [StoredMessage(start + i, "user" if i % 2 == 0 else "assistant",
                          ("q" if i % 2 == 0 else "a") * chars, estimate_tokens("x" * chars))
            for i in range(n)]


def test_a_backlog_is_summarised_even_under_the_threshold():
    backlog = _history(1, 10)
    history = _history(11, 20)
    layers = Layers("sys", None, history, _user(31), [], backlog=backlog)
    plan = plan_compaction(layers, 1_000_000, 0.8, 1000, 2)
    assert plan is not None
    # the backlog, then the older half of the history read (it ends before a user message)
    assert [m.seq for m in plan.summarize] == list(range(1, 21))
    after = after_summary(layers, "s", plan.summarize[-1].seq)
    assert after.backlog == [] and after.history[0].role == "user"
    assert [m.seq for m in after.history] == list(range(21, 31))
    # a backlog with more unread behind it: only the backlog (the summary stays in order)
    more = Layers("sys", None, history, _user(31), [], backlog=backlog, backlog_more=True)
    plan = plan_compaction(more, 1_000_000, 0.8, 1000, 2)
    assert [m.seq for m in plan.summarize] == list(range(1, 11))


def test_one_summary_call_reads_whole_turns_up_to_its_size():
    messages = [*_history(1, 4, chars=1000), *_inrun(5, 3)]
    taken = cap_chars(messages, 2100, 1000)
    assert [m.seq for m in taken] == [1, 2]  # two whole messages; the rest waits
    assert cap_chars(messages, 10, 1000) == tuple(messages[:1])  # at least one turn
    inrun = _inrun(1, 4)
    taken = cap_chars(inrun, 1, 1000)
    assert taken == tuple(turns(inrun)[0])  # a call is never taken without its result


def test_kept_turns_too_large_for_the_window_are_summarised_too():
    big = "z" * 4000
    layers = Layers("sys", None, [], _user(1), _inrun(2, 2, result=big))
    budget = 1500  # the two newest turns alone (kept by keep_turns=2) pass it
    assert not fits(layers, budget, 10_000, None)
    plan = next_round(layers, budget, 0.8, 10_000, 2, None)
    assert plan is not None and [m.seq for m in plan.summarize] == [2, 3, 4, 5]
    after = after_summary(layers, "short", plan.summarize[-1].seq)
    assert after.inrun == [] and fits(after, budget, 10_000, None)


# --- through the step --------------------------------------------------------------------

class Router:
    """Summaries when asked for one (they are recorded), else the answer `done`."""

    def __init__(self):
        self.requests: list[list[dict]] = []
        self.summaries: list[str] = []
        self.vector = [1.0, 0.0, 0.0]

    def chat(self, messages, tools, model=None, max_tokens=None, **_kw):
        self.requests.append(messages)
        if messages[0]["content"] == SUMMARY_SYSTEM_PROMPT:
            self.summaries.append(messages[-1]["content"])
            return LLMReply(f"summary {len(self.summaries)}", (), "end_turn", MODEL, 50, 10)
        return LLMReply("done", (), "end_turn", MODEL, 10, 5)

    def embed(self, text, model=None):
        return self.vector


@pytest.fixture
def harness(tmp_path, modules):
    def make(**env) -> Harness:
        return Harness(unit_db.settings({"AGENTQ_HOME": str(tmp_path), **env}), modules,
                       Router())
    return make


def _store_history(h: Harness, job_id: str, n: int) -> int:
    """`n` messages stored before the job's question; returns the question's seq."""
    with h.sessions() as session, session.begin():
        job = session.get(Job, uuid.UUID(job_id))
        conversation = session.get(Conversation, job.conversation_id)
        for i in range(n):
            content = f"old-{i} " + ("question" if i % 2 == 0 else "answer " + "w" * 60)
            session.add(Message(id=uuid.uuid4(), conversation_id=conversation.id,
                                job_id=None, seq=conversation.message_seq + 1 + i,
                                role="user" if i % 2 == 0 else "assistant",
                                content=content, token_count=estimate_tokens(content),
                                created_at=utcnow()))
        conversation.message_seq += n
        return conversation.message_seq + 1


def _events(h: Harness, job_id: str) -> list[tuple[str, dict]]:
    with h.sessions() as session:
        return [(e.type, e.data) for e in session.execute(
            select(JobEvent).where(JobEvent.job_id == uuid.UUID(job_id))
            .order_by(JobEvent.seq)).scalars()]


def test_history_beyond_the_history_read_is_summarised_not_dropped(harness):
    # given 300 stored messages, more than the 40 the history read takes, in a big window
    h = harness(AGENTQ_HISTORY_MAX_MESSAGES="40")
    job_id = h.submit("now what?")
    _store_history(h, job_id, 300)
    # when the job runs
    h.drive(job_id)
    # then summary calls read the old messages, oldest first, from the very first
    assert h.job(job_id).status == "completed"
    assert "old-0 question" in h.router.summaries[0]
    summarised = " ".join(h.router.summaries)
    rounds = len(h.router.summaries)
    assert 1 <= rounds <= 4
    events = _events(h, job_id)
    starts = [d for k, d in events if k == "compaction_start"]
    ends = [d for k, d in events if k == "compaction_end"]
    assert len(starts) == len(ends) == rounds
    assert [d["round"] for d in starts] == list(range(1, rounds + 1))
    assert all(d["strategy"] == "summarize" for d in ends)
    kinds = [k for k, _ in events]
    assert kinds.index("message_start", kinds.index("compaction_end")) > max(
        i for i, k in enumerate(kinds) if k == "compaction_end")
    with h.sessions() as session:
        summaries = session.execute(select(ConversationSummary).order_by(
            ConversationSummary.version)).scalars().all()
    assert [s.version for s in summaries] == list(range(1, rounds + 1))
    throughs = [s.through_seq for s in summaries]
    assert throughs == sorted(throughs)
    # every message up to the last summary's end was in some summary call
    question_seq = 301
    covered = [i for i in range(300) if f"old-{i} " in summarised]
    assert covered == list(range(len(covered)))  # from the oldest, with no gap
    assert throughs[-1] == len(covered)
    # and a next job goes on from there until nothing older than the read is left
    for _ in range(6):
        if throughs[-1] >= question_seq - 1 - 40:
            break
        nxt = h.submit("and then?")
        h.drive(nxt)
        with h.sessions() as session:
            throughs.append(session.execute(select(ConversationSummary.through_seq).order_by(
                ConversationSummary.version.desc()).limit(1)).scalar_one())
    assert throughs[-1] >= question_seq - 1 - 40


def test_a_question_larger_than_the_window_fails_the_job_saying_so(harness):
    h = harness(AGENTQ_CONTEXT_WINDOW="1000")
    job_id = h.submit("please read this: " + "x" * 20_000)
    h.drive(job_id)
    job = h.job(job_id)
    assert (job.status, job.finish_reason) == ("failed", "error")
    assert job.response["error"]["code"] == "context_overflow"
    assert job.response["error"]["budget"] < job.response["error"]["tokens"]
    assert h.router.requests == []  # the model was never sent what it cannot take
    kinds = [k for k, _ in _events(h, job_id)]
    assert kinds.count("turn_start") == kinds.count("turn_end") == 1
    assert kinds.index("turn_end") < kinds.index("job_end")


def test_recalled_memories_fit_the_room_planned_for_them(harness):
    h = harness(AGENTQ_CONTEXT_WINDOW="2000")
    job_id = h.submit("what do I like?")
    with h.sessions() as session, session.begin():
        user = session.get(User, h.job(job_id).user_id)
        for i in range(5):
            memory.remember(session, tenant_id=user.tenant_id, user_id=user.id,
                            content=f"fact-{i} " + "m" * 400, embedding=[1.0, 0.0, 0.1 * i],
                            model=h.settings.embedding_model, source="tool")
    h.drive(job_id)
    assert h.job(job_id).status == "completed"
    (request,) = h.router.requests
    system = request[0]["content"]
    budget = 2000 - 500  # the window less the answer's room (a quarter at most)
    recalled = [f"fact-{i}" for i in range(5) if f"fact-{i} " in system]
    assert recalled and len(recalled) < 5  # the best that fit 15% of the budget
    assert recalled[0] == "fact-0"  # the most similar first
    assert sum(estimate_tokens(str(m.get("content") or "")) for m in request) <= budget


def test_a_summary_whose_write_could_not_reach_the_database_is_written_when_it_answers(
        harness):
    from sqlalchemy.exc import OperationalError
    # given a job whose context needs summary calls, and a database that goes away while
    # the first summary is asked for: that summary's write fails twice
    h = harness(AGENTQ_HISTORY_MAX_MESSAGES="40")
    job_id = h.submit("now what?")
    _store_history(h, job_id, 300)
    sessions, failures = h.stepper.sessions, [OperationalError("BEGIN", {}, Exception("gone"))] * 2

    def flaky_sessions():
        if len(h.router.summaries) == 1 and failures:
            raise failures.pop()
        return sessions()
    h.stepper.sessions = flaky_sessions
    # when the job runs
    h.drive(job_id)
    # then the summary was kept and written once the database answered: each summary call
    # is stored once, none asked for again, and the job completed
    assert not failures
    assert h.job(job_id).status == "completed"
    with h.sessions() as session:
        versions = session.execute(select(ConversationSummary.version).order_by(
            ConversationSummary.version)).scalars().all()
    assert versions == list(range(1, len(h.router.summaries) + 1))
    starts = [d for k, d in _events(h, job_id) if k == "compaction_start"]
    assert [d["round"] for d in starts] == list(range(1, len(versions) + 1))
