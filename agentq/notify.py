"""Live job events across processes: steps publish after commit, the API's waiters (`?wait=`)
and event streams listen. Postgres stays the record; this only says "look now".

With a Redis broker, events go through Redis pub/sub: each process holds ONE subscriber
connection (a pattern subscription) and fans messages out to its local waiters, so an idle
stream or wait holds neither a database connection nor a Redis connection of its own. With
the embedded broker everything is in one process and a local fan-out suffices.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
from typing import Any

from agentq.config import Settings
from agentq.config.urls import shown_url

log = logging.getLogger(__name__)
CHANNEL_PREFIX = "agentq:job:"
LISTENER_RETRY_S = 1.0


class Subscription:
    """Events of one job, as they are published; `get` returns [] on timeout."""

    def __init__(self, hub: "Hub", job_id: str):
        self.hub, self.job_id = hub, job_id
        self.queue: queue.Queue[list[dict[str, Any]]] = queue.Queue()

    def get(self, timeout_s: float) -> list[dict[str, Any]]:
        try:
            return self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return []

    def close(self) -> None:
        self.hub._remove(self)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Hub:
    """Local fan-out of events to this process's subscriptions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, set[Subscription]] = {}

    def subscribe(self, job_id: str) -> Subscription:
        sub = Subscription(self, job_id)
        with self._lock:
            self._subs.setdefault(job_id, set()).add(sub)
        self._started()
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.job_id)
            if subs:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.job_id]

    def deliver(self, job_id: str, events: list[dict[str, Any]]) -> None:
        with self._lock:
            subs = list(self._subs.get(job_id, ()))
        for sub in subs:
            sub.queue.put(events)

    def publish(self, job_id: str, events: list[dict[str, Any]]) -> None:
        self.deliver(job_id, events)

    def _started(self) -> None:
        """Hook for hubs with a listener to start lazily."""


PUBLISH_POOL_SIZE = 8
"""Redis connections one process uses for its pushes (plus one for its listener), whatever
its thread count: a publish takes microseconds, so a few connections serve a thousand
orchestrator threads; a thread finding them all busy waits for one."""
POOL_WAIT_S = 5.0
SOCKET_TIMEOUT_S = 2.0


class RedisHub(Hub):
    """Pushes through a BOUNDED pool that waits (redis-py's default pool raises "Too many
    connections" past 100, and an orchestrator runs up to 1,000 threads). A push that still
    fails (Redis restarting, the wait exhausted) is logged and dropped, never raised: a
    step must not fail for it, and a waiter re-reads Postgres anyway (agentq.waiting)."""

    def __init__(self, url: str, pool_size: int = PUBLISH_POOL_SIZE,
                 pool_wait_s: float = POOL_WAIT_S) -> None:
        super().__init__()
        import redis
        self.pool = redis.BlockingConnectionPool.from_url(
            url, max_connections=pool_size + 1,  # + the listener's subscription
            timeout=pool_wait_s, socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S, health_check_interval=30)
        self._redis = redis.Redis(connection_pool=self.pool)
        self._url = url
        self._listener: threading.Thread | None = None
        self._listening = threading.Event()
        self._closing = threading.Event()
        self.dropped = 0

    def publish(self, job_id: str, events: list[dict[str, Any]]) -> None:
        payload = json.dumps(events, default=str)
        for attempt in range(2):  # once more on a fresh connection after a reset
            try:
                self._redis.publish(CHANNEL_PREFIX + job_id, payload)
                return
            except Exception as exc:  # noqa: BLE001 - a push never fails its step
                if attempt:
                    self.dropped += 1
                    log.warning("event push dropped", extra={"job_id": job_id,
                                                             "error": repr(exc)})

    def close(self) -> None:
        """Stop listening (within the listener's poll) and close the connections."""
        self._closing.set()
        self.pool.disconnect()

    def _started(self) -> None:
        with self._lock:
            if self._listener is None:
                self._listener = threading.Thread(target=self._listen, daemon=True,
                                                  name="agentq-events")
                self._listener.start()
        self._listening.wait(5)

    def _listen(self) -> None:
        import redis
        lost = False
        while not self._closing.is_set():
            try:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                try:
                    pubsub.psubscribe(CHANNEL_PREFIX + "*")
                    pubsub.get_message(timeout=1)  # the subscribe confirmation
                    self._listening.set()
                    if lost:
                        log.info("event listener reconnected to Redis")
                        lost = False
                    while not self._closing.is_set():
                        # a timeout, not listen(): an idle subscription must not trip the
                        # pool's socket timeout
                        message = pubsub.get_message(timeout=SOCKET_TIMEOUT_S / 2)
                        if message is None or message.get("type") != "pmessage":
                            continue
                        job_id = message["channel"].decode()[len(CHANNEL_PREFIX):]
                        self.deliver(job_id, json.loads(message["data"]))
                finally:
                    pubsub.close()  # its connection goes back to the bounded pool
            except Exception as exc:
                if self._closing.is_set():  # `close()` cut its connection
                    return
                if not isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
                    log.exception("event listener failed; restarting it")
                elif not lost:
                    # an outage, said once in one line until it ends (no traceback: nothing
                    # of ours failed, and a retry a second must not flood the log)
                    log.warning("event listener lost Redis; reconnecting",
                                extra={"redis": shown_url(self._url),
                                       "error": f"{type(exc).__name__}: {exc}",
                                       "retry_s": LISTENER_RETRY_S})
                    lost = True
                self._closing.wait(LISTENER_RETRY_S)


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub_for(settings: Settings) -> Hub:
    """This process's hub, made once. The composition roots (the API's app, the workers'
    services) register its `publish` as an observer of committed events
    (`agentq.loop.store.on_events`); the step's streamed pieces go to it directly."""
    global _hub
    with _hub_lock:
        if _hub is None:
            redis_urls = [u for u in (settings.broker_url, settings.result_backend_url)
                          if u.startswith(("redis://", "rediss://"))]
            _hub = RedisHub(redis_urls[0]) if redis_urls else Hub()
        return _hub
