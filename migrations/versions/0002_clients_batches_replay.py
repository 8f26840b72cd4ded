"""clients batches replay

Revision ID: 0002_clients_batches_replay
Revises: 0001_initial_schema
Create Date: 2026-11-21 20:49:41.665467
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0002_clients_batches_replay'
down_revision = '0001_initial_schema'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('batches',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('api_key_id', sa.Uuid(), nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('total', sa.Integer(), nullable=False),
    sa.Column('max_concurrency', sa.Integer(), nullable=False),
    sa.Column('callback_url', sa.Text(), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_batches_api_key_id'), 'batches', ['api_key_id'], unique=False)
    op.create_table('idempotency_keys',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('api_key_id', sa.Uuid(), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('request_hash', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.Uuid(), nullable=True),
    sa.Column('batch_id', sa.Uuid(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('api_key_id', 'key', name='uq_idempotency_keys_key')
    )
    op.create_index(op.f('ix_idempotency_keys_created_at'), 'idempotency_keys', ['created_at'], unique=False)
    op.create_table('webhook_deliveries',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('event_id', sa.String(length=64), nullable=False),
    sa.Column('event_type', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.Uuid(), nullable=True),
    sa.Column('batch_id', sa.Uuid(), nullable=True),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('latency_ms', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_webhook_deliveries_batch', 'webhook_deliveries', ['batch_id', 'created_at'], unique=False)
    op.create_index(op.f('ix_webhook_deliveries_event_id'), 'webhook_deliveries', ['event_id'], unique=False)
    op.create_index('ix_webhook_deliveries_job', 'webhook_deliveries', ['job_id', 'created_at'], unique=False)
    op.create_index('ix_webhook_deliveries_due', 'webhook_deliveries', ['status', 'next_attempt_at'],
                    unique=False)
    op.create_table('job_inputs',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('job_id', sa.Uuid(), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('consumed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_job_inputs_pending', 'job_inputs', ['job_id', 'consumed_at'], unique=False)
    op.add_column('conversations', sa.Column('active_job_id', sa.Uuid(), nullable=True))
    op.add_column('jobs', sa.Column('waiting_for', sa.String(length=16), nullable=True))
    op.add_column('jobs', sa.Column('pending_inputs', sa.Integer(), nullable=False,
                                    server_default='0'))
    op.add_column('jobs', sa.Column('replay_mode', sa.String(length=16), nullable=True))
    op.add_column('jobs', sa.Column('batch_index', sa.Integer(), nullable=True))
    op.add_column('jobs', sa.Column('custom_id', sa.String(length=255), nullable=True))
    op.create_index('ix_jobs_batch_waiting', 'jobs', ['batch_id', 'waiting_for', 'batch_index'],
                    unique=False)


def downgrade() -> None:
    op.drop_index('ix_jobs_batch_waiting', table_name='jobs')
    op.drop_column('jobs', 'custom_id')
    op.drop_column('jobs', 'batch_index')
    op.drop_column('jobs', 'replay_mode')
    op.drop_column('jobs', 'pending_inputs')
    op.drop_column('jobs', 'waiting_for')
    op.drop_column('conversations', 'active_job_id')
    op.drop_index('ix_job_inputs_pending', table_name='job_inputs')
    op.drop_table('job_inputs')
    op.drop_index('ix_webhook_deliveries_due', table_name='webhook_deliveries')
    op.drop_index('ix_webhook_deliveries_job', table_name='webhook_deliveries')
    op.drop_index(op.f('ix_webhook_deliveries_event_id'), table_name='webhook_deliveries')
    op.drop_index('ix_webhook_deliveries_batch', table_name='webhook_deliveries')
    op.drop_table('webhook_deliveries')
    op.drop_index(op.f('ix_idempotency_keys_created_at'), table_name='idempotency_keys')
    op.drop_table('idempotency_keys')
    op.drop_index(op.f('ix_batches_api_key_id'), table_name='batches')
    op.drop_table('batches')
