"""tenants

Every API key belongs to a tenant, and every row a key creates or names carries it. The
rows that exist already (and every existing key) go into the default tenant, so existing
keys keep working and see what they saw.

Revision ID: 0003_tenants
Revises: 0002_clients_batches_replay
Create Date: 2026-11-22 18:45:00
"""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = '0003_tenants'
down_revision = '0002_clients_batches_replay'
branch_labels = None
depends_on = None

DEFAULT_TENANT_ID = uuid.UUID("00000000-0000-0000-0000-000000000001")
"""Also agentq.tenants.DEFAULT_TENANT_ID (a migration does not import the application)."""
DEFAULT_TENANT_NAME = "default"

TABLES = ("api_keys", "users", "user_platform_links", "personas", "conversations", "jobs",
          "files", "batches", "webhook_deliveries", "idempotency_keys")


def upgrade() -> None:
    tenants = op.create_table(
        'tenants',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name'))
    op.bulk_insert(tenants, [{"id": DEFAULT_TENANT_ID, "name": DEFAULT_TENANT_NAME,
                              "created_at": datetime.now(timezone.utc)}])
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('tenant_id', sa.Uuid(), nullable=True))
        op.execute(sa.table(table, sa.column('tenant_id', sa.Uuid()))
                   .update().values(tenant_id=DEFAULT_TENANT_ID))
        with op.batch_alter_table(table) as batch:
            batch.alter_column('tenant_id', existing_type=sa.Uuid(), nullable=False)
            batch.create_foreign_key(f'fk_{table}_tenant_id_tenants', 'tenants',
                                     ['tenant_id'], ['id'])
            batch.create_index(f'ix_{table}_tenant_id', ['tenant_id'], unique=False)
    # unique keys include the tenant
    with op.batch_alter_table('user_platform_links') as batch:
        batch.drop_constraint('uq_user_platform_links_identity', type_='unique')
        batch.create_unique_constraint('uq_user_platform_links_identity',
                                       ['tenant_id', 'platform', 'platform_user_id'])
    with op.batch_alter_table('idempotency_keys') as batch:
        batch.drop_constraint('uq_idempotency_keys_key', type_='unique')
        batch.create_unique_constraint('uq_idempotency_keys_key',
                                       ['tenant_id', 'api_key_id', 'key'])
    op.drop_index('ix_personas_scope', table_name='personas')
    op.create_index('ix_personas_scope', 'personas',
                    ['tenant_id', 'platform', 'platform_server_id'], unique=False)
    # a conversation's scope key starts with its tenant: '["<tenant>","api","c1",null]'
    op.execute(sa.text("UPDATE conversations SET scope_key = :head || substr(scope_key, 2)")
               .bindparams(head=f'["{DEFAULT_TENANT_ID}",'))


def downgrade() -> None:
    op.execute(sa.text("UPDATE conversations SET scope_key = '[' || "
                       "substr(scope_key, :cut) WHERE substr(scope_key, 1, 2) = '[\"'")
               .bindparams(cut=len(f'["{DEFAULT_TENANT_ID}",') + 1))
    op.drop_index('ix_personas_scope', table_name='personas')
    op.create_index('ix_personas_scope', 'personas', ['platform', 'platform_server_id'],
                    unique=False)
    with op.batch_alter_table('idempotency_keys') as batch:
        batch.drop_constraint('uq_idempotency_keys_key', type_='unique')
        batch.create_unique_constraint('uq_idempotency_keys_key', ['api_key_id', 'key'])
    with op.batch_alter_table('user_platform_links') as batch:
        batch.drop_constraint('uq_user_platform_links_identity', type_='unique')
        batch.create_unique_constraint('uq_user_platform_links_identity',
                                       ['platform', 'platform_user_id'])
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f'ix_{table}_tenant_id')
            batch.drop_constraint(f'fk_{table}_tenant_id_tenants', type_='foreignkey')
            batch.drop_column('tenant_id')
    op.drop_table('tenants')
