"""memory vectors: nearest-neighbour search of memories in Postgres

On Postgres, memories' embeddings are mirrored (by a trigger on `memories`) into
`agentq_vectors.memory_vectors`, searched in SQL. The backend is chosen here, at migration
time, and recorded in `agentq_vectors.backend`:

- `pgvector`: the `vector` extension could be created; embeddings are `vector`, searched by
  cosine distance, with an HNSW index (cosine) for AGENTQ_EMBEDDING_DIMENSIONS (1536) —
  other dimensions are searched exactly.
- `exact`: no pgvector; embeddings are `double precision[]` with their norm, and cosine
  similarity is computed in SQL over the user's memories (exact).

The search schema is its own (`agentq_vectors`) so the models' schema is the same on every
database; SQLite has none of it and searches in process (agentq.memory).

Revision ID: 0012_memory_vectors
Revises: 0011_memory_digests
Create Date: 2026-11-24 14:40:00
"""
from __future__ import annotations

import os

from alembic import op
from sqlalchemy import text

revision = '0012_memory_vectors'
down_revision = '0011_memory_digests'
branch_labels = None
depends_on = None

SCHEMA = "agentq_vectors"


def _dimensions() -> int:
    try:
        return max(1, min(16000, int(os.environ.get("AGENTQ_EMBEDDING_DIMENSIONS") or 1536)))
    except ValueError:
        return 1536


def _has_pgvector(bind) -> bool:
    """Whether `CREATE EXTENSION vector` works here (in a savepoint: a failure leaves the
    migration's transaction usable)."""
    if os.environ.get("AGENTQ_VECTOR_BACKEND") == "exact":
        return False
    available = bind.execute(text(
        "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")).first()
    if not available:
        return False
    savepoint = bind.begin_nested()
    try:
        bind.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
    except Exception:  # noqa: BLE001 - no privilege, or a broken install: the exact search
        savepoint.rollback()
        return False
    savepoint.commit()
    return True


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    pgvector = _has_pgvector(bind)
    column = "vector" if pgvector else "double precision[]"
    value = ("ARRAY(SELECT jsonb_array_elements_text(NEW.embedding)::float8)::vector"
             if pgvector else
             "ARRAY(SELECT jsonb_array_elements_text(NEW.embedding)::float8)")
    statements = [
        f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
        f"CREATE TABLE {SCHEMA}.backend (name text PRIMARY KEY, dimensions integer)",
        f"INSERT INTO {SCHEMA}.backend VALUES ('{'pgvector' if pgvector else 'exact'}', "
        f"{_dimensions()})",
        f"""CREATE TABLE {SCHEMA}.memory_vectors (
            memory_id uuid PRIMARY KEY REFERENCES public.memories(id) ON DELETE CASCADE,
            user_id uuid NOT NULL,
            model varchar(200) NOT NULL,
            dims integer NOT NULL,
            embedding {column} NOT NULL,
            norm double precision NOT NULL)""",
        f"CREATE INDEX ix_memory_vectors_user ON {SCHEMA}.memory_vectors (user_id, model, dims)",
        f"""CREATE FUNCTION {SCHEMA}.sync_memory() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {SCHEMA}.memory_vectors (memory_id, user_id, model, dims, embedding, norm)
            SELECT NEW.id, NEW.user_id, NEW.embedding_model,
                   jsonb_array_length(NEW.embedding), {value},
                   coalesce(sqrt((SELECT sum(x::float8 * x::float8)
                                  FROM jsonb_array_elements_text(NEW.embedding) AS x)), 0)
            WHERE jsonb_typeof(NEW.embedding) = 'array'
              AND jsonb_array_length(NEW.embedding) > 0
            ON CONFLICT (memory_id) DO UPDATE SET user_id = EXCLUDED.user_id,
                model = EXCLUDED.model, dims = EXCLUDED.dims,
                embedding = EXCLUDED.embedding, norm = EXCLUDED.norm;
            RETURN NEW;
        END $$""",
        f"""CREATE TRIGGER memories_vectors AFTER INSERT OR UPDATE OF embedding,
            embedding_model, user_id ON public.memories
            FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.sync_memory()""",
        # memories stored before: mirrored now
        "UPDATE public.memories SET embedding = embedding",
    ]
    if pgvector:
        dims = _dimensions()
        statements.append(
            f"CREATE INDEX ix_memory_vectors_hnsw ON {SCHEMA}.memory_vectors USING hnsw "
            f"((embedding::vector({dims})) vector_cosine_ops) WHERE dims = {dims}")
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS memories_vectors ON public.memories")
    op.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
