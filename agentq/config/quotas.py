"""A tenant's quotas and rate limits (API.md 1.2): the settings' defaults, read from
AGENTQ_QUOTA_*, which an operator overrides per tenant (`agentq.tenants`); 0 is no limit."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Quotas:
    """One tenant's quotas and rate limits; 0 is no limit."""
    requests_per_second: int = 50
    """AGENTQ_QUOTA_REQUESTS_PER_SECOND: requests per second one key may make (429
    `rate_limited` past it); 0: no limit."""
    streams_per_key: int = 16
    """AGENTQ_QUOTA_STREAMS_PER_KEY: event streams and `?wait` holds one key may have open at
    once (429 past it); 0: no limit."""
    running_jobs: int = 2000
    """AGENTQ_QUOTA_RUNNING_JOBS: jobs of one tenant running at once; further ones stay
    `queued` with `waiting_for: "quota"`; 0: no limit."""
    schedules: int = 100
    """AGENTQ_QUOTA_SCHEDULES: active schedules one tenant may hold (422 `quota_exceeded`
    past it); 0: no limit."""
    modules: int = 20
    """AGENTQ_QUOTA_MODULES: tool modules one tenant may register (422 `quota_exceeded` past
    it; global modules do not count); 0: no limit."""
    tool_calls_per_turn: int = 32
    """AGENTQ_QUOTA_TOOL_CALLS_PER_TURN: tool calls one model reply may make; the calls past
    it get the tool error `too_many_tool_calls`; 0: no limit."""


QUOTA_NAMES = tuple(f.name for f in dataclasses.fields(Quotas))
