"""what users saw go wrong, loop side (issue 31): no schema change

Issue 31's loop-side fixes needed none: a conversation's persona is the column it always
had (conversations.persona_id, now kept from the request that names one); `length` is one
more value of jobs.finish_reason (a string column, no constraint); a response's tool calls
come from tool_calls' own columns; the cancel a step watches for is jobs.cancel_requested_at.
The revision stays so the history is the one every database already knows.

Revision ID: 0018_loop_fixes
Revises: 0017_tenant_edges
Create Date: 2026-11-26 20:50:00
"""
from __future__ import annotations

revision = '0018_loop_fixes'
down_revision = '0017_tenant_edges'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
