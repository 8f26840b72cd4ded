"""tool call leases

A started tool call holds a lease that its worker renews while the tool runs: a copy of the
call delivered meanwhile waits for its result instead of running it again, and a copy
delivered after the lease ran out knows the running worker died.

Revision ID: 0010_tool_call_leases
Revises: 0009_module_defaults
Create Date: 2026-11-24 14:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010_tool_call_leases'
down_revision = '0009_module_defaults'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_column('lease_until')
