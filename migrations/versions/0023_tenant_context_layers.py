"""a tenant's default context layers (issue 36: "context layers on a persona (or a tenant)")

- `tenants.bootstrap` (text): the bootstrap text of a job whose persona has none of its own.
- `tenants.skills` (JSON): [{name, instructions, tools}], sent before the persona's skills,
  less those the persona names again.

Set by the tenant's admin (or an operator) with `PATCH /v1/admin/tenants/<id>/context_layers`
(agentq.loop.layers).

Revision ID: 0023_tenant_context_layers
Revises: 0022_context_layers
Create Date: 2026-11-27 00:40:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0023_tenant_context_layers'
down_revision = '0022_context_layers'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(sa.Column('bootstrap', sa.Text(), nullable=True))
        batch.add_column(sa.Column('skills', JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('skills')
        batch.drop_column('bootstrap')
