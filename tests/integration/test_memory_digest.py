"""An ended conversation left idle is summarised into a memory of its user by beat's
maintenance task (through a stack of its own, with beat, idle after 1 s), and a later
conversation of that user recalls it."""
from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import select

from agentq.memory_digest import DIGEST_SYSTEM_PROMPT, SOURCE
from agentq.models import Conversation, Memory
from agentq.testing.scripted_llm import ScriptedLLM, text
from tests.support.api import TEST_ENV, Client, uid
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration
FACT = "The user's favourite fruit is mango."


def _respond(request: dict):
    messages = request.get("messages") or []
    if messages and messages[0].get("content") == DIGEST_SYSTEM_PROMPT:
        return text(FACT, input_tokens=30, output_tokens=10)
    return text("Noted.")


@pytest.fixture(scope="module")
def digest_llm():
    server = ScriptedLLM(responder=_respond).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def digest_stack(servers_up, digest_llm, tmp_path_factory):
    env = {**TEST_ENV, "AGENTQ_MEMORY_IDLE_S": "1", "AGENTQ_MEMORY_DIGEST_INTERVAL_S": "0.5"}
    with own_stack("digest", digest_llm.base_url, tmp_path_factory.mktemp("digest"), env,
                   beat=True) as stack:
        yield stack, Client(stack, stack.create_key("digest", admin=True))


def _digests(llm: ScriptedLLM, needle: str) -> list[dict]:
    return [r for r in llm.requests()
            if (r.get("messages") or [{}])[0].get("content") == DIGEST_SYSTEM_PROMPT
            and needle in r["messages"][-1]["content"]]


def test_an_idle_conversation_is_remembered_and_recalled_later(digest_stack, digest_llm):
    stack, client = digest_stack
    user = uid("u")
    said = f"mango-{uuid.uuid4().hex[:6]}: I love mangoes more than any fruit."
    first = client.wait(client.submit(said, user=user)["id"])
    assert first["status"] == "completed", first
    conversation_id = uuid.UUID(first["conversation_id"])
    while True:  # a conversation never summarised is the test's timeout
        with stack.sessions()() as s:
            stored = s.execute(select(Memory).where(
                Memory.conversation_id == conversation_id)).scalars().all()
            conversation = s.get(Conversation, conversation_id)
        if stored:
            break
        time.sleep(0.25)
    (memory,) = stored
    assert memory.content == FACT and memory.source == SOURCE
    assert memory.embedding and memory.job_id is None
    assert conversation.memory_summarized_seq == conversation.message_seq
    # beat keeps looking every 0.5 s: the conversation is summarised once
    time.sleep(2)
    with stack.sessions()() as s:
        assert len(s.execute(select(Memory).where(
            Memory.conversation_id == conversation_id)).scalars().all()) == 1
    assert len(_digests(digest_llm, said)) == 1
    # a new conversation of the same user recalls it into its context
    second = client.wait(client.submit("which fruit do I like?", user=user,
                                       channel=uid("c"))["id"])
    assert second["status"] == "completed"
    assert second["conversation_id"] != first["conversation_id"]
    recalled = [e["data"] for e in client.events(second["id"])
                if e["type"] == "memory_recalled"]
    assert recalled and recalled[0]["count"] == 1
    asked = [r for r in digest_llm.requests()
             if any("which fruit do I like?" in (m.get("content") or "")
                    for m in r.get("messages") or [])
             and r["messages"][0].get("content") != DIGEST_SYSTEM_PROMPT]
    assert asked and FACT in asked[0]["messages"][0]["content"]
