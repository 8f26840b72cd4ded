"""provider wait

A job whose every model keeps failing with transient errors waits for its provider
(`waiting_for = 'provider'`) instead of failing: when the wait began, when it tries again,
and how many attempts failed.

Revision ID: 0008_provider_wait
Revises: 0003_tenants
Create Date: 2026-11-23 10:50:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008_provider_wait'
down_revision = '0003_tenants'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('provider_wait_since', sa.DateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column('provider_next_attempt_at', sa.DateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column('provider_attempts', sa.Integer(), nullable=False,
                                   server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('provider_attempts')
        batch.drop_column('provider_next_attempt_at')
        batch.drop_column('provider_wait_since')
