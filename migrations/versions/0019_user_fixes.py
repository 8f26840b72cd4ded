"""what users saw go wrong, API side (issue 31): the limits that apply to a job

- `jobs.limits_applied` (JSON, null for jobs made before it): the limits that apply to the
  job, for each the smallest of the request's, the persona's and the settings', fixed when
  the job is made; `jobs.limits` keeps what the request asked for.

Revision ID: 0019_user_fixes
Revises: 0016_tenant_admins
Create Date: 2026-11-26 20:50:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0019_user_fixes'
down_revision = '0016_tenant_admins'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('limits_applied', JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('limits_applied')
