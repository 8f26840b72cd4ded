"""job_events keyed by (job_id, seq) (issue 34: "natural keys on append-only tables")

An event is named by its job and its number there (`jobs.event_seq` counts them), and every
read of events is by job, in that order. Its own random `id` was never read: it cost each
row 16 bytes and a second unique index to write (a job writes ~14 events). The unique
(job_id, seq) becomes the primary key; `id` goes.

On Postgres the new key is built while the table is locked (a scan of job_events): on a
deployment with many millions of events, run the upgrade in a quiet window.

Revision ID: 0024_job_events_natural_key
Revises: 0023_tenant_context_layers
Create Date: 2026-11-28 17:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0024_job_events_natural_key'
down_revision = '0023_tenant_context_layers'
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint('job_events_pkey', 'job_events', type_='primary')
        op.drop_constraint('uq_job_events_job_seq', 'job_events', type_='unique')
        op.drop_column('job_events', 'id')
        op.create_primary_key('job_events_pkey', 'job_events', ['job_id', 'seq'])
        return
    with op.batch_alter_table('job_events', recreate='always') as batch:
        batch.drop_constraint('uq_job_events_job_seq', type_='unique')
        batch.drop_column('id')
        batch.create_primary_key('job_events_pkey', ['job_id', 'seq'])


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.add_column('job_events', sa.Column('id', sa.Uuid(), nullable=True))
        op.execute("UPDATE job_events SET id = gen_random_uuid()")
        op.drop_constraint('job_events_pkey', 'job_events', type_='primary')
        op.alter_column('job_events', 'id', nullable=False)
        op.create_primary_key('job_events_pkey', 'job_events', ['id'])
        op.create_unique_constraint('uq_job_events_job_seq', 'job_events', ['job_id', 'seq'])
        return
    op.add_column('job_events', sa.Column('id', sa.Uuid(), nullable=True))
    op.execute("UPDATE job_events SET id = lower(hex(randomblob(16)))")
    with op.batch_alter_table('job_events', recreate='always') as batch:
        batch.drop_constraint('job_events_pkey', type_='primary')
        batch.alter_column('id', existing_type=sa.Uuid(), nullable=False)
        batch.create_primary_key('job_events_pkey', ['id'])
        batch.create_unique_constraint('uq_job_events_job_seq', ['job_id', 'seq'])
