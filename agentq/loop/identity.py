"""Who is asking, as whom the agent answers, and where: user, persona, conversation —
each within a tenant (agentq.tenants): the same platform user, or the same (platform,
channel, thread), under two tenants is two users, or two conversations.

Each find-or-create is safe under concurrency: a unique key decides, and the loser of a race
reads the winner's row. A miss is created with `INSERT … ON CONFLICT DO NOTHING RETURNING`:
one statement, no SAVEPOINT, and the loser's transaction goes on.
"""
from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, delete, false, insert, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, make_transient_to_detached

from agentq.config import Settings
from agentq.db import utcnow
from agentq.models import Conversation, Persona, User, UserPlatformLink


@dataclass(frozen=True)
class Incoming:
    """The seeds' IncomingMessage: what identifies the sender and the place."""
    platform: str
    platform_user_id: str
    platform_channel_id: str
    platform_thread_id: str | None = None
    platform_server_id: str | None = None


def scope_key(tenant_id: uuid.UUID, platform: str, channel: str, thread: str | None) -> str:
    """One conversation per (tenant, platform, channel, thread); a thread is its own.

    JSON-encoded, so no id can contain a separator that makes two places one."""
    return json.dumps([str(tenant_id), platform, channel, thread], ensure_ascii=False,
                      separators=(",", ":"))


@functools.cache
def _insert_statement(dialect: str, model, unique: tuple[str, ...]):
    if not unique:
        return insert(model.__table__)
    insert_ = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert_(model.__table__).on_conflict_do_nothing(index_elements=list(unique))


def _insert_new(session: Session, obj, unique: tuple[str, ...] = ()) -> bool:
    """Write `obj`'s row with one Core INSERT (`… ON CONFLICT (unique) DO NOTHING` when a
    concurrent writer may hold the unique key): no flush, no SAVEPOINT, and the loser of a
    race keeps its transaction. True: written, and `obj` joins the session as if loaded
    from that row. False: another writer's row holds the key; the caller reads that one."""
    row = {column.key: getattr(obj, column.key) for column in obj.__table__.columns}
    statement = _insert_statement(session.bind.dialect.name, type(obj), unique)
    if session.execute(statement, row).rowcount != 1:
        return False
    for key, value in row.items():  # every column loaded: nothing to read back later
        setattr(obj, key, value)
    make_transient_to_detached(obj)
    session.add(obj)
    return True


def resolve_user(session: Session, tenant_id: uuid.UUID, incoming: Incoming,
                 settings: Settings, now: datetime | None = None) -> User:
    """The tenant's user behind (platform, platform_user_id); a guest is made on first
    contact."""
    find = (select(User).join(UserPlatformLink, UserPlatformLink.user_id == User.id).where(
        UserPlatformLink.tenant_id == tenant_id,
        UserPlatformLink.platform == incoming.platform,
        UserPlatformLink.platform_user_id == incoming.platform_user_id))
    user = session.execute(find).scalar_one_or_none()
    if user is not None:
        return user
    now = now or utcnow()
    user = User(id=uuid.uuid4(), tenant_id=tenant_id, permission_level="guest",
                token_budget_monthly=settings.guest_monthly_tokens, tokens_used_this_month=0,
                budget_reset_at=now + timedelta(days=settings.budget_period_days),
                created_at=now)
    _insert_new(session, user)  # a new id: nothing to conflict with
    link = UserPlatformLink(id=uuid.uuid4(), tenant_id=tenant_id, user_id=user.id,
                            platform=incoming.platform,
                            platform_user_id=incoming.platform_user_id,
                            platform_username=incoming.platform_user_id, created_at=now)
    if _insert_new(session, link, ("tenant_id", "platform", "platform_user_id")):
        return user
    # another request linked this platform user first: ours is nobody's; theirs answers
    session.expunge(user)
    session.execute(delete(User.__table__).where(User.__table__.c.id == user.id))
    return session.execute(find).scalar_one()


def resolve_persona(session: Session, tenant_id: uuid.UUID,
                    incoming: Incoming) -> Persona | None:
    """The tenant's server-specific → platform-specific → default persona (seed 000), the
    oldest of the first scope that has one: one query, ranked by scope."""
    on_platform = Persona.platform == incoming.platform
    unscoped = on_platform & Persona.platform_server_id.is_(None)
    on_server = (on_platform & (Persona.platform_server_id == incoming.platform_server_id)
                 if incoming.platform_server_id else false())
    rank = case((on_server, 0), (unscoped, 1), else_=2)
    return session.execute(
        select(Persona).where(Persona.tenant_id == tenant_id,
                              or_(on_server, unscoped, Persona.is_default.is_(True)))
        .order_by(rank, Persona.created_at).limit(1)).scalar_one_or_none()


def resolve_conversation(session: Session, user: User, incoming: Incoming,
                         persona: Persona | None, now: datetime | None = None) -> Conversation:
    key = scope_key(user.tenant_id, incoming.platform, incoming.platform_channel_id,
                    incoming.platform_thread_id)
    find = select(Conversation).where(Conversation.scope_key == key)
    # last_active_at moves when messages are written (agentq.loop.store), under the lock
    # order of the writer; touching the row here would lock it before the job it waits for.
    conversation = session.execute(find).scalar_one_or_none()
    if conversation is not None:
        return conversation
    now = now or utcnow()
    conversation = Conversation(
        id=uuid.uuid4(), tenant_id=user.tenant_id, user_id=user.id,
        persona_id=persona.id if persona else None,
        platform=incoming.platform, platform_channel_id=incoming.platform_channel_id,
        platform_thread_id=incoming.platform_thread_id, scope_key=key, message_seq=0,
        started_at=now, last_active_at=now, is_summarized=False, memory_summarized_seq=0)
    if _insert_new(session, conversation, ("scope_key",)):
        return conversation
    return session.execute(find).scalar_one()
