"""what users saw go wrong, API side (issue 31), reserved

A slot in the history kept for one piece of work in progress; it changes nothing until
that work fills it in.

Revision ID: 0019_user_fixes
Revises: 0018_loop_fixes
Create Date: 2026-11-26 20:50:00
"""
from __future__ import annotations

revision = '0019_user_fixes'
down_revision = '0018_loop_fixes'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
