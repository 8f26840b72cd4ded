"""admin surface and schedules

One default persona per tenant (a partial unique index); schedules (seed 000's scheduler)
and their firings, one row per (schedule, tick); tool calls awaiting a person's approval
(their deadline) and the data of webhook events beside the job (the call to approve);
`stream` on jobs and personas (token streaming).

Revision ID: 0005_admin_schedules
Revises: 0004_context
Create Date: 2026-11-23 10:40:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005_admin_schedules'
down_revision = '0004_context'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a tenant with several defaults keeps its oldest one
    op.execute("UPDATE personas SET is_default = false WHERE is_default AND id NOT IN ("
               "SELECT id FROM (SELECT DISTINCT ON (tenant_id) id FROM personas "
               "WHERE is_default ORDER BY tenant_id, created_at, id) AS oldest)"
               if op.get_bind().dialect.name == "postgresql" else
               "UPDATE personas SET is_default = 0 WHERE is_default AND id NOT IN ("
               "SELECT p.id FROM personas p WHERE p.is_default AND p.created_at = ("
               "SELECT min(q.created_at) FROM personas q WHERE q.is_default "
               "AND q.tenant_id = p.tenant_id))")
    op.create_index('uq_personas_one_default', 'personas', ['tenant_id'], unique=True,
                    postgresql_where=sa.text('is_default'),
                    sqlite_where=sa.text('is_default'))
    op.create_table(
        'schedules',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(), nullable=False),
        sa.Column('api_key_id', sa.Uuid(), nullable=True),
        sa.Column('conversation_id', sa.Uuid(), nullable=False),
        sa.Column('user_id', sa.Uuid(), nullable=False),
        sa.Column('content', sa.Text(), nullable=False),
        sa.Column('kind', sa.String(length=8), nullable=False),
        sa.Column('run_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('cron', sa.String(length=200), nullable=True),
        sa.Column('timezone', sa.String(length=64), nullable=False),
        sa.Column('next_run_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('created_by', sa.String(length=16), nullable=False),
        sa.Column('tool_use_id', sa.String(length=64), nullable=True),
        sa.Column('callback_url', sa.Text(), nullable=True),
        sa.Column('metadata', sa.JSON().with_variant(
            sa.dialects.postgresql.JSONB(), 'postgresql'), nullable=False),
        sa.Column('fire_count', sa.Integer(), nullable=False),
        sa.Column('last_fired_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'],
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('tool_use_id'))
    op.create_index('ix_schedules_due', 'schedules', ['status', 'next_run_at'])
    op.create_index('ix_schedules_tenant_id', 'schedules', ['tenant_id'])
    op.create_index('ix_schedules_api_key_id', 'schedules', ['api_key_id'])
    op.create_index('ix_schedules_conversation_id', 'schedules', ['conversation_id'])
    op.create_index('ix_schedules_user_id', 'schedules', ['user_id'])
    op.create_table(
        'schedule_firings',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('schedule_id', sa.Uuid(), nullable=False),
        sa.Column('fire_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('job_id', sa.Uuid(), nullable=True),
        sa.Column('missed', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['schedule_id'], ['schedules.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('schedule_id', 'fire_at', name='uq_schedule_firings_tick'))
    for table in ('jobs', 'personas'):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('stream', sa.Boolean(), nullable=False,
                                       server_default=sa.text('false')))
    with op.batch_alter_table('personas') as batch:
        batch.add_column(sa.Column('approval_tools', sa.JSON().with_variant(
            sa.dialects.postgresql.JSONB(), 'postgresql'), nullable=True))
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('approval_expires_at', sa.DateTime(timezone=True),
                                   nullable=True))
    with op.batch_alter_table('webhook_deliveries') as batch:
        batch.add_column(sa.Column('data', sa.JSON().with_variant(
            sa.dialects.postgresql.JSONB(), 'postgresql'), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('webhook_deliveries') as batch:
        batch.drop_column('data')
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_column('approval_expires_at')
    with op.batch_alter_table('personas') as batch:
        batch.drop_column('approval_tools')
    for table in ('personas', 'jobs'):
        with op.batch_alter_table(table) as batch:
            batch.drop_column('stream')
    op.drop_table('schedule_firings')
    for name in ('ix_schedules_user_id', 'ix_schedules_conversation_id',
                 'ix_schedules_api_key_id', 'ix_schedules_tenant_id', 'ix_schedules_due'):
        op.drop_index(name, table_name='schedules')
    op.drop_table('schedules')
    op.drop_index('uq_personas_one_default', table_name='personas')
