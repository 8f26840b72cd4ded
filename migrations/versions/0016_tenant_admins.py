"""operators and tenant admins (issue 30), reserved

A slot in the history kept for one piece of work in progress; it changes nothing until
that work fills it in.

Revision ID: 0016_tenant_admins
Revises: 0015_trust_round_two
Create Date: 2026-11-26 20:50:00
"""
from __future__ import annotations

revision = '0016_tenant_admins'
down_revision = '0015_trust_round_two'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
