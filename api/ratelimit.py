"""Per-key limits (API.md 1.2, "Quotas and rate limits"), from the key's tenant's quotas
(`agentq.tenants.cached_quotas`: what an operator set, else AGENTQ_QUOTA_*; 0 is no limit):

* **Requests per second per key** (`requests_per_second`): Flask-Limiter, a sliding window
  counter of the `limits` library kept in the broker's Redis, so every web process counts
  the key's requests together (`memory://` with the embedded broker: `agentq dev` is one
  process). Checked on every route that takes a key, once the key is known
  (`api.auth.require_key`). Past it: `429 rate_limited` with `Retry-After` (the seconds
  until the window lets the key in again) and `details.retry_after_s`.
* **Holds per key** (`streams_per_key`): an open event stream (`Accept: text/event-stream`)
  or an answer held by `?wait=S` (S > 0) takes a slot of its key for as long as it is open;
  a request that would go past the quota gets `429 rate_limited` (`details.limit:
  "streams_per_key"`) before anything is done (a submit with `?wait` creates no job).
  A slot is a lease in a Redis sorted set per key (member: the hold's id, score: when its
  lease ends), counted and taken in one script: a stream renews its lease while it runs and
  gives the slot back when it ends or its client goes away (the response is closed when a
  write to the gone client fails: at the latest at the next keep-alive, 15 s); a web
  process that dies holding slots leaks none past the lease (LEASE_S).

Where Redis cannot be reached, both let the request through (logged): a limit never makes
an API that can answer answer 503.
"""
from __future__ import annotations

import functools
import logging
import math
import threading
import time
import uuid
from typing import cast

from flask import Flask, current_app, g

from agentq.config import Settings
from agentq.errors import ClientError

log = logging.getLogger(__name__)

LEASE_S = 60.0
"""How long a hold's slot outlives a web process that died holding it; a live stream
renews it every RENEW_S."""
RENEW_S = LEASE_S / 4
HOLD_RETRY_AFTER_S = 5
"""What a 429 for holds asks the client to wait: a hold ends when its job does or its wait
runs out, which no one can say in advance."""
KEY_PREFIX = "agentq:holds:"
STRATEGY = "sliding-window-counter"
REDIS_TIMEOUT_S = 2.0


class RateLimited(ClientError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: int, **details):
        super().__init__(message, retry_after_s=retry_after_s, **details)
        self.retry_after_s = retry_after_s


def register(app: Flask, settings: Settings) -> None:
    from flask_limiter import Limiter

    from agentq.tools.remote import redis_url_of
    redis_url = redis_url_of(settings)  # the broker's Redis, else the result backend's
    # Flask-Limiter sets up the storage and the strategy; the check itself is made by
    # `check_rate` once the key is known (its own before_request runs no limit of ours)
    limiter = Limiter(
        _key, app=app, key_prefix="agentq", strategy=STRATEGY,
        storage_uri=redis_url or "memory://",
        # handed to redis-py, which takes seconds as a float (flask-limiter types them str|int)
        storage_options=cast("dict[str, str | int]", {
            "socket_timeout": REDIS_TIMEOUT_S, "socket_connect_timeout": REDIS_TIMEOUT_S}
            if redis_url else {}),
        swallow_errors=True, headers_enabled=False)
    app.extensions["agentq_rate"] = limiter
    app.extensions["agentq_holds"] = RedisHolds(redis_url) if redis_url else MemoryHolds()
    app.teardown_request(_release_request_holds)
    # a RateLimited is a ClientError carrying retry_after_s: api/errors.py renders it, with
    # Retry-After, as it renders every other


def _key() -> str:
    return str(g.api_key_id)


def _quota(name: str) -> int:
    quotas = getattr(g, "quotas", None)
    if quotas is None:
        from agentq.db import session_factory
        from agentq.tenants import cached_quotas
        with session_factory(g.settings)() as session:
            quotas = g.quotas = cached_quotas(session, g.tenant_id, g.settings)
    return getattr(quotas, name)


@functools.lru_cache(maxsize=64)
def _per_second(amount: int):
    from limits import RateLimitItemPerSecond
    return RateLimitItemPerSecond(amount)


def check_rate() -> None:
    """Count this request against its key's requests per second (after authentication);
    429 past them, with the seconds until the window lets the key in again."""
    rate = _quota("requests_per_second")
    if not rate:
        return
    strategy = current_app.extensions["agentq_rate"].limiter
    item, key = _per_second(rate), _key()
    try:
        if strategy.hit(item, "agentq", "key", key):
            return
        reset_at = strategy.get_window_stats(item, "agentq", "key", key).reset_time
    except Exception:  # noqa: BLE001 - the storage is away: let the request through
        log.warning("request rate not counted (storage unreachable)", exc_info=True)
        return
    retry = max(1, math.ceil(reset_at - time.time()))
    raise RateLimited(
        f"Too many requests: this key may make {rate} a second. Retry after {retry} s.",
        retry, limit="requests_per_second", quota=rate)


# --- holds --------------------------------------------------------------------------------

def hold_request(wait_s: float | None) -> None:
    """A `?wait=S` answer holds a slot of its key until the request ends (`wait=0` or none:
    nothing); 429 when the key's are all taken, before the route does anything."""
    if wait_s:
        g.setdefault("agentq_holds", []).append(take_hold(wait_s))


def _release_request_holds(_exc: BaseException | None = None) -> None:
    for hold in g.pop("agentq_holds", ()):
        hold.release()


def take_hold(seconds: float | None = None) -> "Hold":
    """A slot of the key's holds, for `seconds` (a wait) or until released (a stream, which
    renews it); the caller releases it. 429 when none is free."""
    limit = _quota("streams_per_key")
    holds: Holds = current_app.extensions["agentq_holds"]
    lease = (seconds + LEASE_S) if seconds is not None else LEASE_S
    hold = Hold(holds, f"{KEY_PREFIX}{g.api_key_id}", uuid.uuid4().hex, lease)
    if limit and not holds.acquire(hold, limit):
        raise RateLimited(
            f"This key holds {limit} event streams and waits (`?wait`) open already, its "
            f"quota: close one, or poll without `wait`. Retry after {HOLD_RETRY_AFTER_S} s.",
            HOLD_RETRY_AFTER_S, limit="streams_per_key", quota=limit)
    return hold


class Hold:
    def __init__(self, holds: "Holds", key: str, member: str, lease_s: float):
        self.holds, self.key, self.member, self.lease_s = holds, key, member, lease_s
        self.renewed = time.monotonic()
        self.released = False

    def renew(self) -> None:
        """Extend the lease, at most every RENEW_S (cheap to call on every wake-up)."""
        now = time.monotonic()
        if not self.released and now - self.renewed >= RENEW_S:
            self.renewed = now
            self.holds.renew(self)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.holds.release(self)


class Holds:
    def acquire(self, hold: Hold, limit: int) -> bool:
        raise NotImplementedError

    def renew(self, hold: Hold) -> None:
        raise NotImplementedError

    def release(self, hold: Hold) -> None:
        raise NotImplementedError

    def count(self, key: str) -> int:
        raise NotImplementedError


_ACQUIRE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], t + tonumber(ARGV[3]), ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 1)
return 1
"""
_RENEW = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
if redis.call('ZADD', KEYS[1], 'XX', 'CH', t + tonumber(ARGV[2]), ARGV[1]) == 1 then
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
end
return 1
"""


class RedisHolds(Holds):
    """Leases in a sorted set per key; times are the Redis server's (one clock for every
    web host)."""

    def __init__(self, url: str):
        import redis
        self.redis = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S,
                                          socket_connect_timeout=REDIS_TIMEOUT_S)
        self._acquire = self.redis.register_script(_ACQUIRE)
        self._renew = self.redis.register_script(_RENEW)

    def acquire(self, hold: Hold, limit: int) -> bool:
        try:
            return bool(self._acquire(keys=[hold.key], args=[limit, hold.member,
                                                             hold.lease_s]))
        except Exception:  # noqa: BLE001 - Redis away: let the request through
            log.warning("holds not counted (Redis unreachable)", exc_info=True)
            return True

    def renew(self, hold: Hold) -> None:
        try:
            self._renew(keys=[hold.key], args=[hold.member, hold.lease_s])
        except Exception:  # noqa: BLE001
            log.warning("hold not renewed (Redis unreachable)", exc_info=True)

    def release(self, hold: Hold) -> None:
        try:
            self.redis.zrem(hold.key, hold.member)
        except Exception:  # noqa: BLE001 - its lease runs out instead
            log.warning("hold not released (Redis unreachable); its lease runs out",
                        exc_info=True)

    def count(self, key: str) -> int:
        # redis-py types a sync client's answers as sync-or-async (its ResponseT)
        return int(cast(int, self.redis.zcount(key, time.time(), "+inf")))


class MemoryHolds(Holds):
    """The embedded broker's one process: the same leases in a dict."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[str, dict[str, float]] = {}

    def acquire(self, hold: Hold, limit: int) -> bool:
        now = time.monotonic()
        with self._lock:
            leases = self._leases.setdefault(hold.key, {})
            for member in [m for m, until in leases.items() if until <= now]:
                del leases[member]
            if len(leases) >= limit:
                return False
            leases[hold.member] = now + hold.lease_s
            return True

    def renew(self, hold: Hold) -> None:
        with self._lock:
            leases = self._leases.get(hold.key, {})
            if hold.member in leases:
                leases[hold.member] = time.monotonic() + hold.lease_s

    def release(self, hold: Hold) -> None:
        with self._lock:
            leases = self._leases.get(hold.key)
            if leases is not None:
                leases.pop(hold.member, None)
                if not leases:
                    del self._leases[hold.key]

    def count(self, key: str) -> int:
        now = time.monotonic()
        with self._lock:
            return sum(1 for until in self._leases.get(key, {}).values() if until > now)
