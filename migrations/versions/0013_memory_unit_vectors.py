"""memory unit vectors: the exact search (`exact` backend of 0012) stores unit vectors

Where 0012 chose the exact search (no pgvector), `agentq_vectors.memory_vectors.embedding`
becomes `real[]` divided by its norm (the norm is kept), so cosine similarity is the dot
product with the unit query, computed by `agentq_vectors.dot` (a plain SQL function,
parallel safe: a parallel scan runs it in workers; the table asks for 2). Half the bytes
read, no division per row; agentq.memory searches it. Measured in docs/benchmarks.md
("Memory recall").

On pgvector (and SQLite) nothing changes. Data-preserving both ways: the vectors are
recomputed from `memories.embedding` (the JSON array stays the source) by the trigger.

Revision ID: 0013_memory_unit_vectors
Revises: 0012_memory_vectors
Create Date: 2026-11-24 19:20:00
"""
from __future__ import annotations

from alembic import op
from sqlalchemy import text

revision = '0013_memory_unit_vectors'
down_revision = '0012_memory_vectors'
branch_labels = None
depends_on = None

SCHEMA = "agentq_vectors"

_SYNC = """CREATE OR REPLACE FUNCTION {schema}.sync_memory() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    n double precision;
BEGIN
    IF NEW.embedding IS NULL OR jsonb_typeof(NEW.embedding) <> 'array'
            OR jsonb_array_length(NEW.embedding) = 0 THEN
        RETURN NEW;
    END IF;
    n := coalesce(sqrt((SELECT sum(x::float8 * x::float8)
                        FROM jsonb_array_elements_text(NEW.embedding) AS x)), 0);
    INSERT INTO {schema}.memory_vectors (memory_id, user_id, model, dims, embedding, norm)
    VALUES (NEW.id, NEW.user_id, NEW.embedding_model, jsonb_array_length(NEW.embedding),
            {value}, n)
    ON CONFLICT (memory_id) DO UPDATE SET user_id = EXCLUDED.user_id,
        model = EXCLUDED.model, dims = EXCLUDED.dims,
        embedding = EXCLUDED.embedding, norm = EXCLUDED.norm;
    RETURN NEW;
END $$"""
UNIT = ("ARRAY(SELECT (x::float8 / nullif(n, 0))::real "
        "FROM jsonb_array_elements_text(NEW.embedding) WITH ORDINALITY AS e(x, i) ORDER BY i)")
RAW = ("ARRAY(SELECT x::float8 "
       "FROM jsonb_array_elements_text(NEW.embedding) WITH ORDINALITY AS e(x, i) ORDER BY i)")
DOT = (f"CREATE FUNCTION {SCHEMA}.dot(real[], double precision[]) RETURNS double precision "
       "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE COST 1000 "
       "AS 'SELECT sum(p) FROM (SELECT unnest($1) * unnest($2) AS p) AS s'")
"""The unnests in the select list run in step (no tuplestore per row, unlike `FROM
unnest(a, b)`). COST tells the planner a call is dear (some 0.1 ms at 1,536 dimensions), so
that splitting a user's memories among parallel workers pays."""
PARALLEL = f"ALTER TABLE {SCHEMA}.memory_vectors SET (parallel_workers = 2)"
"""The table's heap is small (the vectors are TOASTed), under the size at which Postgres would
plan workers by itself."""


def _exact(bind) -> bool:
    if bind.dialect.name != "postgresql":
        return False
    if not bind.execute(text("SELECT to_regclass(:t) IS NOT NULL"),
                        {"t": f"{SCHEMA}.backend"}).scalar():
        return False
    return bind.execute(text(f"SELECT name FROM {SCHEMA}.backend LIMIT 1")).scalar() == "exact"


def _remirror(column_type: str, value: str) -> list[str]:
    """The vectors recomputed from `memories.embedding` in the new form."""
    return [
        f"TRUNCATE {SCHEMA}.memory_vectors",
        f"ALTER TABLE {SCHEMA}.memory_vectors ALTER COLUMN embedding TYPE {column_type} "
        f"USING embedding::{column_type}",
        _SYNC.format(schema=SCHEMA, value=value),
        "UPDATE public.memories SET embedding = embedding",
    ]


def upgrade() -> None:
    if not _exact(op.get_bind()):
        return
    for statement in [DOT, *_remirror("real[]", UNIT), PARALLEL]:
        op.execute(statement)


def downgrade() -> None:
    if not _exact(op.get_bind()):
        return
    for statement in [f"ALTER TABLE {SCHEMA}.memory_vectors RESET (parallel_workers)",
                      *_remirror("double precision[]", RAW),
                      f"DROP FUNCTION {SCHEMA}.dot(real[], double precision[])"]:
        op.execute(statement)
