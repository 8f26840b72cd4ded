"""Long jobs and long conversations through a real stack of their own (own Redis server, own
database): the question is in every request a 200-iteration job sends, and a small context
window is never passed because older turns are compacted into a conversation summary."""
from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from agentq.db import utcnow
from agentq.loop.compaction_plan import SUMMARY_SYSTEM_PROMPT, summary_max_tokens
from agentq.loop.context import estimate_tokens
from agentq.models import Conversation, ConversationSummary, Message, TokenLog
from agentq.testing.scripted_llm import Reply, ScriptedLLM, call, text, tool_calls
from tests.support.api import TEST_ENV, Client, uid
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration
WINDOW = 4000
GROWING = "GROWING-SUMMARY"
LONG_JOB_TIMEOUT_S = 900


def _is_summary(request: dict) -> bool:
    messages = request.get("messages") or []
    return bool(messages) and messages[0].get("content") == SUMMARY_SYSTEM_PROMPT


def _respond(request: dict) -> Reply:
    """Summaries when asked for one; else per the question: `calls:N` tool calls per turn
    forever, or `answer` a text. A request without the question gets the text LOST."""
    if _is_summary(request):
        asked = request["messages"][-1]["content"]
        if GROWING in asked:  # a server that ignores max_tokens: the summary only grows
            previous = asked.split("The summary so far:\n", 1)[-1].split("\n\n")[0] \
                if "The summary so far:\n" in asked else ""
            return text(f"{previous} and more, " + "fact " * 1000,
                        input_tokens=50, output_tokens=20)
        return text("Summary: the user asked for sums; every sum was computed as 2.",
                    input_tokens=50, output_tokens=20)
    users = [m.get("content") or "" for m in request["messages"] if m.get("role") == "user"]
    question = next((u for u in users if "QUESTION-" in u), None)
    if question is None:
        return text("LOST")
    if "calls:" in question:
        n = int(question.split("calls:")[1].split()[0])
        return tool_calls(*[call("math.evaluate", {"expression": "1+1"}) for _ in range(n)])
    return text("done")


@pytest.fixture(scope="module")
def long_llm():
    server = ScriptedLLM(responder=_respond).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def long_stack(servers_up, long_llm, tmp_path_factory):
    env = {**TEST_ENV, "AGENTQ_MAX_ITERATIONS": "200", "AGENTQ_CONTEXT_WINDOW": str(WINDOW),
           "AGENTQ_GUEST_MONTHLY_TOKENS": "100000000", "AGENTQ_STEP_DEADLINE_S": "60",
           "AGENTQ_TOOLS_CONCURRENCY": "10"}
    with own_stack("long", long_llm.base_url, tmp_path_factory.mktemp("long"), env) as stack:
        yield stack, Client(stack, stack.create_key("long", admin=True))


def _requests_of(llm: ScriptedLLM, marker: str) -> list[dict]:
    return [r for r in llm.requests()
            if any(marker in (m.get("content") or "") for m in r["messages"]
                   if m.get("role") == "user")]


def _tokens(request: dict) -> int:
    return sum(estimate_tokens(json.dumps(m)) for m in request["messages"])


def test_a_200_iteration_job_keeps_its_question_in_every_request(long_stack, long_llm):
    # ten parallel tool calls a turn: 2,000 calls and results to keep together through the
    # compactions (one call a turn checked nothing more, in a third of the time)
    per_turn = 10
    stack, client = long_stack
    marker = f"QUESTION-{uuid.uuid4().hex[:8]}"
    job = client.wait(client.submit(f"{marker} add one and one, calls:{per_turn} times")["id"],
                      timeout_s=LONG_JOB_TIMEOUT_S)
    assert (job["status"], job["finish_reason"]) == ("completed", "max_iterations"), job
    assert job["iterations"] == 200
    turns = [r for r in _requests_of(long_llm, marker) if not _is_summary(r)]
    assert len(turns) == 200
    for request in turns:
        users = [m["content"] for m in request["messages"] if m["role"] == "user"]
        assert any(marker in u for u in users)
        # tool calls and their results are never split
        asked = {c["id"] for m in request["messages"] if m["role"] == "assistant"
                 for c in m.get("tool_calls") or ()}
        answered = {m["tool_call_id"] for m in request["messages"] if m["role"] == "tool"}
        assert asked == answered
        assert _tokens(request) <= WINDOW
    # the in-run exchange outgrew the window: it was compacted, and the summary billed
    events = client.events(job["id"])
    kinds = [e["type"] for e in events]
    assert "compaction_start" in kinds and "compaction_end" in kinds
    ends = [e["data"] for e in events if e["type"] == "compaction_end"]
    assert all(e["tokens_after"] < e["tokens_before"] for e in ends)
    assert any(e["strategy"] == "summarize" for e in ends)
    with stack.sessions()() as s:
        summaries = s.execute(select(ConversationSummary).join(
            Conversation, Conversation.id == ConversationSummary.conversation_id)
            .where(ConversationSummary.job_id == uuid.UUID(job["id"]))).scalars().all()
        billed = s.execute(select(func.count()).select_from(TokenLog).where(
            TokenLog.job_id == uuid.UUID(job["id"]), TokenLog.iteration < 0)).scalar_one()
    assert summaries and billed == len(summaries)
    assert sorted(x.version for x in summaries) == list(range(1, len(summaries) + 1))


def test_a_500_turn_conversation_stays_under_a_small_window(long_stack, long_llm):
    stack, client = long_stack
    user, channel = uid("u"), uid("c")
    first = client.wait(client.submit("QUESTION-first hello", user=user, channel=channel)["id"])
    assert first["status"] == "completed"
    # given 500 earlier turns (1,000 messages) stored in that conversation
    with stack.sessions()() as s, s.begin():
        conversation = s.get(Conversation, uuid.UUID(first["conversation_id"]))
        start = conversation.message_seq
        now = utcnow() - timedelta(hours=1)
        for i in range(1000):
            content = (f"turn {i // 2}: what is {i}+1?" if i % 2 == 0
                       else f"turn {i // 2}: it is {i}, and here is why: " + "x" * 80)
            s.add(Message(id=uuid.uuid4(), conversation_id=conversation.id, job_id=None,
                          seq=start + 1 + i, role="user" if i % 2 == 0 else "assistant",
                          content=content, token_count=estimate_tokens(content),
                          created_at=now))
        conversation.message_seq = start + 1000
    # when the user asks again, twice
    marker = f"QUESTION-{uuid.uuid4().hex[:8]}"
    jobs = [client.wait(client.submit(f"{marker} answer please", user=user,
                                      channel=channel)["id"]) for _ in range(2)]
    assert all(j["status"] == "completed" and j["response"]["content"] == "done" for j in jobs)
    turns = [r for r in _requests_of(long_llm, marker) if not _is_summary(r)]
    assert len(turns) == 2
    assert all(_tokens(r) <= WINDOW for r in turns)
    # the first compacted the history into a summary the second one reads
    first_events = client.events(jobs[0]["id"])
    ends = [e["data"] for e in first_events if e["type"] == "compaction_end"]
    assert ends and ends[0]["strategy"] == "summarize"
    assert ends[0]["messages_after"] < ends[0]["messages_before"]
    system = turns[1]["messages"][0]["content"]
    assert "Summary: the user asked for sums" in system
    with stack.sessions()() as s:
        summary = s.execute(select(ConversationSummary).where(
            ConversationSummary.conversation_id == uuid.UUID(first["conversation_id"]))
            .order_by(ConversationSummary.version.desc())).scalars().first()
    assert summary is not None and summary.through_seq > start
    # the 800 messages older than the history read (200) were summarised, from the oldest
    summaries = [r["messages"][-1]["content"] for r in long_llm.requests() if _is_summary(r)]
    assert any("turn 0: what is 0+1?" in text_ for text_ in summaries)
    assert any("turn 150: what is 300+1?" in text_ for text_ in summaries)


def test_a_summary_is_cut_to_its_budget_when_the_server_sends_more(long_stack, long_llm):
    """Issue 31 item 10: the server ignores the summary call's max_tokens and sends each
    round's summary longer than the last; what is stored stays within the summary's budget,
    so the job goes on instead of failing `context_overflow`."""
    stack, client = long_stack
    marker = f"QUESTION-{uuid.uuid4().hex[:8]}"
    job = client.wait(client.submit(f"{marker} {GROWING} add, calls:10 times",
                                    limits={"max_iterations": 24})["id"],
                      timeout_s=LONG_JOB_TIMEOUT_S)
    assert (job["status"], job["finish_reason"]) == ("completed", "max_iterations"), job
    with stack.sessions()() as s:
        stored = s.execute(select(ConversationSummary.content).where(
            ConversationSummary.job_id == uuid.UUID(job["id"]))
            .order_by(ConversationSummary.version)).scalars().all()
    sent = [r for r in _requests_of(long_llm, marker) if _is_summary(r)]
    assert len(stored) == len(sent) >= 3
    cap = summary_max_tokens(WINDOW)  # the budget of a summary is at most this
    assert all(estimate_tokens(summary) <= cap for summary in stored)
    ends = [e["data"] for e in client.events(job["id"]) if e["type"] == "compaction_end"]
    assert all(end.get("summary_truncated") for end in ends if end["strategy"] == "summarize")


def test_a_question_larger_than_the_window_fails_the_job_saying_so(long_stack, long_llm):
    stack, client = long_stack
    marker = f"QUESTION-{uuid.uuid4().hex[:8]}"
    job = client.wait(client.submit(f"{marker} read this: " + "x" * (WINDOW * 8))["id"])
    assert (job["status"], job["finish_reason"]) == ("failed", "error"), job
    error = job["response"]["error"]
    assert error["code"] == "context_overflow" and error["tokens"] > error["budget"]
    assert _requests_of(long_llm, marker) == []  # never sent what the model cannot take
    kinds = [e["type"] for e in client.events(job["id"])]
    assert kinds.count("turn_start") == kinds.count("turn_end") == 1
    assert kinds.index("turn_end") < kinds.index("job_end")


def test_a_recorded_replay_reproduces_the_originals_compactions(long_stack):
    stack, client = long_stack
    marker = f"QUESTION-{uuid.uuid4().hex[:8]}"
    original = client.wait(client.submit(f"{marker} add, calls:10 times",
                                         limits={"max_iterations": 12})["id"])
    assert (original["status"], original["finish_reason"]) == ("completed", "max_iterations")

    def compactions(job_id):
        return [(e["type"], e["data"].get("turn"), e["data"].get("strategy"),
                 e["data"].get("tokens_before"), e["data"].get("tokens_after"))
                for e in client.events(job_id)
                if e["type"] in ("compaction_start", "compaction_end")]

    before = compactions(original["id"])
    assert any(c[2] == "summarize" for c in before)
    response = client.post(f"/v1/jobs/{original['id']}/replay", json={"mode": "recorded"})
    assert response.status_code == 202, response.text
    replayed = client.wait(response.json()["id"], timeout_s=LONG_JOB_TIMEOUT_S)
    assert (replayed["status"], replayed["finish_reason"]) == ("completed", "max_iterations")
    assert compactions(replayed["id"]) == before
    with stack.sessions()() as s:
        def summaries(conversation_id):
            return [x.content for x in s.execute(select(ConversationSummary).where(
                ConversationSummary.conversation_id == uuid.UUID(conversation_id))
                .order_by(ConversationSummary.version)).scalars()]
        assert summaries(replayed["conversation_id"]) == summaries(original["conversation_id"])
        assert summaries(replayed["conversation_id"])
