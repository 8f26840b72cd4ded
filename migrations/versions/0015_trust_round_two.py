"""trust, round two: operators, tenant quotas and webhook secrets, modules per tenant

- `api_keys.is_operator`: an operator key acts across tenants (the admin routes that
  reach past one tenant); a tenant admin key (`is_admin` without it) acts only inside its
  tenant. Every admin key of the default tenant made before this migration becomes an
  operator, so today's keys keep doing what they did.
- `tenants.quotas`: the tenant's quotas and rate limits, set by an operator (null: the
  settings' defaults).
- `tenants.webhook_secret`, `webhook_secret_previous`, `webhook_secret_previous_until`:
  each tenant signs its webhooks with its own secret; after a rotation the previous one
  signs too until `webhook_secret_previous_until` (24 h). Null: `AGENTQ_WEBHOOK_SECRET`
  for the default tenant.
- `tool_modules.tenant_id`: the tenant that registered a module; null for a global one
  (registered by an operator, or from `AGENTQ_TOOL_MODULES`). Existing modules stay global.

Revision ID: 0015_trust_round_two
Revises: 0014_jobs_hot_updates
Create Date: 2026-11-26 20:45:00
"""
from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0015_trust_round_two'
down_revision = '0014_jobs_hot_updates'
branch_labels = None
depends_on = None

DEFAULT_TENANT_ID = '00000000-0000-0000-0000-000000000001'
"""agentq.tenants.DEFAULT_TENANT_ID (a migration does not import the application)."""


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.add_column(sa.Column('is_operator', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    keys = sa.table('api_keys', sa.column('is_operator', sa.Boolean()),
                    sa.column('is_admin', sa.Boolean()), sa.column('tenant_id', sa.Uuid()))
    op.execute(keys.update()
               .where(keys.c.is_admin == sa.true(),
                      keys.c.tenant_id == uuid.UUID(DEFAULT_TENANT_ID))
               .values(is_operator=True))
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(sa.Column('quotas', _json(), nullable=True))
        batch.add_column(sa.Column('webhook_secret', sa.Text(), nullable=True))
        batch.add_column(sa.Column('webhook_secret_previous', sa.Text(), nullable=True))
        batch.add_column(sa.Column('webhook_secret_previous_until',
                                   sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('tool_modules') as batch:
        batch.add_column(sa.Column('tenant_id', sa.Uuid(), nullable=True))
        batch.create_foreign_key('fk_tool_modules_tenant', 'tenants', ['tenant_id'], ['id'],
                                 ondelete='CASCADE')
        batch.create_index('ix_tool_modules_tenant_id', ['tenant_id'])


def downgrade() -> None:
    with op.batch_alter_table('tool_modules') as batch:
        batch.drop_index('ix_tool_modules_tenant_id')
        batch.drop_constraint('fk_tool_modules_tenant', type_='foreignkey')
        batch.drop_column('tenant_id')
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('webhook_secret_previous_until')
        batch.drop_column('webhook_secret_previous')
        batch.drop_column('webhook_secret')
        batch.drop_column('quotas')
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('is_operator')
