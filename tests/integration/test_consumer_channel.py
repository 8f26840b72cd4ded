"""Our Redis channel (tasks/consumer.py) against a real Redis: one command client per
channel and pool, a new one when the pool is rebuilt, messages still round-trip, and a
channel whose transport was collected answers a connection error."""
from __future__ import annotations

import uuid

import pytest
import redis
from kombu import Connection

from tasks.consumer import Transport
from tests.support.stack import REDIS_URL

pytestmark = pytest.mark.integration


@pytest.fixture
def connection(servers_up):
    conn = Connection(REDIS_URL, transport=Transport)
    yield conn
    conn.close()


def test_commands_share_one_client_until_the_pool_is_rebuilt(connection):
    channel = connection.channel()
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second
        assert first.connection_pool is channel.pool
    channel._disconnect_pools()  # what a fork or a reconnect does
    with channel.conn_or_acquire() as after:
        assert after is not first and after.connection_pool is channel.pool
    given = redis.Redis(connection_pool=channel.pool)
    with channel.conn_or_acquire(given) as passed:
        assert passed is given


def test_a_message_is_published_consumed_and_acknowledged(connection):
    name = f"agentq-test-{uuid.uuid4().hex[:8]}"
    queue = connection.SimpleQueue(name)
    try:
        queue.put({"n": 1})
        message = queue.get(timeout=5)
        message.ack()
        assert message.payload == {"n": 1}
        # acknowledged: its delivery is gone from the unacked index (a hash this Redis
        # database shares with every stack of the suite running meanwhile: only this
        # message's entry is ours to look at; CI once saw another's there)
        with queue.channel.conn_or_acquire() as client:
            assert not client.hexists(queue.channel.unacked_key, message.delivery_tag)
    finally:
        queue.clear()
        queue.close()
        redis.Redis.from_url(REDIS_URL).delete(f"_kombu.binding.{name}",
                                               f"_kombu.binding_permanent.{name}")


def test_a_channel_whose_transport_was_collected_answers_a_connection_error(connection):
    channel = connection.channel()
    channel._disconnect_pools()
    connection.collect()  # detaches the transport, as celery does on a lost connection
    with pytest.raises(redis.exceptions.ConnectionError):
        with channel.conn_or_acquire():
            pass
