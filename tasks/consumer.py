"""The worker's consumer, with one fix: a broker restart must not kill the worker.

celery 5.7.0 (with kombu 5.7.0, redis-py 8.1), on a lost broker connection, first
`collect()`s the connection — which detaches its transport (`transport.client = None`) — and
then `close()`s it. When the close re-runs the default channel's close and that channel
still holds unacknowledged deliveries (a worker with tasks in flight: our orchestrator,
with hundreds of threads), kombu's Redis channel tries to restore them through a new pool
built from `transport.client.hostname`:

    CRITICAL Unrecoverable error: AttributeError("'NoneType' object has no attribute
    'hostname'")  ... consumer.on_connection_error_after_connected -> connection.close ->
    Channel.close -> QoS.restore_unacked_once -> Channel._connparams

`ignore_errors` swallows only connection errors, so the AttributeError escapes the
consumer's reconnect loop and the worker exits. Idle workers survive (nothing to restore),
which is why only the orchestrator died. Reproduced by tests/faults/test_broker_restart.py.

The work-around: the close of a connection whose transport is already detached swallows
that AttributeError. Nothing is lost by skipping the restore: those deliveries live in
Redis' unacked index and come back after the visibility timeout (or, after a restart that
lost them, the sweeper re-drives their jobs from Postgres). Configured as
`worker_consumer` (a documented Celery setting), so no library code is patched; drop it
once celery/kombu handle a detached transport in this path.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

from celery.worker.consumer import Consumer as CeleryConsumer

log = logging.getLogger(__name__)


def tolerant_close(connection: Any) -> None:
    """Make `connection.close()` survive a transport that `collect()` already detached."""
    close = connection.close

    def close_detached() -> None:
        try:
            close()
        except AttributeError:
            if getattr(connection, "_transport", None) is not None:
                raise
            log.warning("broker connection closed after its transport was collected; "
                        "its unacknowledged messages come back by the visibility timeout")

    connection.close = close_detached


class Consumer(CeleryConsumer):
    def on_connection_error_after_connected(self, exc: Exception) -> None:
        if self.connection is not None:
            tolerant_close(self.connection)
        return super().on_connection_error_after_connected(exc)


# --- the transport -----------------------------------------------------------------------
# The same detached transport bites a second path: a task finished in a pool thread
# schedules its ack on the event loop; the loop runs it after the reconnect, on the OLD
# channel, and `Channel._connparams` reads `transport.client.hostname` -> AttributeError ->
# "Unrecoverable error". The channel below says what happened instead — the connection is
# gone, a connection error — which every caller in kombu and celery already handles (the
# ack is logged and skipped; the message comes back by the visibility timeout; our steps
# and tool calls are idempotent). Selected by `broker_transport` for redis:// brokers.

from contextlib import contextmanager  # noqa: E402

from kombu.transport import redis as kombu_redis  # noqa: E402


class Channel(kombu_redis.Channel):
    _command_client = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """kombu builds a new `redis.Redis` for every command it sends outside the consumer
        (each publish, delivery bookkeeping and ack): about 60 µs, more than the LPUSH. One
        client per channel and pool does; a redis-py client is safe to share between
        threads (it takes a connection from the pool per command), and a channel whose
        pool is rebuilt (a reconnect, a fork) gets a new one."""
        if client:
            yield client
            return
        pool, cached = self.pool, self._command_client
        if cached is None or cached.connection_pool is not pool:
            cached = self._command_client = self._create_client()  # type: ignore[attr-defined]  # kombu's, not in its stub
        yield cached

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or getattr(transport, "client", None) is None:
            import redis
            raise redis.exceptions.ConnectionError(
                "the broker connection of this channel was closed (its transport was "
                "collected after a connection loss)")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[misc,no-any-return]  # kombu's, not in its stub


class Transport(kombu_redis.Transport):
    Channel = Channel
