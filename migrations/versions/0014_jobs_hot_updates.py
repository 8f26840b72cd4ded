"""jobs: a step's updates of its job's row are heap-only (HOT)

A one-tool job updates its row about eight times (claims, turns, events' counter, end).
`ix_jobs_sweep` held (status, last_progress_at), and every step sets last_progress_at: no
update could be heap-only, so each wrote a new entry in all nine of the table's indexes
(about 10% of the updates were HOT, `pg_stat_user_tables`). The index is now on status
alone, which is all the sweeper needs to find the live jobs (it sorts those few by their
progress) and what the per-status counts (/metrics) and filters read. An update that
changes no indexed column is heap-only when its page has room: `jobs` and `tool_calls` (a
call's row is updated when it starts and when it ends) keep a fifth of each new page free.
Measured (`python -m benchmarks compare`, three pairs of two bursts of 300): the WAL a job
writes fell from 25.7 to 20.7 kB (0.803-0.805 by pair); CPU per job did not move beyond
the machine's noise (Postgres 0.96-1.04).

The index is built in the migration's transaction (writes to `jobs` wait for it): on a
large table, build `ix_jobs_status` CONCURRENTLY by hand first; this migration then keeps
it. SQLite: the index only.

Revision ID: 0014_jobs_hot_updates
Revises: 0013_memory_unit_vectors
Create Date: 2026-11-25 15:10:00
"""
from __future__ import annotations

from alembic import op

revision = '0014_jobs_hot_updates'
down_revision = '0013_memory_unit_vectors'
branch_labels = None
depends_on = None

FILLFACTOR = 80
"""Percent of a new heap page filled by inserts: the rest is for the row's updates."""


def upgrade() -> None:
    op.create_index("ix_jobs_status", "jobs", ["status"], if_not_exists=True)
    op.drop_index("ix_jobs_sweep", table_name="jobs")
    if op.get_bind().dialect.name == "postgresql":
        for table in ("jobs", "tool_calls"):
            op.execute(f"ALTER TABLE {table} SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in ("jobs", "tool_calls"):
            op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    op.create_index("ix_jobs_sweep", "jobs", ["status", "last_progress_at"])
    op.drop_index("ix_jobs_status", table_name="jobs")
