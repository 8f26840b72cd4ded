"""Who is asking, as which persona, in which conversation (SQLite)."""
from __future__ import annotations

import contextlib
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import event, func, select

from agentq.db import dispose_engines, engine_for, session_scope
from agentq.loop.identity import Incoming, resolve, resolve_conversation, resolve_user
from agentq.models import Conversation, Persona, User, UserPlatformLink
from agentq.tenants import DEFAULT_TENANT_ID as T
from agentq.tenants import create_tenant
from tests.support import unit_db

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def settings(tmp_path):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path),
                                 "AGENTQ_GUEST_MONTHLY_TOKENS": "1234",
                                 "AGENTQ_BUDGET_PERIOD_DAYS": "7"})
    yield settings
    dispose_engines()


def _persona(session, name: str, *, platform=None, server=None, default=False,
             created_at=T0, tenant=None) -> Persona:
    tenant = tenant or T
    persona = Persona(id=uuid.uuid4(), tenant_id=tenant, name=name, platform=platform,
                      platform_server_id=server, is_default=default, created_at=created_at)
    session.add(persona)
    session.flush()
    return persona


# --- users ----------------------------------------------------------------------------

def test_first_contact_creates_a_guest_with_a_link_and_the_guest_budget(settings):
    # given an empty database
    incoming = Incoming("discord", "u-1", "chan-1")
    # when
    with session_scope(settings) as session:
        user = resolve_user(session, T, incoming, settings, now=T0)
        user_id = user.id
    # then
    with session_scope(settings) as session:
        stored = session.get(User, user_id)
        assert stored.permission_level == "guest"
        assert stored.token_budget_monthly == 1234
        assert stored.tokens_used_this_month == 0
        assert stored.budget_reset_at == T0 + timedelta(days=7)
        links = session.execute(select(UserPlatformLink)).scalars().all()
        assert [(k.user_id, k.platform, k.platform_user_id) for k in links] == [
            (user_id, "discord", "u-1")]


def test_second_contact_returns_the_same_user(settings):
    # given a known user
    incoming = Incoming("discord", "u-1", "chan-1")
    with session_scope(settings) as session:
        first = resolve_user(session, T, incoming, settings).id
    # when the same platform user writes again, from another channel
    with session_scope(settings) as session:
        second = resolve_user(session, T, Incoming("discord", "u-1", "chan-2"), settings).id
    # then
    assert second == first
    with session_scope(settings) as session:
        assert session.scalar(select(func.count()).select_from(User)) == 1
        assert session.scalar(select(func.count()).select_from(UserPlatformLink)) == 1


def test_the_same_id_on_another_platform_is_another_user(settings):
    # given / when
    with session_scope(settings) as session:
        a = resolve_user(session, T, Incoming("discord", "u-1", "c"), settings).id
        b = resolve_user(session, T, Incoming("slack", "u-1", "c"), settings).id
    # then
    assert a != b


# --- personas -------------------------------------------------------------------------

def _chosen_persona(session, tenant, incoming, settings):
    """The persona the submit's one query picks."""
    return resolve(session, tenant, incoming, settings)[1]


def test_persona_cascade_server_then_platform_then_default_then_none(settings):
    # given a default persona, a discord persona and one for discord server s1
    with session_scope(settings) as session:
        default = _persona(session, "default", default=True).id
        platform = _persona(session, "discord", platform="discord").id
        server = _persona(session, "s1", platform="discord", server="s1").id

    def persona_for(incoming):
        with session_scope(settings) as session:
            found = _chosen_persona(session, T, incoming, settings)
            return found.id if found else None

    # when / then
    assert persona_for(Incoming("discord", "u", "c", platform_server_id="s1")) == server
    assert persona_for(Incoming("discord", "u", "c", platform_server_id="s2")) == platform
    assert persona_for(Incoming("discord", "u", "c")) == platform
    assert persona_for(Incoming("slack", "u", "c", platform_server_id="s1")) == default
    with session_scope(settings) as session:
        session.delete(session.get(Persona, default))
    assert persona_for(Incoming("slack", "u", "c")) is None


def test_the_oldest_persona_of_a_scope_wins(settings):
    # given two personas for the same platform
    with session_scope(settings) as session:
        _persona(session, "newer", platform="discord", created_at=T0 + timedelta(days=1))
        older = _persona(session, "older", platform="discord", created_at=T0).id
    # when
    with session_scope(settings) as session:
        found = _chosen_persona(session, T, Incoming("discord", "u", "c"), settings).id
    # then
    assert found == older


# --- conversations --------------------------------------------------------------------

def _conversation(settings, incoming: Incoming, tenant=None):
    with session_scope(settings) as session:
        user = resolve_user(session, tenant or T, incoming, settings)
        return resolve_conversation(session, user, incoming, None).id


def test_a_thread_is_its_own_conversation(settings):
    # given / when
    channel = _conversation(settings, Incoming("discord", "u-1", "chan-1"))
    thread = _conversation(settings, Incoming("discord", "u-1", "chan-1", "thread-9"))
    other_thread = _conversation(settings, Incoming("discord", "u-1", "chan-1", "thread-10"))
    # then
    assert len({channel, thread, other_thread}) == 3
    with session_scope(settings) as session:
        stored = session.get(Conversation, thread)
        assert (stored.platform, stored.platform_channel_id, stored.platform_thread_id) == (
            "discord", "chan-1", "thread-9")


def test_the_same_place_returns_the_same_conversation(settings):
    # given a conversation in a thread
    first = _conversation(settings, Incoming("discord", "u-1", "chan-1", "thread-9"))
    # when the same place is seen again, also by another user
    again = _conversation(settings, Incoming("discord", "u-1", "chan-1", "thread-9"))
    other_user = _conversation(settings, Incoming("discord", "u-2", "chan-1", "thread-9"))
    # then
    assert again == first == other_user
    with session_scope(settings) as session:
        assert session.scalar(select(func.count()).select_from(Conversation)) == 1


def test_the_same_channel_on_another_platform_is_another_conversation(settings):
    # given / when
    a = _conversation(settings, Incoming("discord", "u-1", "chan-1"))
    b = _conversation(settings, Incoming("slack", "u-1", "chan-1"))
    # then
    assert a != b


def test_a_conversation_records_its_persona(settings):
    # given a platform persona
    with session_scope(settings) as session:
        persona = _persona(session, "p", platform="discord").id
    incoming = Incoming("discord", "u-1", "chan-1")
    # when
    with session_scope(settings) as session:
        user = resolve_user(session, T, incoming, settings)
        conversation = resolve_conversation(session, user, incoming,
                                            _chosen_persona(session, T, incoming, settings))
        conversation_id = conversation.id
    # then
    with session_scope(settings) as session:
        assert session.get(Conversation, conversation_id).persona_id == persona


def test_two_different_places_never_share_a_conversation(settings):
    # given two different (channel, thread) places whose ids contain the separator
    a = Incoming("discord", "u-1", "chan\x1fthr", "x")
    b = Incoming("discord", "u-2", "chan", "thr\x1fx")
    # when
    first, second = _conversation(settings, a), _conversation(settings, b)
    # then
    assert first != second


# --- tenants ----------------------------------------------------------------------------

def _tenant(settings, name: str):
    with session_scope(settings) as session:
        return create_tenant(session, name).id


def test_the_same_platform_user_under_two_tenants_is_two_users(settings):
    # given a second tenant
    other = _tenant(settings, "other")
    incoming = Incoming("discord", "u-1", "chan-1")
    # when the same platform user writes under both
    with session_scope(settings) as session:
        a = resolve_user(session, T, incoming, settings).id
        b = resolve_user(session, other, incoming, settings).id
        again = resolve_user(session, other, incoming, settings).id
    # then
    assert a != b == again
    with session_scope(settings) as session:
        assert {u.tenant_id for u in session.execute(select(User)).scalars()} == {T, other}


def test_the_same_place_under_two_tenants_is_two_conversations(settings):
    # given a second tenant
    other = _tenant(settings, "other")
    place = Incoming("discord", "u-1", "chan-1", "thread-9")
    # when / then
    mine = _conversation(settings, place)
    theirs = _conversation(settings, place, tenant=other)
    assert mine != theirs
    assert _conversation(settings, place, tenant=other) == theirs
    with session_scope(settings) as session:
        assert session.get(Conversation, theirs).tenant_id == other


def test_a_persona_of_another_tenant_is_never_chosen(settings):
    # given a default persona in another tenant only
    other = _tenant(settings, "other")
    with session_scope(settings) as session:
        theirs = _persona(session, "theirs", platform="discord", default=True,
                          tenant=other).id
    # when / then
    with session_scope(settings) as session:
        assert _chosen_persona(session, T, Incoming("discord", "u", "c"), settings) is None
        assert (_chosen_persona(session, other, Incoming("discord", "u", "c"), settings).id
                == theirs)


# --- all three at once (the submit's path) --------------------------------------------

@contextlib.contextmanager
def _statements(settings):
    """The SQL sent to the database inside the block."""
    seen: list[str] = []

    def listener(conn, cursor, statement, *rest):
        seen.append(statement)
    engine = engine_for(settings)
    event.listen(engine, "before_cursor_execute", listener)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", listener)


def _kinds(seen: list[str]) -> list[str]:
    return [statement.split()[0].upper() for statement in seen]


def test_resolve_makes_what_is_missing_then_finds_all_three_in_one_query(settings):
    # given a platform persona, and a place nobody wrote from yet
    with session_scope(settings) as session:
        persona = _persona(session, "discord", platform="discord").id
    place = Incoming("discord", "u-1", "chan-1", "thread-1")
    # when the first message comes in
    with _statements(settings) as seen, session_scope(settings) as session:
        user, found, conversation = resolve(session, T, place, settings, now=T0)
        first = (user.id, found.id, conversation.id)
    # then the user (and its link) and the conversation were made, with the persona, after
    # one read: what it found missing is not looked for again (on Postgres the link, the
    # user and the conversation in one statement, each INSERT a CTE selecting from the
    # one before it)
    assert first[1] == persona
    assert _kinds(seen) == (["SELECT", "WITH"]
                            if engine_for(settings).dialect.name == "postgresql"
                            else ["SELECT", "INSERT", "INSERT", "INSERT"])
    with session_scope(settings) as session:
        stored = session.get(Conversation, first[2])
        assert (stored.user_id, stored.persona_id, stored.tenant_id) == (first[0], persona, T)
    # when the next one comes in from the same place
    with _statements(settings) as seen, session_scope(settings) as session:
        again = tuple(row.id for row in resolve(session, T, place, settings))
    # then the same rows, read in one query and nothing written
    assert again == first
    assert _kinds(seen) == ["SELECT"]


def test_resolve_finds_the_user_and_makes_only_the_new_place(settings):
    # given a user who wrote in one channel
    with session_scope(settings) as session:
        user = resolve(session, T, Incoming("discord", "u-1", "chan-1"), settings)[0].id
    # when they write in another
    with session_scope(settings) as session:
        found, persona, conversation = resolve(session, T, Incoming("discord", "u-1", "chan-2"),
                                               settings)
        ids = (found.id, persona, conversation.id, conversation.user_id)
    # then the same user, no persona, a conversation of their own in the new channel
    assert ids[0] == user and ids[1] is None and ids[3] == user
    assert ids[2] == _conversation(settings, Incoming("discord", "u-1", "chan-2"))
    assert ids[2] != _conversation(settings, Incoming("discord", "u-1", "chan-1"))


def test_resolve_never_reads_another_tenants_user_or_place(settings):
    # given a user and a conversation of another tenant at the same platform ids
    other = _tenant(settings, "other")
    place = Incoming("discord", "u-1", "chan-1")
    with session_scope(settings) as session:
        theirs = tuple(row.id for row in (lambda u, _p, c: (u, c))(
            *resolve(session, other, place, settings)))
    # when the same ids write under the default tenant
    with session_scope(settings) as session:
        user, _, conversation = resolve(session, T, place, settings)
        mine = (user.id, conversation.id, user.tenant_id, conversation.tenant_id)
    # then new rows of the default tenant
    assert mine[0] != theirs[0] and mine[1] != theirs[1]
    assert mine[2:] == (T, T)
