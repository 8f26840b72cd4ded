"""memory digests: idle conversations summarised into memories

`conversations.memory_summarized_seq` is the last message seq an idle conversation's
summary into memory covers (the maintenance task `maintenance.summarize_idle` writes a
memory when a conversation idle long enough has messages after it).

Revision ID: 0011_memory_digests
Revises: 0010_tool_call_leases
Create Date: 2026-11-24 14:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011_memory_digests'
down_revision = '0010_tool_call_leases'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('conversations') as batch:
        batch.add_column(sa.Column('memory_summarized_seq', sa.BigInteger(), nullable=False,
                                   server_default='0'))
    op.create_index('ix_conversations_idle', 'conversations', ['last_active_at'])


def downgrade() -> None:
    op.drop_index('ix_conversations_idle', table_name='conversations')
    with op.batch_alter_table('conversations') as batch:
        batch.drop_column('memory_summarized_seq')
