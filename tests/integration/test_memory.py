"""Memory (seeds 000/003) through the real stack: what one conversation stored with
memory.remember is recalled into another conversation's context (exact search on the shared
Postgres 15, which has no pgvector), and by memory.recall."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from agentq.models import Memory, ToolCall
from agentq.testing.scripted_llm import call, embedding_vector, text, tool_calls
from tests.support.api import uid

pytestmark = pytest.mark.integration
FACT = "The user's favourite colour is teal."
EMBED = text("(an embedding)")
"""The scripted server answers an /embeddings request whose input carries the script marker
(the question, embedded once per job for recall) from the script too: with a vector."""


def test_a_memory_from_one_conversation_is_recalled_in_another(client, script, stack):
    user = uid("u")
    # turn 2 already has a memory to recall: the question is embedded first
    marker = script([tool_calls(call("memory.remember", {"content": FACT})),
                     EMBED, text("I will remember that.")])
    first = client.wait(client.submit(f"{marker} remember my favourite colour", user=user)["id"])
    assert first["status"] == "completed", first
    assert first["response"]["metadata"]["tool_calls"][0]["success"] is True
    with stack.sessions()() as s:
        stored = s.execute(select(Memory).where(
            Memory.job_id == uuid.UUID(first["id"]))).scalar_one()
    assert stored.content == FACT and stored.source == "tool"
    assert stored.embedding == pytest.approx(embedding_vector(FACT))

    def sees_memory(request):
        system = request["messages"][0]["content"]
        assert FACT in system
        assert system.index(FACT) > system.index("[Things you remember about this user]")

    marker = script([EMBED, text("Teal.", check=sees_memory),
                     EMBED, tool_calls(call("memory.recall", {"query": "colour"})),
                     text("Recalled.")])
    second = client.wait(client.submit(f"{marker} what is my favourite colour?", user=user,
                                       channel=uid("c"))["id"])
    assert second["conversation_id"] != first["conversation_id"]
    assert second["response"]["content"] == "Teal."
    recalled = [e["data"] for e in client.events(second["id"])
                if e["type"] == "memory_recalled"]
    assert recalled and recalled[0]["count"] == 1
    # the tool finds it too
    third = client.wait(client.submit(f"{marker} recall it", user=user)["id"])
    assert third["status"] == "completed"
    with stack.sessions()() as s:
        result = s.execute(select(ToolCall.result).where(
            ToolCall.job_id == uuid.UUID(third["id"]))).scalar_one()
    assert [m["content"] for m in result["result"]["memories"]] == [FACT]


def test_another_user_recalls_nothing(client, script):
    marker = script([text("Nothing.", check=lambda r: "[Things you remember" not in
                          r["messages"][0]["content"])])
    job = client.wait(client.submit(f"{marker} what is my favourite colour?")["id"])
    assert job["status"] == "completed"
    assert "memory_recalled" not in [e["type"] for e in client.events(job["id"])]
