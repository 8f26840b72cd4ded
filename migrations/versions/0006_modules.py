"""tool modules

External tool modules registered by URL or command (HTTP modules and MCP servers).

Revision ID: 0006_modules
Revises: 0008_provider_wait
Create Date: 2026-11-23 10:45:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0006_modules'
down_revision = '0008_provider_wait'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tool_modules',
        sa.Column('name', sa.String(length=31), nullable=False),
        sa.Column('kind', sa.String(length=8), nullable=False),
        sa.Column('url', sa.Text(), nullable=True),
        sa.Column('command', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'),
                  nullable=True),
        sa.Column('slow', sa.Boolean(), nullable=False),
        sa.Column('secret', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('name'))


def downgrade() -> None:
    op.drop_table('tool_modules')
