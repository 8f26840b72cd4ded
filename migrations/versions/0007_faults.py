"""faults: the sweeper tells a crashing step from a backlog

jobs.claimed_attempts counts the claims of the current step that ended without progress (a
worker died or lost the database mid-step): after AGENTQ_MAX_REDRIVES of them the job is
poison and fails. A re-drive nobody claimed (no worker consuming) is not counted; it is
sent again after jobs.redrive_after, with a growing delay.

Revision ID: 0007_faults
Revises: 0005_admin_schedules
Create Date: 2026-11-23 11:05:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007_faults'
down_revision = '0005_admin_schedules'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('claimed_attempts', sa.Integer(), nullable=False,
                                    server_default='0'))
    op.add_column('jobs', sa.Column('redrive_after', sa.DateTime(timezone=True),
                                    nullable=True))


def downgrade() -> None:
    op.drop_column('jobs', 'redrive_after')
    op.drop_column('jobs', 'claimed_attempts')
