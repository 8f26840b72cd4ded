"""Semantic memory (seeds 000/003): memories per user with their embeddings (the
OpenAI-compatible `/embeddings` endpoint, AGENTQ_EMBEDDING_MODEL), recalled top-k by cosine
similarity over the user's memories of the same embedding model.

Where the search runs is chosen at migration time (migration 0012) and named by
`/health/ready` (`memory_search`):
  pgvector   Postgres with the `vector` extension: `agentq_vectors.memory_vectors`, cosine
             distance, an HNSW index for AGENTQ_EMBEDDING_DIMENSIONS
  exact_sql  Postgres without it: the dot product of unit vectors (`real[]`, migration
             0013) computed in SQL, in parallel workers where Postgres may (exact)
  in_process SQLite: cosine over the user's newest MAX_SCAN memories in Python (exact)
"""
from __future__ import annotations

import math
import re
import threading
import uuid
from typing import Any, NamedTuple, Sequence

from sqlalchemy import (
    Exists,
    Float,
    SQLColumnExpression,
    Uuid,
    bindparam,
    column,
    exists,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import utcnow
from agentq.ids import new_id
from agentq.models import ApiKey, Job, Memory

RECALL_K = 5
MAX_MEMORY_CHARS = 2000
MAX_SCAN = 20_000
"""Most memories of one user searched in process (the newest)."""

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
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else -1.0


def has_memories(session: Session, user_id: uuid.UUID) -> bool:
    return bool(session.execute(select(has_memories_clause(user_id))).scalar())


def has_memories_clause(user_id: uuid.UUID | SQLColumnExpression[uuid.UUID]) -> Exists:
    """EXISTS (a memory of `user_id`, a value or a column): a step reads it with its user."""
    return exists().where(Memory.user_id == user_id)


def remember(session: Session, *, tenant_id: uuid.UUID, user_id: uuid.UUID, content: str,
             embedding: list[float], model: str, source: str,
             conversation_id: uuid.UUID | None = None,
             job_id: uuid.UUID | None = None) -> Memory:
    memory = Memory(id=new_id(), tenant_id=tenant_id, user_id=user_id,
                    content=content[:MAX_MEMORY_CHARS], embedding=list(embedding),
                    embedding_model=model, source=source, conversation_id=conversation_id,
                    job_id=job_id, created_at=utcnow())
    session.add(memory)
    return memory


VECTOR_SCHEMA = "agentq_vectors"
IN_PROCESS = "in_process"
DEFAULT_EF_SEARCH = Settings.memory_ef_search
"""`hnsw.ef_search` for a recall (AGENTQ_MEMORY_EF_SEARCH's default; pgvector's own is 40)."""


class _Backend(NamedTuple):
    name: str
    hnsw_dimensions: int | None = None
    iterative_scan: bool = False
    """pgvector 0.8.0 or later: `hnsw.iterative_scan` exists."""


_backends: dict[str, _Backend] = {}


def search_backend(session: Session) -> tuple[str, int | None]:
    """(`pgvector` | `exact_sql` | `in_process`, the HNSW index's dimensions or None), as
    the migrations chose for this database; read once per database URL."""
    backend = _backend(session)
    return backend.name, backend.hnsw_dimensions


def _backend(session: Session) -> _Backend:
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        return _Backend(IN_PROCESS)
    key = bind.engine.url.render_as_string(hide_password=True)
    with _lock:
        found = _backends.get(key)
    if found is not None:
        return found
    row = session.execute(text(
        "SELECT to_regclass(:t) IS NOT NULL"), {"t": f"{VECTOR_SCHEMA}.backend"}).scalar()
    if not row:  # not migrated this far: the search in process still works
        found = _Backend(IN_PROCESS)
    else:
        name, dims, version = session.execute(text(
            f"SELECT name, dimensions, (SELECT extversion FROM pg_extension "
            f"WHERE extname = 'vector') FROM {VECTOR_SCHEMA}.backend LIMIT 1")).one()
        found = (_Backend("pgvector", dims, _version(version or "0") >= (0, 8, 0))
                 if name == "pgvector" else _Backend("exact_sql"))
    with _lock:
        _backends[key] = found
    return found


def _version(text_version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text_version)[:3])


def pgvector_query(dims: int, owned: str = "") -> str:
    """The pgvector search of one user's memories of a model and dimension count (through
    the HNSW index when the dimensions are the index's). Parameters: u (user id), m (model),
    d (dimensions), k, q (the query, `vector_literal`); `owned` a further condition (the
    key's own memories, parameter `key`)."""
    vector = f"vector({int(dims)})"
    return (f"SELECT memory_id, 1 - (embedding::{vector} <=> CAST(:q AS {vector})) AS score "
            f"FROM {VECTOR_SCHEMA}.memory_vectors "
            "WHERE user_id = :u AND model = :m AND dims = :d " + owned +
            f"ORDER BY embedding::{vector} <=> CAST(:q AS {vector}) LIMIT :k")


def vector_literal(values: Sequence[float]) -> str:
    """pgvector's text form of a vector: `[0.1,0.2,...]`."""
    return "[" + ",".join(repr(float(x)) for x in values) + "]"


def _hnsw_settings(session: Session, ef_search: int, iterative_scan: bool) -> None:
    """This transaction's HNSW search: `ef_search` candidates, and where pgvector has it an
    iterative scan in exact distance order. The index holds every user's memories and the
    user is a filter after it: without the iterative scan, a user whose memories are few
    among many others' gets fewer than k, often none, because the candidates the index
    found belonged to the others."""
    session.execute(text(
        "SELECT set_config('hnsw.ef_search', :ef, true)"
        + (", set_config('hnsw.iterative_scan', 'strict_order', true)"
           if iterative_scan else "")), {"ef": str(int(ef_search))})


def recall_scope(session: Session, api_key_id: uuid.UUID | None) -> uuid.UUID | None:
    """Whose memories a job of `api_key_id` may recall: None (all the user's) for an admin
    key or no key (the CLI); the key itself for another key, which recalls only what was
    remembered in its own conversations (README "Tenants": a non-admin key sees the rows
    it created)."""
    if api_key_id is None:
        return None
    is_admin = session.execute(select(ApiKey.is_admin).where(ApiKey.id == api_key_id)
                               ).scalar_one_or_none()
    return None if is_admin else api_key_id


def _of_key(api_key_id: uuid.UUID):
    """Memories remembered in a conversation where the key has a job."""
    return exists().where(Job.conversation_id == Memory.conversation_id,
                          Job.api_key_id == api_key_id)


_OF_KEY_SQL = ("AND memory_id IN (SELECT m.id FROM memories m WHERE m.user_id = :u AND "
               "EXISTS (SELECT 1 FROM jobs j WHERE j.conversation_id = m.conversation_id "
               "AND j.api_key_id = :key)) ")


def recall(session: Session, user_id: uuid.UUID, query: list[float], model: str,
           k: int = RECALL_K, touch: bool = True,
           ef_search: int = DEFAULT_EF_SEARCH,
           api_key_id: uuid.UUID | None = None) -> list[tuple[Memory, float]]:
    """The user's `k` memories most similar to `query` (embedded with `model`); on pgvector
    the HNSW search looks at `ef_search` candidates (AGENTQ_MEMORY_EF_SEARCH).
    `api_key_id` (`recall_scope`'s answer): only those remembered in that key's
    conversations."""
    backend = _backend(session)
    if backend.name == IN_PROCESS or not query:
        query_rows = select(Memory).where(Memory.user_id == user_id,
                                          Memory.embedding_model == model)
        if api_key_id is not None:
            query_rows = query_rows.where(_of_key(api_key_id))
        rows = session.execute(query_rows.order_by(Memory.created_at.desc())
                               .limit(MAX_SCAN)).scalars().all()
        scored = sorted(((m, cosine(m.embedding, query)) for m in rows),
                        key=lambda pair: pair[1], reverse=True)[:k]
    else:
        scored = _search_sql(session, backend, user_id, query, model, k, ef_search,
                             api_key_id)
    if touch and scored:
        session.execute(update(Memory).where(Memory.id.in_([m.id for m, _ in scored]))
                        .values(last_recalled_at=utcnow()))
    return scored


def _search_sql(session: Session, backend: _Backend, user_id: uuid.UUID, query: list[float],
                model: str, k: int, ef_search: int,
                api_key_id: uuid.UUID | None = None) -> list[tuple[Memory, float]]:
    """Nearest neighbours in Postgres: by pgvector's cosine distance (through the HNSW index
    when the dimensions are the index's), else the exact dot product of unit vectors in SQL
    (the stored ones are, migration 0013; the query is made one here)."""
    dims = len(query)
    params = {"u": user_id, "m": model, "d": dims, "k": k}
    owned = ""
    if api_key_id is not None:
        params["key"], owned = api_key_id, _OF_KEY_SQL
    if backend.name == "pgvector":
        _hnsw_settings(session, ef_search, backend.iterative_scan)
        params["q"] = vector_literal(query)
        sql = pgvector_query(dims, owned)
    else:
        norm = math.sqrt(sum(x * x for x in query))
        if not norm:
            return []
        params["q"] = [float(x) / norm for x in query]
        sql = (f"SELECT memory_id, {VECTOR_SCHEMA}.dot(embedding, "
               "CAST(:q AS double precision[])) AS score "
               f"FROM {VECTOR_SCHEMA}.memory_vectors "
               "WHERE user_id = :u AND model = :m AND dims = :d " + owned +
               "ORDER BY score DESC NULLS LAST, memory_id LIMIT :k")
    statement = text(sql).bindparams(bindparam("u", type_=Uuid))
    if api_key_id is not None:
        statement = statement.bindparams(bindparam("key", type_=Uuid))
    ranking = statement.columns(column("memory_id", Uuid), column("score", Float))
    ranked = [(memory_id, float(score) if score is not None else -1.0)
              for memory_id, score in session.execute(ranking, params).all()]
    if not ranked:
        return []
    rows = {m.id: m for m in session.execute(
        select(Memory).where(Memory.id.in_([i for i, _ in ranked]))).scalars()}
    return [(rows[i], score) for i, score in ranked if i in rows]
