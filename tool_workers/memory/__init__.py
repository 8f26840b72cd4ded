"""Tool module `memory`: remember things about the user and recall them (seeds 000/003)."""
from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from agentq import memory
from agentq.errors import ProviderError, ToolError
from agentq.models import Job
from agentq.tools.manifest import ToolContext, define_module

MEMORY_ID_NAMESPACE = uuid.UUID("6b1f4d2e-8c3a-5e7b-9d10-2f4a6c8e0b13")
"""A remembered memory's id is uuid5(this, tool_use_id): one memory per tool call."""


def _settings(ctx: ToolContext):
    settings = ctx.extra.get("settings")
    if settings is None:
        from agentq.config import Settings
        settings = Settings.from_env()
    return settings


def _embed(ctx: ToolContext, text: str) -> tuple[list[float], str]:
    settings = _settings(ctx)
    try:
        return memory.router_for(settings).embed(text), settings.embedding_model
    except ProviderError as exc:
        raise ToolError(f"embedding failed: {exc.message}") from None


def remember(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if ctx.session_factory is None:
        raise ToolError("memory tools need a database session")
    content = args["content"].strip()
    # one memory per tool call, however often the call is delivered
    memory_id = uuid.uuid5(MEMORY_ID_NAMESPACE, ctx.idempotency_key)
    with ctx.session_factory() as session:
        if session.get(memory.Memory, memory_id) is not None:
            return {"memory_id": str(memory_id),
                    "remembered": content[:memory.MAX_MEMORY_CHARS]}
    vector, model = _embed(ctx, content)
    with ctx.session_factory() as session, session.begin():
        if session.get(memory.Memory, memory_id) is None:
            tenant_id = session.execute(select(Job.tenant_id).where(
                Job.id == uuid.UUID(ctx.job_id))).scalar_one()
            row = memory.remember(session, tenant_id=tenant_id,
                                  user_id=uuid.UUID(ctx.user_id), content=content,
                                  embedding=vector, model=model, source="tool",
                                  conversation_id=uuid.UUID(ctx.conversation_id),
                                  job_id=uuid.UUID(ctx.job_id))
            row.id = memory_id
    return {"memory_id": str(memory_id), "remembered": content[:memory.MAX_MEMORY_CHARS]}


def recall(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if ctx.session_factory is None:
        raise ToolError("memory tools need a database session")
    k = int(args.get("k", memory.RECALL_K))
    vector, model = _embed(ctx, args["query"])
    with ctx.session_factory() as session, session.begin():
        key = session.execute(select(Job.api_key_id).where(
            Job.id == uuid.UUID(ctx.job_id))).scalar_one_or_none()
        found = memory.recall(session, uuid.UUID(ctx.user_id), vector, model, k,
                              ef_search=_settings(ctx).memory_ef_search,
                              api_key_id=memory.recall_scope(session, key))
        return {"memories": [{"content": m.content, "similarity": round(score, 4),
                              "created_at": m.created_at.isoformat()} for m, score in found]}


MODULE = define_module({
    "module": "memory",
    "description": "Remember facts about the user across conversations, and recall them.",
    "tools": [
        {"name": "memory.remember",
         "description": "Remember a fact about the user for later conversations.",
         "parameters": {
             "type": "object",
             # no maxLength: local servers turn it into a grammar of that many rules
             # (llama.cpp refuses 2,000); longer facts are cut to MAX_MEMORY_CHARS
             "properties": {"content": {"type": "string", "minLength": 1,
                                        "description": "The fact, as one sentence."}},
             "required": ["content"], "additionalProperties": False},
         "permission": "guest", "function": remember, "time_limit_s": 30},
        {"name": "memory.recall",
         "description": "Recall what was remembered about the user, most relevant first.",
         "parameters": {
             "type": "object",
             "properties": {"query": {"type": "string", "minLength": 1,
                                      "description": "What to look for."},
                            "k": {"type": "integer", "minimum": 1, "maximum": 20,
                                  "default": memory.RECALL_K}},
             "required": ["query"], "additionalProperties": False},
         "permission": "guest", "function": recall, "time_limit_s": 30},
    ],
})
