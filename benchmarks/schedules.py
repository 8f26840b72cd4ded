"""How fast beat fires schedules (issue 14): `python -m benchmarks.schedules [--n 1000]`.

Two measurements on a fresh Postgres database (`agentq_bench_sched_<pid>`, dropped after) and
Redis database $AGENTQ_TEST_REDIS (flushed: use a number nobody else uses):

1. end to end: the Procfile's processes (web, workers, one `agentq beat` with the default
   AGENTQ_SCHEDULE_INTERVAL_S) and an instant scripted model. N schedules, one per
   conversation, all with the same `run_at` a few seconds ahead, written straight to the
   database. Reported: the spread of their firings (first to last firing row), firings per
   second over it, and the delay from `run_at` to each job's `started_at` (and
   `finished_at`): median, p95, max.
2. firing alone: `agentq.schedules.fire_due` in this process on N due schedules, jobs made
   but not dispatched: firings per second of one beat's task, without the broker or workers.

Prints one JSON object. Nothing here is asserted; a loaded machine gives slower figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import func, select

LEAD_S = 5.0
TIMEOUT_S = 600


def _seed(settings, n: int, run_at: datetime, tag: str) -> list[uuid.UUID]:
    """N users, each with one conversation and one schedule due at run_at."""
    from agentq.db import session_scope
    from agentq.loop.identity import Incoming, resolve_conversation, resolve_user
    from agentq.loop.states import ScheduleStatus
    from agentq.models import Schedule
    from agentq.tenants import DEFAULT_TENANT_ID
    ids = []
    with session_scope(settings) as session:
        for i in range(n):
            incoming = Incoming("bench", f"{tag}-u{i}", f"{tag}-c{i}")
            user = resolve_user(session, DEFAULT_TENANT_ID, incoming, settings)
            user.token_budget_monthly = None
            conversation = resolve_conversation(session, user, incoming, None)
            schedule = Schedule(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID,
                                conversation_id=conversation.id, user_id=user.id,
                                content=f"scheduled {i}", kind="once", run_at=run_at,
                                timezone="UTC", next_run_at=run_at, status=ScheduleStatus.ACTIVE,
                                created_by="api", meta={}, fire_count=0)
            session.add(schedule)
            ids.append(schedule.id)
    return ids


def _summary(values: list[float]) -> dict:
    values = sorted(values)
    if not values:
        return {}
    return {"n": len(values), "median_s": round(statistics.median(values), 3),
            "p95_s": round(values[min(len(values) - 1, int(0.95 * len(values)))], 3),
            "max_s": round(values[-1], 3)}


def end_to_end(settings, stack, n: int) -> dict:
    from agentq.models import Job, ScheduleFiring
    run_at = datetime.now(timezone.utc) + timedelta(seconds=LEAD_S + n / 500)
    ids = set(_seed(settings, n, run_at, "e2e"))
    sessions = stack.sessions()
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        with sessions() as session:
            done = session.execute(select(func.count()).select_from(Job).where(
                Job.status.in_(("completed", "failed", "cancelled")),
                Job.meta["schedule_id"].as_string().in_([str(i) for i in ids]))).scalar_one()
        if done >= n:
            break
        time.sleep(0.5)
    with sessions() as session:
        firings = session.execute(select(ScheduleFiring).where(
            ScheduleFiring.schedule_id.in_(ids))).scalars().all()
        jobs = session.execute(select(Job).where(
            Job.id.in_([f.job_id for f in firings]))).scalars().all()
    made = sorted(f.created_at for f in firings)
    spread = (made[-1] - made[0]).total_seconds() if made else 0.0
    return {"schedules": n, "fired": len(firings), "jobs_ended": len(
                [j for j in jobs if j.finished_at]),
            "statuses": {s: sum(1 for j in jobs if j.status == s)
                         for s in {j.status for j in jobs}},
            "first_firing_after_run_at_s": round((made[0] - run_at).total_seconds(), 3),
            "firing_spread_s": round(spread, 3),
            "firings_per_s": round(len(firings) / spread, 1) if spread else None,
            "run_at_to_job_created": _summary([(j.created_at - run_at).total_seconds()
                                               for j in jobs]),
            "run_at_to_fired": _summary([(f.created_at - run_at).total_seconds()
                                         for f in firings]),
            "run_at_to_started": _summary([(j.started_at - run_at).total_seconds()
                                           for j in jobs if j.started_at]),
            "run_at_to_finished": _summary([(j.finished_at - run_at).total_seconds()
                                            for j in jobs if j.finished_at])}


def firing_alone(settings, n: int) -> dict:
    from agentq.db import session_factory
    from agentq.schedules import fire_due
    run_at = datetime.now(timezone.utc) - timedelta(seconds=1)
    _seed(settings, n, run_at, "raw")
    started = time.perf_counter()
    fired = fire_due(settings, session_factory(settings))
    elapsed = time.perf_counter() - started
    return {"schedules": n, "fired": fired, "seconds": round(elapsed, 3),
            "firings_per_s": round(fired / elapsed, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args(argv)

    from agentq.config import Settings
    from agentq.testing.scripted_llm import ScriptedLLM, text
    from tests.support.api import TEST_ENV
    from tests.support.stack import Stack, create_database, drop_database, flush_redis

    name = f"agentq_bench_sched_{os.getpid()}"
    url = create_database(name)
    settings = Settings.from_env({"AGENTQ_DATABASE_URL": url})
    flush_redis()
    llm = ScriptedLLM(responder=lambda _request: text("done")).start()
    env = {k: v for k, v in TEST_ENV.items() if k.startswith(("AGENTQ_MODEL",
                                                              "AGENTQ_FALLBACK"))}
    env.update({"AGENTQ_GUEST_MONTHLY_TOKENS": "100000000"})
    stack = Stack(url, llm.base_url, Path(tempfile.mkdtemp(prefix="agentq-bench-sched-")),
                  env)
    result: dict = {"n": args.n, "schedule_interval_s": settings.schedule_interval_s,
                    "cpus": os.cpu_count()}
    try:
        stack.start()
        result["end_to_end"] = end_to_end(settings, stack, args.n)
        stack.stop()
        result["firing_alone"] = firing_alone(settings, args.n)
    finally:
        stack.stop()
        llm.stop()
        drop_database(name)
        flush_redis()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
