"""kombu's in-memory transport, woken by a put instead of polling once a second.

kombu's virtual transports drain by trying every queue, and when all are empty sleeping
`polling_interval` (1 s by default) before trying again: in the embedded mode every hop of a
job (step → tool tasks → step) waited up to a second for that sleep. Here a put notifies a
condition that an idle `drain_events` waits on, so a message is consumed as soon as it is
published; the wait still ends after `polling_interval` (so timeouts and shutdown are seen).

`make_celery` uses it for `memory://` (the URL users write stays `memory://`).
"""
from __future__ import annotations

import socket
import threading
from queue import Empty
from time import monotonic
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, memory

ALIAS = "agentqmemory"

_published = threading.Condition()
_generation = 0
"""Counts puts; a drainer that saw no message waits only while it is unchanged (no lost
wake-ups: a put between the try and the wait changes it)."""


def _notify() -> None:
    global _generation
    with _published:
        _generation += 1
        _published.notify_all()


class Channel(memory.Channel):
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        super()._put(queue, message, **kwargs)
        _notify()

    def _put_fanout(self, exchange: str, message: Any, routing_key: str | None = None,
                    **kwargs: Any) -> None:
        super()._put_fanout(exchange, message, routing_key, **kwargs)
        _notify()


class Transport(memory.Transport):
    Channel = Channel
    polling_interval = 1.0  # the longest idle wait; a put ends it at once

    # kombu's stub for Transport.drain_events has no timeout; kombu's code passes one
    def drain_events(  # type: ignore[override]
            self, connection: Any, timeout: float | None = None) -> None:
        started = monotonic()
        cycle = self.cycle
        assert cycle is not None, "the transport's channels are set up before it drains"
        while True:
            with _published:
                seen = _generation
            try:
                cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                pass
            wait_s = self.polling_interval
            if timeout is not None:
                left = timeout - (monotonic() - started)
                if left <= 0:
                    raise socket.timeout()
                wait_s = min(wait_s, left)
            with _published:
                if _generation == seen:
                    _published.wait(wait_s)


def register() -> str:
    """Make `agentqmemory://` name this transport; returns the URL to give Celery."""
    TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
    return f"{ALIAS}://"
