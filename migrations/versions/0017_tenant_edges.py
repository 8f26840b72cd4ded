"""per-tenant webhook secrets and modules (issue 30): no schema change

The columns this work uses came with 0015_trust_round_two (`tenants.webhook_secret`,
`webhook_secret_previous`, `webhook_secret_previous_until`, `tool_modules.tenant_id`), and
nothing has to be written for existing rows:

- a tenant other than the default one gets its secret generated at its first delivery (or
  rotation), never here: a secret made here would be as unknown to its receiver, and the
  code must make one anyway for tenants created later (agentq.webhooks.secrets);
- modules registered before 1.2 stay global (`tenant_id` null), as 0015 left them.

So this revision changes nothing; it keeps its place in the history.

Revision ID: 0017_tenant_edges
Revises: 0016_tenant_admins
Create Date: 2026-11-26 20:50:00
"""
from __future__ import annotations

revision = '0017_tenant_edges'
down_revision = '0016_tenant_admins'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
