"""operators and tenant admins (issue 30): each non-admin key's conversations are its own

The README says a non-admin key sees the rows it created. A conversation is found by its
place (tenant, platform, channel, thread: `conversations.scope_key`), so a second key of
the tenant naming the same place reached the first key's conversation: it read its history
through the model, steered and interrupted its running job. From 1.2 a non-admin key's
conversation at a place is that key's alone: its scope key carries the key's id as a fifth
part (`agentq.loop.identity.scope_key`); admin keys and the CLI keep the tenant's place.

This rewrites the scope key of every existing place conversation whose first job was made
by a non-admin key, so each such key keeps talking in the conversation it started (and a
later, other key gets a conversation of its own).

Two partial indexes serve a tenant's running-jobs quota (`agentq.tenants`): its live jobs
(`ix_jobs_tenant_live`, counted before a job starts) and its jobs waiting for the quota
(`ix_jobs_tenant_quota_wait`, started in order when a running one ends). Their columns and
predicates are ones a step's update never changes (or that other indexes hold already), so
a step's update stays heap-only (0014).

Downgrade drops the fifth part again where the place is free (two keys' conversations at
one place: the older one takes the place back, the other keeps its key and is no longer
found by place).

Revision ID: 0016_tenant_admins
Revises: 0015_trust_round_two
Create Date: 2026-11-26 20:50:00
"""
from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = '0016_tenant_admins'
down_revision = '0015_trust_round_two'
branch_labels = None
depends_on = None

BATCH = 1000

conversations = sa.table('conversations', sa.column('id', sa.Uuid()),
                         sa.column('scope_key', sa.String()),
                         sa.column('started_at', sa.DateTime(timezone=True)))
jobs = sa.table('jobs', sa.column('id', sa.Uuid()), sa.column('conversation_id', sa.Uuid()),
                sa.column('api_key_id', sa.Uuid()),
                sa.column('created_at', sa.DateTime(timezone=True)))
api_keys = sa.table('api_keys', sa.column('id', sa.Uuid()), sa.column('is_admin', sa.Boolean()))


def _place(scope_key: str) -> list | None:
    """The parts of a place's scope key ([tenant, platform, channel, thread(, owner)]); None
    for another kind (a replay's)."""
    try:
        parts = json.loads(scope_key)
    except ValueError:
        return None
    if not isinstance(parts, list) or len(parts) not in (4, 5) or parts[0] == 'replay':
        return None
    return parts


def _dump(parts: list) -> str:
    return json.dumps(parts, ensure_ascii=False, separators=(',', ':'))


LIVE = "status IN ('queued', 'running', 'waiting')"
QUOTA_WAIT = "waiting_for = 'quota'"


def upgrade() -> None:
    op.create_index('ix_jobs_tenant_live', 'jobs', ['tenant_id'],
                    postgresql_where=sa.text(LIVE), sqlite_where=sa.text(LIVE))
    op.create_index('ix_jobs_tenant_quota_wait', 'jobs', ['tenant_id', 'created_at'],
                    postgresql_where=sa.text(QUOTA_WAIT), sqlite_where=sa.text(QUOTA_WAIT))
    bind = op.get_bind()
    first_key = (sa.select(jobs.c.api_key_id)
                 .where(jobs.c.conversation_id == conversations.c.id)
                 .order_by(jobs.c.created_at, jobs.c.id).limit(1).scalar_subquery())
    rows = bind.execute(sa.select(conversations.c.id, conversations.c.scope_key,
                                  first_key.label('key_id'))).all()
    plain = {row.id for row in bind.execute(
        sa.select(api_keys.c.id).where(api_keys.c.is_admin == sa.false())).all()}
    changes = []
    for ident, scope_key, key_id in rows:
        parts = _place(scope_key)
        if parts is None or len(parts) != 4 or key_id not in plain:
            continue
        changes.append({'c_id': ident, 'key': _dump(parts + [str(key_id)])})
    statement = (conversations.update().where(conversations.c.id == sa.bindparam('c_id'))
                 .values(scope_key=sa.bindparam('key')))
    for start in range(0, len(changes), BATCH):
        bind.execute(statement, changes[start:start + BATCH])


def downgrade() -> None:
    op.drop_index('ix_jobs_tenant_quota_wait', 'jobs')
    op.drop_index('ix_jobs_tenant_live', 'jobs')
    bind = op.get_bind()
    rows = bind.execute(sa.select(conversations.c.id, conversations.c.scope_key)
                        .order_by(conversations.c.started_at, conversations.c.id)).all()
    taken = {scope_key for _, scope_key in rows}
    statement = (conversations.update().where(conversations.c.id == sa.bindparam('c_id'))
                 .values(scope_key=sa.bindparam('key')))
    for ident, scope_key in rows:
        parts = _place(scope_key)
        if parts is None or len(parts) != 5:
            continue
        place = _dump(parts[:4])
        if place in taken:
            continue
        taken.add(place)
        bind.execute(statement, {'c_id': ident, 'key': place})
