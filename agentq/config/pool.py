"""The orchestrator's pool (AGENTQ_ORCHESTRATOR_POOL): which one runs model waits by default,
what gevent's needs installed, and how many slots each may be given.

A step spends nearly all its time waiting on the model. Under gevent a waiting step is a
greenlet parked on its socket, where threads hold a thread each: on the 2-core
benchmark machine, 1,000 jobs of two 10 s model calls kept 970 first calls waiting at once on
gevent against 773-888 on threads, for a fifth less orchestrator CPU per job, and 10,000 such
jobs submitted at once all completed on 5,000 greenlets of one process (docs/benchmarks.md,
issue 35). So gevent is the default wherever it can be imported; threads where it cannot
(the orchestrator says so in its log: tasks/pools.py).
"""
from __future__ import annotations

import importlib.util

POOLS = ("gevent", "threads")
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


def default_pool() -> str:
    """gevent where its packages are installed, else threads."""
    return "threads" if missing_for("gevent") else "gevent"


def connection_wait_s(step_deadline_s: float, default_s: float = 30.0) -> float:
    """How long an orchestrator's step waits for a pooled database connection: half its
    deadline, so it gives up before the sweeper re-drives it, and never less than
    `default_s`. With 10,000 jobs submitted at once on 5,000 greenlets and 30 connections,
    the default 30 s ran out for 1,123 steps (each then retried from the broker's queue)."""
    return max(default_s, step_deadline_s / 2)
