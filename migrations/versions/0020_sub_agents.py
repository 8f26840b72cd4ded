"""sub-agents (issue 36): a child job knows its parent and the call it answers

- `jobs.parent_job_id` (null for a top-level job), indexed: a job object's `children`, a
  parent's cancel reaching its children, the sweeper's look at waiting parents.
- `jobs.parent_tool_use_id`: the parent's `agents.delegate` call this child answers; a
  unique index, so a call delivered twice (a redelivered task, the sweeper's re-dispatch)
  starts one child.

Revision ID: 0020_sub_agents
Revises: 0019_user_fixes
Create Date: 2026-11-26 21:40:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020_sub_agents'
down_revision = '0019_user_fixes'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('parent_job_id', sa.Uuid(), nullable=True))
        batch.add_column(sa.Column('parent_tool_use_id', sa.String(length=64), nullable=True))
    op.create_index(op.f('ix_jobs_parent_job_id'), 'jobs', ['parent_job_id'], unique=False)
    op.create_index('uq_jobs_parent_tool_use_id', 'jobs', ['parent_tool_use_id'],
                    unique=True)


def downgrade() -> None:
    op.drop_index('uq_jobs_parent_tool_use_id', table_name='jobs')
    op.drop_index(op.f('ix_jobs_parent_job_id'), table_name='jobs')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('parent_tool_use_id')
        batch.drop_column('parent_job_id')
