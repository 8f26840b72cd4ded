"""context: conversation summaries, memories, per-job limits, follow-up links

Revision ID: 0004_context
Revises: 0006_modules
Create Date: 2026-11-23 10:40:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0004_context'
down_revision = '0006_modules'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        'conversation_summaries',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('conversation_id', sa.Uuid(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('content', sa.Text(), nullable=False),
        sa.Column('through_seq', sa.BigInteger(), nullable=False),
        sa.Column('messages_summarized', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.Uuid(), nullable=True),
        sa.Column('model', sa.String(length=200), nullable=True),
        sa.Column('input_tokens', sa.Integer(), nullable=False),
        sa.Column('output_tokens', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'],
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('conversation_id', 'version',
                            name='uq_conversation_summaries_version'))
    op.create_table(
        'memories',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(), nullable=False),
        sa.Column('user_id', sa.Uuid(), nullable=False),
        sa.Column('content', sa.Text(), nullable=False),
        sa.Column('embedding', JSON, nullable=False),
        sa.Column('embedding_model', sa.String(length=200), nullable=False),
        sa.Column('source', sa.String(length=32), nullable=False),
        sa.Column('conversation_id', sa.Uuid(), nullable=True),
        sa.Column('job_id', sa.Uuid(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_recalled_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id']),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_memories_user', 'memories', ['user_id', 'created_at'])
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('limits', JSON, nullable=True))
        batch.add_column(sa.Column('follow_up_job_id', sa.Uuid(), nullable=True))
    with op.batch_alter_table('personas') as batch:
        batch.add_column(sa.Column('limits', JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('personas') as batch:
        batch.drop_column('limits')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('follow_up_job_id')
        batch.drop_column('limits')
    op.drop_index('ix_memories_user', table_name='memories')
    op.drop_table('memories')
    op.drop_table('conversation_summaries')
