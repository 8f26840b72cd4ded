"""Two first messages racing for one new user or one new place (real Postgres): both are
answered with the same row, and the loser leaves nothing behind."""
from __future__ import annotations

import os
import threading
import time

import pytest
from sqlalchemy import func, select, text

from agentq.config import Settings
from agentq.db import session_factory
from agentq.loop.identity import Incoming, resolve, resolve_conversation, resolve_user
from agentq.models import Conversation, User, UserPlatformLink
from agentq.tenants import DEFAULT_TENANT_ID as T
from tests.support.sql import blocked_by
from tests.support.stack import create_database, drop_database

pytestmark = pytest.mark.integration
WAIT_FOR_BLOCK_S = 30


@pytest.fixture(scope="module")
def settings(servers_up):
    name = f"agentq_identity_{os.getpid()}"
    settings = Settings.from_env({"AGENTQ_DATABASE_URL": create_database(name)})
    yield settings
    drop_database(name)


def _race(settings, first, second):
    """`first` runs in a transaction left open; `second` runs in another until it waits on
    first's row lock; then first commits. Returns (first's result, second's result)."""
    sessions = session_factory(settings)
    winner = sessions()
    winner.begin()
    won = first(winner)
    winner_pid = winner.execute(text("SELECT pg_backend_pid()")).scalar_one()
    lost: dict = {}

    def loser() -> None:
        with sessions() as session, session.begin():
            lost["value"] = second(session)

    thread = threading.Thread(target=loser)
    thread.start()
    deadline = time.monotonic() + WAIT_FOR_BLOCK_S
    with sessions() as probe:
        while time.monotonic() < deadline and thread.is_alive() and not blocked_by(
                probe, winner_pid):
            time.sleep(0.01)
    winner.commit()
    winner.close()
    thread.join()
    return won, lost["value"]


def _unlinked_users(settings) -> int:
    """Users no link points at: a race's loser left its guest behind."""
    return _count(settings, User, User.id.not_in(select(UserPlatformLink.user_id)))


def _count(settings, model, *where) -> int:
    with session_factory(settings)() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where))


def test_two_first_messages_of_one_user_make_one_user(settings):
    # given a platform user nobody has seen
    incoming = Incoming("discord", "racer-1", "chan-1")
    # when two requests resolve it at once, the second finding nothing before the first
    # commits
    won, lost = _race(settings,
                      lambda s: resolve_user(s, T, incoming, settings).id,
                      lambda s: resolve_user(s, T, incoming, settings).id)
    # then both answer the first's user, and the second's unlinked guest is gone
    assert lost == won
    assert _count(settings, UserPlatformLink,
                  UserPlatformLink.platform_user_id == "racer-1") == 1
    assert _unlinked_users(settings) == 0


def test_two_first_messages_in_one_place_make_one_conversation(settings):
    # given a channel nobody has written in, and two users
    place = "race-chan"

    def resolve(user_id: str):
        def go(session):
            incoming = Incoming("discord", user_id, place)
            user = resolve_user(session, T, incoming, settings)
            return resolve_conversation(session, user, incoming, None).id
        return go

    # when both write their first message there at once
    won, lost = _race(settings, resolve("writer-a"), resolve("writer-b"))
    # then there is one conversation, the first's
    assert lost == won
    assert _count(settings, Conversation, Conversation.platform_channel_id == place) == 1


def _first_message(settings, user_id: str, place: str):
    """A first message's resolve (`resolve`: on Postgres the link, the user and the
    conversation made by one statement): the ids of its user and conversation."""
    def go(session):
        user, _persona, conversation = resolve(session, T, Incoming("discord", user_id, place),
                                               settings)
        return user.id, conversation.id
    return go


def test_two_first_messages_of_one_new_user_in_one_new_place_make_one_of_each(settings):
    # given a platform user nobody has seen, in a place nobody has written in
    place = "race-both"
    # when two of their first messages are resolved at once (the second's link waits for
    # the first's, then is taken: it writes neither its user nor its conversation)
    won, lost = _race(settings, _first_message(settings, "racer-2", place),
                      _first_message(settings, "racer-2", place))
    # then both answer the first's user and conversation, and nothing else was left
    assert lost == won
    assert _count(settings, Conversation, Conversation.platform_channel_id == place) == 1
    assert _count(settings, UserPlatformLink,
                  UserPlatformLink.platform_user_id == "racer-2") == 1
    assert _unlinked_users(settings) == 0


def test_two_new_users_first_messages_in_one_new_place_make_one_conversation(settings):
    # given a place nobody has written in, and two platform users nobody has seen
    place = "race-place"
    # when both write their first message there at once (the second's user is made, its
    # conversation's key is taken by the first's)
    won, lost = _race(settings, _first_message(settings, "writer-c", place),
                      _first_message(settings, "writer-d", place))
    # then two users, each linked, and one conversation, the first's
    assert lost[0] != won[0] and lost[1] == won[1]
    assert _count(settings, Conversation, Conversation.platform_channel_id == place) == 1
    with session_factory(settings)() as session:
        linked = set(session.scalars(select(UserPlatformLink.user_id).where(
            UserPlatformLink.platform_user_id.in_(["writer-c", "writer-d"]))))
    assert linked == {won[0], lost[0]}
