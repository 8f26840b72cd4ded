"""branching (issue 36): a conversation continued from an earlier point of another

- `conversations.branched_from_conversation_id` and `conversations.branched_from_message_id`
  (both null for a conversation that is no branch): the conversation it was branched from
  and the first message it does not hold (the branch point); no foreign keys, so a branch
  outlives the conversation it came from.

Revision ID: 0021_branches
Revises: 0020_sub_agents
Create Date: 2026-11-26 21:45:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0021_branches'
down_revision = '0020_sub_agents'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('conversations') as batch:
        batch.add_column(sa.Column('branched_from_conversation_id', sa.Uuid(), nullable=True))
        batch.add_column(sa.Column('branched_from_message_id', sa.Uuid(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('conversations') as batch:
        batch.drop_column('branched_from_message_id')
        batch.drop_column('branched_from_conversation_id')
