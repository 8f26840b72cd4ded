"""Who is asking, as whom the agent answers, and where: user, persona, conversation —
each within a tenant (agentq.tenants): the same platform user, or the same (platform,
channel, thread), under two tenants is two users, or two conversations.

Each find-or-create is safe under concurrency: a unique key decides, and the loser of a race
reads the winner's row.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import utcnow
from agentq.models import Conversation, Persona, User, UserPlatformLink

T = TypeVar("T")


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


def _find_or_create(session: Session, find: Callable[[], T | None],
                    create: Callable[[], T]) -> T:
    found = find()
    if found is not None:
        return found
    try:
        with session.begin_nested():
            return create()
    except IntegrityError:
        found = find()
        if found is None:
            raise
        return found


def resolve_user(session: Session, tenant_id: uuid.UUID, incoming: Incoming,
                 settings: Settings, now: datetime | None = None) -> User:
    """The tenant's user behind (platform, platform_user_id); a guest is made on first
    contact."""
    now = now or utcnow()

    def find() -> User | None:
        return session.execute(
            select(User).join(UserPlatformLink, UserPlatformLink.user_id == User.id).where(
                UserPlatformLink.tenant_id == tenant_id,
                UserPlatformLink.platform == incoming.platform,
                UserPlatformLink.platform_user_id == incoming.platform_user_id)
        ).scalar_one_or_none()

    def create() -> User:
        user = User(id=uuid.uuid4(), tenant_id=tenant_id, permission_level="guest",
                    token_budget_monthly=settings.guest_monthly_tokens,
                    tokens_used_this_month=0,
                    budget_reset_at=now + timedelta(days=settings.budget_period_days),
                    created_at=now)
        session.add(user)
        session.flush()
        session.add(UserPlatformLink(tenant_id=tenant_id, user_id=user.id,
                                     platform=incoming.platform,
                                     platform_user_id=incoming.platform_user_id,
                                     platform_username=incoming.platform_user_id))
        session.flush()
        return user

    return _find_or_create(session, find, create)


def resolve_persona(session: Session, tenant_id: uuid.UUID,
                    incoming: Incoming) -> Persona | None:
    """The tenant's server-specific → platform-specific → default persona (seed 000)."""
    if incoming.platform_server_id:
        persona = session.execute(
            select(Persona).where(Persona.tenant_id == tenant_id,
                                  Persona.platform == incoming.platform,
                                  Persona.platform_server_id == incoming.platform_server_id)
            .order_by(Persona.created_at).limit(1)).scalar_one_or_none()
        if persona:
            return persona
    persona = session.execute(
        select(Persona).where(Persona.tenant_id == tenant_id,
                              Persona.platform == incoming.platform,
                              Persona.platform_server_id.is_(None))
        .order_by(Persona.created_at).limit(1)).scalar_one_or_none()
    if persona:
        return persona
    return session.execute(
        select(Persona).where(Persona.tenant_id == tenant_id, Persona.is_default.is_(True))
        .order_by(Persona.created_at).limit(1)).scalar_one_or_none()


def resolve_conversation(session: Session, user: User, incoming: Incoming,
                         persona: Persona | None, now: datetime | None = None) -> Conversation:
    now = now or utcnow()
    key = scope_key(user.tenant_id, incoming.platform, incoming.platform_channel_id,
                    incoming.platform_thread_id)

    def find() -> Conversation | None:
        return session.execute(
            select(Conversation).where(Conversation.scope_key == key)).scalar_one_or_none()

    def create() -> Conversation:
        conversation = Conversation(
            id=uuid.uuid4(), tenant_id=user.tenant_id, user_id=user.id,
            persona_id=persona.id if persona else None,
            platform=incoming.platform, platform_channel_id=incoming.platform_channel_id,
            platform_thread_id=incoming.platform_thread_id, scope_key=key, message_seq=0,
            started_at=now, last_active_at=now, is_summarized=False)
        session.add(conversation)
        session.flush()
        return conversation

    # last_active_at moves when messages are written (agentq.loop.store), under the lock
    # order of the writer; touching the row here would lock it before the job it waits for.
    return _find_or_create(session, find, create)
