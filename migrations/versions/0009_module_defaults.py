"""module defaults

A registered tool module's defaults for its tools: the permission a caller needs, which
calls wait for approval, and a time limit (an MCP server declares none of these).

Revision ID: 0009_module_defaults
Revises: 0007_faults
Create Date: 2026-11-24 10:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0009_module_defaults'
down_revision = '0007_faults'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tool_modules') as batch:
        batch.add_column(sa.Column(
            'defaults', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'),
            nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tool_modules') as batch:
        batch.drop_column('defaults')
