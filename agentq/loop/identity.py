"""Who is asking, as whom the agent answers, and where: user, persona, conversation —
each within a tenant (agentq.tenants): the same platform user, or the same (platform,
channel, thread), under two tenants is two users, or two conversations.

Each find-or-create is safe under concurrency: a unique key decides, and the loser of a race
reads the winner's row. A miss is created with `INSERT … ON CONFLICT DO NOTHING RETURNING`:
one statement, no SAVEPOINT, and the loser's transaction goes on.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, bindparam, case, delete, false, literal_column, or_, select
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import insert_new, insert_new_chain, utcnow
from agentq.ids import new_id
from agentq.models import Conversation, Persona, User, UserPlatformLink


@dataclass(frozen=True)
class Incoming:
    """The seeds' IncomingMessage: what identifies the sender and the place."""
    platform: str
    platform_user_id: str
    platform_channel_id: str
    platform_thread_id: str | None = None
    platform_server_id: str | None = None


def scope_key(tenant_id: uuid.UUID, platform: str, channel: str, thread: str | None,
              owner: uuid.UUID | None = None) -> str:
    """One conversation per (tenant, platform, channel, thread); a thread is its own.
    `owner`: the non-admin API key whose conversation it is (each such key has its own
    conversation at a place, README "Tenants"); None for admin keys and the CLI, whose
    conversation at a place is the tenant's.

    JSON-encoded, so no id can contain a separator that makes two places one."""
    parts = [str(tenant_id), platform, channel, thread]
    if owner is not None:
        parts.append(str(owner))
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":"))


# The lookups are built once, with bind parameters: a statement made per request costs
# more of the web's CPU (coercions, cache keys) than running it.
_LINKED = (UserPlatformLink.tenant_id == bindparam("tenant_id"),
           UserPlatformLink.platform == bindparam("platform"),
           UserPlatformLink.platform_user_id == bindparam("platform_user_id"))
_FIND_USER = (select(User).join(UserPlatformLink, UserPlatformLink.user_id == User.id)
              .where(*_LINKED))
_FIND_CONVERSATION = select(Conversation).where(Conversation.scope_key == bindparam("scope_key"))


def _find_persona(with_server: bool) -> Select[Persona]:
    """The tenant's server-specific → platform-specific → default persona (seed 000), the
    oldest of the first scope that has one: ranked by scope."""
    on_platform = Persona.platform == bindparam("platform")
    unscoped = on_platform & Persona.platform_server_id.is_(None)
    on_server = (on_platform & (Persona.platform_server_id == bindparam("server_id"))
                 if with_server else false())
    return (select(Persona)
            .where(Persona.tenant_id == bindparam("tenant_id"),
                   or_(on_server, unscoped, Persona.is_default.is_(True)))
            .order_by(case((on_server, 0), (unscoped, 1), else_=2), Persona.created_at)
            .limit(1))


def _find_all(with_server: bool) -> Select[User, Persona, Conversation]:
    """User, persona and conversation in one round trip: each outer-joined to a one-row
    anchor, so a missing one is None and the others still come back."""
    anchor = select(literal_column("1").label("one")).subquery("anchor")
    linked = select(UserPlatformLink.user_id).where(*_LINKED).scalar_subquery()
    persona = _find_persona(with_server).with_only_columns(Persona.id).scalar_subquery()
    return (select(User, Persona, Conversation).select_from(anchor)
            .outerjoin(User, User.id == linked)
            .outerjoin(Persona, Persona.id == persona)
            .outerjoin(Conversation, Conversation.scope_key == bindparam("scope_key")))


_FIND_ALL = {True: _find_all(True), False: _find_all(False)}


def _params(tenant_id: uuid.UUID, incoming: Incoming,
            owner: uuid.UUID | None = None) -> dict[str, Any]:
    return {"tenant_id": tenant_id, "platform": incoming.platform,
            "platform_user_id": incoming.platform_user_id,
            "server_id": incoming.platform_server_id,
            "scope_key": scope_key(tenant_id, incoming.platform, incoming.platform_channel_id,
                                   incoming.platform_thread_id, owner)}


def resolve(session: Session, tenant_id: uuid.UUID, incoming: Incoming, settings: Settings,
            now: datetime | None = None, owner: uuid.UUID | None = None
            ) -> tuple[User, Persona | None, Conversation]:
    """User, persona and conversation of a message: one query when the user and the
    conversation exist (the usual case); a missing one is made as below. `owner`: see
    `scope_key`."""
    params = _params(tenant_id, incoming, owner)
    user, persona, conversation = session.execute(
        _FIND_ALL[bool(incoming.platform_server_id)], params).one()
    if user is None and conversation is None:  # a first message from a new place
        made = _make_user_and_place(session, tenant_id, incoming, settings, params, persona,
                                    now)
        if made is not None:
            return made[0], persona, made[1]
    if user is None:  # not there a moment ago: made now (a racing writer's row wins)
        user = _make_user(session, tenant_id, incoming, settings, params, now)
    if conversation is None:
        conversation = _make_conversation(session, user, incoming, persona,
                                          params["scope_key"], now)
    return user, persona, conversation


def resolve_user(session: Session, tenant_id: uuid.UUID, incoming: Incoming,
                 settings: Settings, now: datetime | None = None) -> User:
    """The tenant's user behind (platform, platform_user_id); a guest is made on first
    contact."""
    find = _params(tenant_id, incoming)
    user = session.execute(_FIND_USER, find).scalar_one_or_none()
    if user is not None:
        return user
    return _make_user(session, tenant_id, incoming, settings, find, now)


_LINK_KEY = ("tenant_id", "platform", "platform_user_id")


def _guest(tenant_id: uuid.UUID, incoming: Incoming, settings: Settings,
           now: datetime) -> tuple[User, UserPlatformLink]:
    """A new guest for a platform user, and its link (not written)."""
    user = User(id=new_id(), tenant_id=tenant_id, permission_level="guest",
                token_budget_monthly=settings.guest_monthly_tokens, tokens_used_this_month=0,
                budget_reset_at=now + timedelta(days=settings.budget_period_days),
                created_at=now)
    link = UserPlatformLink(id=new_id(), tenant_id=tenant_id, user_id=user.id,
                            platform=incoming.platform,
                            platform_user_id=incoming.platform_user_id,
                            platform_username=incoming.platform_user_id, created_at=now)
    return user, link


def _make_user_and_place(session: Session, tenant_id: uuid.UUID, incoming: Incoming,
                         settings: Settings, find: dict[str, Any], persona: Persona | None,
                         now: datetime | None) -> tuple[User, Conversation] | None:
    """A new platform user's guest and a new place's conversation in one statement
    (Postgres, `insert_new_chain`): the link, then the user, then the conversation, each
    written only when the one before it was. A racing writer's link wins as in
    `_make_user`, and the conversation is then made for its user; a racing writer's
    conversation wins as in `_make_conversation`. None on another dialect: nothing
    written."""
    now = now or utcnow()
    user, link = _guest(tenant_id, incoming, settings, now)
    conversation = _new_conversation(user, incoming, persona, find["scope_key"], now)
    written = insert_new_chain(session, (link, _LINK_KEY), (user, ()),
                               (conversation, ("scope_key",)))
    if written is None:
        return None
    if written == 0:  # another request linked this platform user first
        user = session.execute(_FIND_USER, find).scalar_one()
        return user, _make_conversation(session, user, incoming, persona, find["scope_key"],
                                        now)
    if written == 2:  # another request made this place's conversation first
        return user, session.execute(_FIND_CONVERSATION,
                                     {"scope_key": find["scope_key"]}).scalar_one()
    _made(session).add(conversation.id)
    return user, conversation


def _make_user(session: Session, tenant_id: uuid.UUID, incoming: Incoming,
               settings: Settings, find: dict[str, Any], now: datetime | None) -> User:
    """A guest for a platform user nobody has linked yet; the winner's user when a
    concurrent request links it first."""
    user, link = _guest(tenant_id, incoming, settings, now or utcnow())
    # Postgres: one statement, the user written only when the link is
    linked = insert_new_chain(session, (link, _LINK_KEY), (user, ()))
    if linked is not None:
        return user if linked else session.execute(_FIND_USER, find).scalar_one()
    insert_new(session, user)  # a new id: nothing to conflict with
    if insert_new(session, link, _LINK_KEY):
        return user
    # another request linked this platform user first: ours is nobody's; theirs answers
    session.expunge(user)
    session.execute(delete(User.__table__).where(User.__table__.c.id == user.id))
    return session.execute(_FIND_USER, find).scalar_one()


def resolve_conversation(session: Session, user: User, incoming: Incoming,
                         persona: Persona | None, now: datetime | None = None,
                         owner: uuid.UUID | None = None) -> Conversation:
    key = scope_key(user.tenant_id, incoming.platform, incoming.platform_channel_id,
                    incoming.platform_thread_id, owner)
    # last_active_at moves when a job lets the conversation go (agentq.loop.lifecycle), under the
    # lock order of the writer; touching the row here would lock it before the job it waits
    # for.
    conversation = session.execute(_FIND_CONVERSATION,
                                   {"scope_key": key}).scalar_one_or_none()
    if conversation is not None:
        return conversation
    return _make_conversation(session, user, incoming, persona, key, now)


def _make_conversation(session: Session, user: User, incoming: Incoming,
                       persona: Persona | None, key: str,
                       now: datetime | None) -> Conversation:
    """A new place's conversation; the winner's when a concurrent request makes it first."""
    conversation = _new_conversation(user, incoming, persona, key, now or utcnow())
    if insert_new(session, conversation, ("scope_key",)):
        _made(session).add(conversation.id)
        return conversation
    return session.execute(_FIND_CONVERSATION, {"scope_key": key}).scalar_one()


def _new_conversation(user: User, incoming: Incoming, persona: Persona | None, key: str,
                      now: datetime) -> Conversation:
    """A new place's conversation (not written)."""
    return Conversation(
        id=new_id(), tenant_id=user.tenant_id, user_id=user.id,
        persona_id=persona.id if persona else None,
        platform=incoming.platform, platform_channel_id=incoming.platform_channel_id,
        platform_thread_id=incoming.platform_thread_id, scope_key=key, message_seq=0,
        started_at=now, last_active_at=now, is_summarized=False, memory_summarized_seq=0)


_MADE = "agentq.conversations_made"
"""session.info's key: (a transaction, the ids of the conversations it inserted)."""


def _made(session: Session) -> set[uuid.UUID]:
    """The ids of the conversations this session's open transaction inserted."""
    transaction = session.get_transaction()
    made = session.info.get(_MADE)
    if made is None or made[0] is not transaction:  # (a later transaction of the session)
        made = session.info[_MADE] = (transaction, set())
    return made[1]


def made_here(session: Session, conversation: Conversation) -> bool:
    """Whether this session's open transaction inserted `conversation`'s row: until it
    commits no other transaction sees the row (one that inserts its key waits on it), so
    nobody else can own, lock or change it meanwhile."""
    return session.get_transaction() is not None and conversation.id in _made(session)
