"""Semantic memory (seeds 000/003): memories per user with their embeddings (the
OpenAI-compatible `/embeddings` endpoint, AGENTQ_EMBEDDING_MODEL), recalled top-k by exact
cosine similarity over the user's memories, in process (the same on Postgres and SQLite).
pgvector with an HNSW index is not used: this machine's Postgres 15 has no pgvector.
"""
from __future__ import annotations

import math
import threading
import uuid
from typing import Any, Sequence

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.models import Memory

RECALL_K = 5
MAX_MEMORY_CHARS = 2000
MAX_SCAN = 20_000
"""Most memories of one user searched (the newest)."""

_routers: dict[int, Any] = {}
_lock = threading.Lock()


def router_for(settings):
    """One LLMRouter per process for tools that embed."""
    with _lock:
        router = _routers.get(id(settings))
        if router is None:
            from agentq.llm.router import LLMRouter
            router = _routers[id(settings)] = LLMRouter(settings)
        return router


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b) or not a:
        return -1.0
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else -1.0


def has_memories(session: Session, user_id: uuid.UUID) -> bool:
    return bool(session.execute(select(exists().where(Memory.user_id == user_id))).scalar())


def remember(session: Session, *, tenant_id: uuid.UUID, user_id: uuid.UUID, content: str,
             embedding: list[float], model: str, source: str,
             conversation_id: uuid.UUID | None = None,
             job_id: uuid.UUID | None = None) -> Memory:
    memory = Memory(id=uuid.uuid4(), tenant_id=tenant_id, user_id=user_id,
                    content=content[:MAX_MEMORY_CHARS], embedding=list(embedding),
                    embedding_model=model, source=source, conversation_id=conversation_id,
                    job_id=job_id, created_at=utcnow())
    session.add(memory)
    return memory


def recall(session: Session, user_id: uuid.UUID, query: list[float], model: str,
           k: int = RECALL_K, touch: bool = True) -> list[tuple[Memory, float]]:
    """The user's `k` memories most similar to `query` (embedded with `model`)."""
    rows = session.execute(
        select(Memory).where(Memory.user_id == user_id, Memory.embedding_model == model)
        .order_by(Memory.created_at.desc()).limit(MAX_SCAN)).scalars().all()
    scored = sorted(((m, cosine(m.embedding, query)) for m in rows),
                    key=lambda pair: pair[1], reverse=True)[:k]
    if touch and scored:
        session.execute(update(Memory).where(Memory.id.in_([m.id for m, _ in scored]))
                        .values(last_recalled_at=utcnow()))
    return scored
