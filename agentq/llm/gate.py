"""A provider's gate, shared by every orchestrator process through Redis: at most
`max_concurrency` calls in flight, at most `rate_per_s` calls started a second, and a
circuit breaker that opens on a storm of transient failures so that jobs park without
calling, then half-opens to let exactly one probe through.

One Lua script takes a permit (breaker, slot and rate checked and taken atomically, one
round trip) and one gives it back with the call's outcome. Why not a library: pybreaker's
Redis storage counts *consecutive* failures (a storm at 80% failures never trips it, each
success resets the count) and lets every process through when half-open; `limits` does
rates but no concurrency; none does the three in one atomic call. The state is small:

  agentq:provider:<p>:slots    sorted set, permit token → lease expiry (ms); a crashed
                               holder's slot frees itself when its lease passes
  agentq:provider:<p>:rate:<w> calls started in rate window w
  agentq:provider:<p>:breaker  hash: state (closed|open|half_open), open_until, failures,
                               window_start, probe, probe_until, opened (times opened)

Redis being away never stops a call: the gate lets it through and logs (the broker is the
same Redis, so little would run anyway).
"""
from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Iterator, Protocol
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

KEY_PREFIX = "agentq:provider:"
STATE_TTL_MS = 24 * 3600 * 1000
BUSY_WAIT_MAX_S = 2.0
"""A call that finds no free slot (or the rate used up) waits this long at most for one,
in short sleeps, before its job parks instead."""


class ProviderBusy(Exception):
    """The gate did not let the call through: `reason` is circuit_open, half_open_probing,
    concurrency or rate_limited; `retry_after_s` when it may pass."""

    def __init__(self, provider: str, reason: str, retry_after_s: float):
        super().__init__(f"{provider}: {reason.replace('_', ' ')} "
                         f"(retry in {retry_after_s:.1f} s)")
        self.provider, self.reason, self.retry_after_s = provider, reason, retry_after_s


class Permit(Protocol):
    def succeeded(self) -> None: ...

    def failed(self, transient: bool) -> None: ...


class ProviderGate(Protocol):
    def call(self, model: str) -> contextlib.AbstractContextManager[Permit]: ...


class _NoPermit:
    def succeeded(self) -> None:
        pass

    def failed(self, transient: bool) -> None:
        pass


class NullGate:
    """No limits (no Redis: the embedded mode, unit tests)."""

    @contextlib.contextmanager
    def call(self, model: str) -> Iterator[Permit]:
        yield _NoPermit()


@dataclass(frozen=True)
class GateLimits:
    max_concurrency: int = 0
    """0: no limit."""
    rate_per_s: int = 0
    """Calls started per second; 0: no limit."""
    breaker_failures: int = 20
    """Transient failures within `breaker_window_s` that open the circuit; 0: no breaker."""
    breaker_window_s: float = 10.0
    breaker_open_s: float = 15.0
    """How long the circuit stays open before one probe is let through."""
    lease_s: float = 60.0
    """A permit's lease: longer than one call may take (its timeout)."""


_ACQUIRE = """
local slots, breaker = KEYS[1], KEYS[2]
local now, token = tonumber(ARGV[1]), ARGV[2]
local max_conc, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local rate_limit, rate_key = tonumber(ARGV[5]), ARGV[6]
local rate_ttl, window_end = tonumber(ARGV[7]), tonumber(ARGV[8])
local ttl = tonumber(ARGV[9])
local probe = 0
local state = redis.call('HGET', breaker, 'state') or 'closed'
if state == 'open' then
  local open_until = tonumber(redis.call('HGET', breaker, 'open_until') or '0')
  if now < open_until then return {0, 'circuit_open', open_until - now} end
  state = 'half_open'
  redis.call('HSET', breaker, 'state', 'half_open')
end
if state == 'half_open' then
  local probe_until = tonumber(redis.call('HGET', breaker, 'probe_until') or '0')
  if redis.call('HEXISTS', breaker, 'probe') == 1 and now < probe_until then
    return {0, 'half_open_probing', probe_until - now}
  end
  probe = 1
end
if max_conc > 0 then
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  if redis.call('ZCARD', slots) >= max_conc then
    local first = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')
    return {0, 'concurrency', math.min(1000, tonumber(first[2]) - now)}
  end
end
if rate_limit > 0 then
  local used = redis.call('INCR', rate_key)
  if used == 1 then redis.call('PEXPIRE', rate_key, rate_ttl) end
  if used > rate_limit then
    redis.call('DECR', rate_key)
    return {0, 'rate_limited', window_end - now}
  end
end
if max_conc > 0 then
  redis.call('ZADD', slots, now + lease, token)
  redis.call('PEXPIRE', slots, lease * 2)
end
if probe == 1 then
  redis.call('HSET', breaker, 'probe', token, 'probe_until', now + lease)
end
redis.call('PEXPIRE', breaker, ttl)
return {1, probe == 1 and 'probe' or 'ok', 0}
"""

_RELEASE = """
local slots, breaker = KEYS[1], KEYS[2]
local now, token, outcome = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local threshold, window = tonumber(ARGV[4]), tonumber(ARGV[5])
local open_ms, ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREM', slots, token)
local state = redis.call('HGET', breaker, 'state') or 'closed'
local is_probe = redis.call('HGET', breaker, 'probe') == token
if is_probe then redis.call('HDEL', breaker, 'probe', 'probe_until') end
if outcome ~= 'transient' then
  if state == 'half_open' and is_probe then
    redis.call('HSET', breaker, 'state', 'closed', 'failures', 0, 'window_start', now)
  end
  return state
end
if threshold <= 0 then return state end
if state == 'half_open' then
  if is_probe then
    redis.call('HSET', breaker, 'state', 'open', 'open_until', now + open_ms)
    redis.call('HINCRBY', breaker, 'opened', 1)
    redis.call('PEXPIRE', breaker, ttl)
    return 'open'
  end
  return state
end
if state == 'open' then return state end
local start = tonumber(redis.call('HGET', breaker, 'window_start') or '0')
if now - start > window then
  redis.call('HSET', breaker, 'window_start', now, 'failures', 0)
end
local failures = redis.call('HINCRBY', breaker, 'failures', 1)
if failures >= threshold then
  redis.call('HSET', breaker, 'state', 'open', 'open_until', now + open_ms, 'failures', 0)
  redis.call('HINCRBY', breaker, 'opened', 1)
  redis.call('PEXPIRE', breaker, ttl)
  return 'open'
end
redis.call('PEXPIRE', breaker, ttl)
return 'closed'
"""


def provider_name(base_url: str | None) -> str:
    """What the gate keys on: the provider's host (and port)."""
    if not base_url:
        return "api.openai.com"
    parts = urlsplit(base_url)
    return parts.netloc or base_url


class _RedisPermit:
    def __init__(self, gate: "RedisGate", token: str | None, probe: bool = False):
        self._gate, self._token, self._probe = gate, token, probe
        self._done = False

    def succeeded(self) -> None:
        self._release("success")

    def failed(self, transient: bool) -> None:
        self._release("transient" if transient else "other")

    def _release(self, outcome: str) -> None:
        if self._done or self._token is None:
            return
        self._done = True
        if outcome != "transient" and not self._probe and \
                self._gate.limits.max_concurrency <= 0:
            # the release script would change nothing: no slot was taken (no concurrency
            # limit), this call was not the half-open probe, and only a transient failure
            # counts towards the breaker. One Redis round trip less per model call.
            return
        self._gate._release(self._token, outcome)


class RedisGate:
    """The gate of one provider, in Redis. Thread-safe (redis-py's pool is)."""

    def __init__(self, client, provider: str, limits: GateLimits,
                 sleep=time.sleep, clock=time.time):
        self._redis = client
        self.provider = provider
        self.limits = limits
        base = f"{KEY_PREFIX}{provider}:"
        self._slots, self._breaker, self._rate_prefix = (base + "slots", base + "breaker",
                                                         base + "rate:")
        self._acquire = client.register_script(_ACQUIRE)
        self._release_script = client.register_script(_RELEASE)
        self._sleep, self._clock = sleep, clock

    @contextlib.contextmanager
    def call(self, model: str) -> Iterator[Permit]:
        permit = _RedisPermit(self, *self._take())
        try:
            yield permit
        finally:
            if not permit._done:  # left by an unexpected error: free the slot
                permit.failed(False)

    def _take(self) -> tuple[str | None, bool]:
        """(the permit's token, whether it is the half-open probe); no token when Redis is
        away."""
        waited = 0.0
        while True:
            token = uuid.uuid4().hex
            try:
                allowed, reason, wait_ms = self._try(token)
            except Exception as exc:  # noqa: BLE001 - Redis away: never block a call on it
                log.warning("provider gate unavailable (%s: %s); calling anyway",
                            type(exc).__name__, exc,
                            extra={"event": "llm.gate_unavailable", "provider": self.provider})
                return None, False
            if allowed:
                if reason == "probe":
                    log.info("provider circuit half-open: probing", extra={
                        "event": "llm.circuit_probe", "provider": self.provider})
                return token, reason == "probe"
            wait_s = max(0.0, float(wait_ms) / 1000.0)
            if reason == "half_open_probing":  # the probe answers long before its lease
                wait_s = min(wait_s, self.limits.breaker_open_s)
            if reason in ("circuit_open", "half_open_probing") or \
                    waited + wait_s > BUSY_WAIT_MAX_S:
                raise ProviderBusy(self.provider, reason, wait_s)
            step = max(0.01, min(wait_s, 0.25))
            self._sleep(step)
            waited += step

    def _try(self, token: str) -> tuple[int, str, float]:
        now = int(self._clock() * 1000)
        limits = self.limits
        rate_key, window_end, rate_ttl = self._rate_prefix, now, 1000
        if limits.rate_per_s > 0:
            window_ms = 1000
            window = now // window_ms
            rate_key = f"{self._rate_prefix}{window}"
            window_end, rate_ttl = (window + 1) * window_ms, 2 * window_ms
        allowed, reason, wait_ms = self._acquire(
            keys=[self._slots, self._breaker],
            args=[now, token, limits.max_concurrency, int(limits.lease_s * 1000),
                  int(limits.rate_per_s), rate_key, rate_ttl, window_end, STATE_TTL_MS])
        reason = reason.decode() if isinstance(reason, bytes) else reason
        return int(allowed), reason, float(wait_ms)

    def _release(self, token: str, outcome: str) -> None:
        limits = self.limits
        try:
            state = self._release_script(
                keys=[self._slots, self._breaker],
                args=[int(self._clock() * 1000), token, outcome, limits.breaker_failures,
                      int(limits.breaker_window_s * 1000), int(limits.breaker_open_s * 1000),
                      STATE_TTL_MS])
        except Exception as exc:  # noqa: BLE001 - the lease frees the slot anyway
            log.warning("provider gate release failed (%s)", exc,
                        extra={"event": "llm.gate_unavailable", "provider": self.provider})
            return
        state = state.decode() if isinstance(state, bytes) else state
        if state == "open" and outcome == "transient":
            log.warning("provider circuit open", extra={"event": "llm.circuit_open",
                                                        "provider": self.provider})

    def state(self) -> dict[str, str]:
        """The breaker's hash, decoded (for tests and operators)."""
        raw = self._redis.hgetall(self._breaker)
        return {"state": "closed", **{k.decode(): v.decode() for k, v in raw.items()}}

    def in_flight(self) -> int:
        self._redis.zremrangebyscore(self._slots, "-inf", int(self._clock() * 1000))
        return int(self._redis.zcard(self._slots))


def gate_for(settings, base_url: str | None) -> "ProviderGate":
    """The gate the router uses: in Redis (the broker's, else the result backend's: a
    RabbitMQ deployment's Redis), else none."""
    from agentq.tools.remote import redis_url_of
    url = redis_url_of(settings)
    if url is None:
        return NullGate()
    import redis
    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    return RedisGate(client, provider_name(base_url), GateLimits(
        max_concurrency=settings.provider_max_concurrency,
        rate_per_s=settings.provider_rate_per_s,
        breaker_failures=settings.provider_breaker_failures,
        breaker_window_s=settings.provider_breaker_window_s,
        breaker_open_s=settings.provider_breaker_open_s,
        lease_s=settings.llm_timeout_s * 2 + 5))
