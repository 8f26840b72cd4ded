"""The embedded mode's in-memory transport: a put wakes a drain that is waiting, so a message
is consumed when it is published, not at the next poll. Shown with a poll interval of an hour:
only a wake-up can deliver the message before the test's (generous) join limit."""
from __future__ import annotations

import threading
import uuid

import pytest
from kombu import Connection

from tasks import embedded_transport

JOIN_S = 60
"""A failure bound, not a measured margin: without the wake-up the drain sleeps an hour."""


class _Watched(threading.Condition):
    """The transport's condition, counting waits and wake-ups."""

    def __init__(self):
        super().__init__()
        self.waiting = threading.Event()
        self.waits = 0
        self.wakeups = 0

    def wait(self, timeout=None):
        self.waits += 1
        self.waiting.set()
        return super().wait(timeout)

    def notify_all(self):
        self.wakeups += 1
        super().notify_all()


@pytest.fixture()
def watched(monkeypatch):
    condition = _Watched()
    monkeypatch.setattr(embedded_transport, "_published", condition)
    monkeypatch.setattr(embedded_transport.Transport, "polling_interval", 3600.0)
    return condition


def test_a_put_wakes_a_waiting_drain(watched):
    url = embedded_transport.register()
    name = f"wake-{uuid.uuid4().hex}"
    got: list = []

    def consume():
        with Connection(url) as connection:
            queue = connection.SimpleQueue(name)
            message = queue.get(block=True, timeout=None)
            got.append(message.payload)
            message.ack()
            queue.close()

    with Connection(url) as connection:
        connection.SimpleQueue(name).close()  # the queue exists before the consumer waits
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        # given a drain that found nothing and waits (an hour, were it not woken)
        assert watched.waiting.wait(JOIN_S), "the drain never waited"
        assert got == []
        # when a message is put
        with connection.SimpleQueue(name) as queue:
            queue.put({"hello": "drain"})
        # then the drain is woken and consumes it
        consumer.join(JOIN_S)
    assert not consumer.is_alive(), "the put did not wake the drain"
    assert got == [{"hello": "drain"}]
    assert watched.wakeups >= 1


def test_a_message_already_there_is_taken_without_waiting(watched):
    url = embedded_transport.register()
    name = f"early-{uuid.uuid4().hex}"
    with Connection(url) as connection:
        with connection.SimpleQueue(name) as queue:
            queue.put({"n": 1})
            message = queue.get(block=True, timeout=None)
            assert message.payload == {"n": 1}
            message.ack()
    assert watched.waits == 0
