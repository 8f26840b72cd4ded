"""context layers (issue 36): a persona's bootstrap text, skills and tool documentation, and
a conversation's active project (seed 002's order: system, bootstrap, memory, skills, tool
documentation, history, current message; seed 003's active project injection)

- `personas.bootstrap` (text): sent after the system prompt.
- `personas.skills` (JSON): [{name, instructions, tools}], each sent when its tools are
  offered to the job.
- `personas.tool_docs` (boolean, default false): the offered tools' documentation is sent.
- `conversations.active_project` (text): the conversation's active project, sent after
  them (`PATCH /v1/conversations/<id>`).

Revision ID: 0022_context_layers
Revises: 0021_branches
Create Date: 2026-11-26 22:10:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0022_context_layers'
down_revision = '0021_branches'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table('personas') as batch:
        batch.add_column(sa.Column('bootstrap', sa.Text(), nullable=True))
        batch.add_column(sa.Column('skills', JSON, nullable=True))
        batch.add_column(sa.Column('tool_docs', sa.Boolean(), nullable=False,
                                   server_default=sa.text('false')))
    with op.batch_alter_table('conversations') as batch:
        batch.add_column(sa.Column('active_project', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('conversations') as batch:
        batch.drop_column('active_project')
    with op.batch_alter_table('personas') as batch:
        batch.drop_column('tool_docs')
        batch.drop_column('skills')
        batch.drop_column('bootstrap')
