"""Idle conversations summarised into memories (agentq.memory_digest): once per new
messages, in the conversation's tenant and user, the same memory however often the task
is delivered; busy or recent conversations are left alone; a failed call is tried later."""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from agentq.db import utcnow
from agentq.errors import ProviderError
from agentq.llm.types import LLMReply
from agentq.memory_digest import DIGEST_SYSTEM_PROMPT, SOURCE, digest, digest_id, summarize_idle
from agentq.models import Conversation, Memory, TokenLog
from agentq.testing.harness import MODEL, Harness, text
from tests.support import unit_db


class Router:
    def __init__(self, answer: str = "The user likes teal and plans a trip to Oslo."):
        self.answer = answer
        self.digests: list[list[dict]] = []
        self.fail = False

    def chat(self, messages, tools, model=None, max_tokens=None, **_kw):
        if messages[0]["content"] == DIGEST_SYSTEM_PROMPT:
            if self.fail:
                raise ProviderError("provider down", [])
            self.digests.append(messages)
            return LLMReply(self.answer, (), "end_turn", MODEL, 40, 12)
        return text("Noted.")

    def embed(self, content, model=None):
        return [1.0, 0.0, 0.5]


@pytest.fixture
def h(tmp_path, modules):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), "AGENTQ_MEMORY_IDLE_S": "600"})
    return Harness(settings, modules, Router())


def _conversation_of(h: Harness, job_id: str) -> uuid.UUID:
    return h.job(job_id).conversation_id


def _age(h: Harness, conversation_id: uuid.UUID, seconds: float) -> None:
    with h.sessions() as session, session.begin():
        session.execute(update(Conversation).where(Conversation.id == conversation_id)
                        .values(last_active_at=utcnow() - timedelta(seconds=seconds)))


def _memories(h: Harness) -> list[Memory]:
    with h.sessions() as session:
        return session.execute(select(Memory).order_by(Memory.created_at)).scalars().all()


def test_an_idle_conversation_becomes_one_memory_of_its_user(h):
    job_id = h.submit("I like teal. I am going to Oslo in May.")
    h.drive(job_id)
    conversation_id = _conversation_of(h, job_id)
    _age(h, conversation_id, 700)
    assert summarize_idle(h.settings, h.sessions, h.router) == 1
    (stored,) = _memories(h)
    job = h.job(job_id)
    with h.sessions() as session:
        conversation = session.get(Conversation, conversation_id)
        billed = session.execute(select(TokenLog).where(
            TokenLog.conversation_id == conversation_id, TokenLog.job_id.is_(None))).scalars().all()
    assert stored.content == h.router.answer and stored.source == SOURCE
    assert (stored.user_id, stored.tenant_id) == (job.user_id, conversation.tenant_id)
    assert stored.conversation_id == conversation_id and stored.embedding == [1.0, 0.0, 0.5]
    assert stored.id == digest_id(conversation_id, conversation.message_seq)
    assert conversation.memory_summarized_seq == conversation.message_seq
    assert "I like teal" in h.router.digests[0][-1]["content"]
    assert [(b.input_tokens, b.output_tokens) for b in billed] == [(40, 12)]
    # again: nothing new since, nothing written
    assert summarize_idle(h.settings, h.sessions, h.router) == 0
    assert len(_memories(h)) == 1 and len(h.router.digests) == 1
    # a new exchange, idle again: one more memory, reading only the new messages
    second = h.submit("Actually I prefer green now.")
    h.drive(second)
    _age(h, conversation_id, 700)
    assert summarize_idle(h.settings, h.sessions, h.router) == 1
    assert len(_memories(h)) == 2
    assert "I like teal" not in h.router.digests[1][-1]["content"]
    assert "prefer green" in h.router.digests[1][-1]["content"]


def test_recent_or_busy_conversations_are_left_alone(h):
    recent = h.submit("hello")
    h.drive(recent)
    busy = h.submit("still running", user="u-2")  # queued: its conversation has a job
    _age(h, _conversation_of(h, busy), 700)
    assert summarize_idle(h.settings, h.sessions, h.router) == 0
    assert _memories(h) == [] and h.router.digests == []


def test_a_digest_delivered_twice_writes_one_memory(h):
    job_id = h.submit("I like teal.")
    h.drive(job_id)
    conversation_id = _conversation_of(h, job_id)
    _age(h, conversation_id, 700)
    now = utcnow()
    # two deliveries that both read the conversation before either wrote (the model call
    # of the second one made while the first one's memory is stored)
    first_router = Router()
    second_router = Router()
    original_chat = second_router.chat

    def chat_while_the_other_writes(messages, tools, **kw):
        assert digest(h.settings, h.sessions, first_router, conversation_id, now) == 1
        return original_chat(messages, tools, **kw)
    second_router.chat = chat_while_the_other_writes
    assert digest(h.settings, h.sessions, second_router, conversation_id, now) == 0
    assert len(_memories(h)) == 1
    # and a redelivery afterwards does nothing either
    assert summarize_idle(h.settings, h.sessions, h.router, now) == 0
    assert len(_memories(h)) == 1


def test_each_tenant_and_user_gets_its_own_memories(h):

    from agentq.loop.identity import Incoming
    from agentq.loop.submit import Submission, create_job
    from agentq.loop.uow import UnitOfWork
    from agentq.tenants import create_tenant
    with h.sessions() as session, session.begin():
        other_id = create_tenant(session, "other").id
    with UnitOfWork(h.sessions) as uow:
        # the same platform user and channel, in another tenant
        job = create_job(uow, h.settings,
                         Submission(Incoming("test", "u-1", "chan-1", None), "I like tea.",
                                    tenant_id=other_id))
        other_job = str(job.id)
    mine = h.submit("I like coffee.")
    h.drive(mine)
    h.drive(other_job)
    for job_id in (mine, other_job):
        _age(h, _conversation_of(h, job_id), 700)
    assert summarize_idle(h.settings, h.sessions, h.router) == 2
    by_conversation = {m.conversation_id: m for m in _memories(h)}
    for job_id in (mine, other_job):
        job = h.job(job_id)
        stored = by_conversation[job.conversation_id]
        assert (stored.user_id, stored.tenant_id) == (job.user_id, job.tenant_id)
    assert h.job(mine).tenant_id != h.job(other_job).tenant_id


def test_a_failed_call_leaves_the_conversation_for_the_next_look(h):
    job_id = h.submit("I like teal.")
    h.drive(job_id)
    conversation_id = _conversation_of(h, job_id)
    _age(h, conversation_id, 700)
    h.router.fail = True
    assert summarize_idle(h.settings, h.sessions, h.router) == 0
    with h.sessions() as session:
        assert session.get(Conversation, conversation_id).memory_summarized_seq == 0
    h.router.fail = False
    assert summarize_idle(h.settings, h.sessions, h.router) == 1


def test_nothing_worth_remembering_is_marked_done_without_a_memory(h):
    h.router.answer = "NOTHING"
    job_id = h.submit("hi")
    h.drive(job_id)
    conversation_id = _conversation_of(h, job_id)
    _age(h, conversation_id, 700)
    assert summarize_idle(h.settings, h.sessions, h.router) == 0
    assert _memories(h) == []
    with h.sessions() as session:
        conversation = session.get(Conversation, conversation_id)
        assert conversation.memory_summarized_seq == conversation.message_seq
    assert summarize_idle(h.settings, h.sessions, h.router) == 0
    assert len(h.router.digests) == 1


def test_a_digest_whose_write_could_not_reach_the_database_is_written_when_it_answers(h):
    from sqlalchemy.exc import OperationalError
    # given an idle conversation, and a database that goes away while the model digests
    # it: the memory's write fails twice
    job_id = h.submit("I like teal.")
    h.drive(job_id)
    conversation_id = _conversation_of(h, job_id)
    _age(h, conversation_id, 700)
    failures = [OperationalError("BEGIN", {}, Exception("gone"))] * 2

    def flaky_sessions():
        if h.router.digests and failures:
            raise failures.pop()
        return h.sessions()
    # when it is digested
    written = digest(h.settings, flaky_sessions, h.router, conversation_id, utcnow())
    # then the memory was written once the database answered: the model was asked once
    assert not failures
    assert written == 1 and len(h.router.digests) == 1
    (stored,) = _memories(h)
    assert stored.content == h.router.answer
