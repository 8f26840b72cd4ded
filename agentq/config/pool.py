"""The orchestrator's pool (AGENTQ_ORCHESTRATOR_POOL): threads (the default) or gevent, what
gevent's needs installed, how many slots each may be given, and how long a step waits for a
pooled database connection.

Threads stay the default: at 10,000 jobs of two 10 s model calls submitted at once on the
2-core benchmark machine (docs/benchmarks.md, issue 35), both pools completed every job
under 1 GiB, neither kept every model call waiting at once (one orchestrator starts first
steps at about its throughput, 17-46 jobs a second there, so at most 959-1,322 calls waited
together whatever the pool), and threads held more jobs/s (28.72, 91% of their run's ideal,
against gevent's 17.41 and 23.34).
"""
from __future__ import annotations

import importlib.util

POOLS = ("threads", "gevent")
"""The choices, the default first."""
GEVENT_PACKAGES = ("gevent", "psycogreen")
"""What the gevent pool needs installed (agentq's own requirements have them, for the web
process's workers; the `prod` and `dev` extras name them too)."""
MAX_CONCURRENCY = {"threads": 5000, "gevent": 20000}
"""The most slots AGENTQ_ORCHESTRATOR_CONCURRENCY may give each pool: a thread costs a stack
and a share of the GIL's switching, a greenlet only what its step holds. Every slot waiting
on a model holds a socket, so the orchestrator raises its soft limit of open files to match
(tasks.pools.room_for)."""


def missing_for(pool: str) -> list[str]:
    """The packages `pool` needs that are not installed (none for threads)."""
    if pool != "gevent":
        return []
    return [name for name in GEVENT_PACKAGES if importlib.util.find_spec(name) is None]


def connection_wait_s(step_deadline_s: float, default_s: float = 30.0) -> float:
    """How long an orchestrator's step waits for a pooled database connection: half its
    deadline, so it gives up before the sweeper re-drives it, and never less than
    `default_s`. With 10,000 jobs submitted at once on 5,000 greenlets and 30 connections,
    the default 30 s ran out for 1,123 steps (each then retried from the broker's queue)."""
    return max(default_s, step_deadline_s / 2)
