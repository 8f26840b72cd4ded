"""`python -m benchmarks burst [--jobs N] [--rounds R] [--latency S]`: where the CPU of a
burst goes, process by process, with N one-tool jobs waiting at once.

The bench stack (`harness.Lab`, as `run` starts it) gets R rounds of N one-tool-turn jobs,
submitted by 32 threads at once, the model server answering each call after S seconds (0:
the peers' burst; 10: the `inflight` scenario's jobs). For each round, from /proc and
Postgres, before and after:

- jobs/s (the last job's end against the first submit) and CPU ms per job of each of the
  stack's processes (their children included), the model server and this client;
- the orchestrator's user and system time per job, and the context switches its threads
  made per job (voluntary: a wait; involuntary: the kernel took the CPU) — approximate:
  threads that ended during the round are not counted;
- the CPU per job of this machine's Postgres and Redis server processes, when they are
  visible (`pgrep`), and of the whole machine (/proc/stat);
- the Postgres sessions the round opened (`pg_stat_database.sessions`): connections made,
  not reused.

It is the probe behind the fifth pass of issue 13 in docs/benchmarks.md: run it on two trees
alternately to compare them. Results: benchmarks/results/<date>-burst.json (and
latest-burst.json).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks import harness, scenarios
from benchmarks.harness import CpuMeter
from benchmarks.observability import log

READY, ROUND = "READY", "ROUND "
"""`--paced`: printed once warm (READY), and before each round's figures (ROUND <json>), on
stdout; each round waits for a line on stdin (benchmarks/compare.py runs two stacks so)."""
SUBMITTERS = 32
WARMUP_JOBS = 5
SERVICES = {"postgres": "postgres", "redis": "redis-server"}
TICK = os.sysconf("SC_CLK_TCK")


def user_system_s(pid: int) -> tuple[float, float]:
    """A process's own user and system seconds (its threads', not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of the process's live threads."""
    voluntary = involuntary = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                involuntary += int(line.split()[1])
    return voluntary, involuntary


def service_cpu_s() -> dict[str, float]:
    """CPU seconds of this machine's Postgres and Redis server processes (0 if not seen)."""
    out = {}
    for name, pattern in SERVICES.items():
        found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
        total = 0.0
        for pid in found.stdout.split():
            try:
                total += sum(user_system_s(int(pid)))
            except (OSError, ValueError, IndexError):  # gone meanwhile
                pass
        out[name] = total
    return out


def sessions_opened(database_url: str) -> int:
    return harness.query(database_url, "SELECT sessions FROM pg_stat_database "
                                       "WHERE datname = current_database()")[0][0]


def wal_position(database_url: str) -> str:
    """The server's WAL position now."""
    return harness.query(database_url, "SELECT pg_current_wal_lsn()::text")[0][0]


def wal_written_since(database_url: str, position: str) -> int:
    """Bytes of WAL the server wrote since `position`: what a round's writes cost the disk
    and the replicas, a figure the machine's other load does not move (index entries a
    non-HOT update adds show here)."""
    return int(harness.query(
        database_url, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(%s AS pg_lsn))",
        (position,))[0][0])


def one_round(ctx: scenarios.Context, n: int, latency_s: float) -> dict[str, Any]:
    lab = ctx.lab
    orchestrator = ctx.pids()["orchestrator"]
    ids: list[str] = []
    lock = threading.Lock()

    def submit(_i: int) -> None:
        job_id, _t0 = ctx.client.submit(scenarios.ONE_TOOL_TURN)
        with lock:
            ids.append(job_id)

    sessions0, services0 = sessions_opened(lab.database_url), service_cpu_s()
    wal0 = wal_position(lab.database_url)
    times0, switches0 = user_system_s(orchestrator), context_switches(orchestrator)
    machine0 = harness.machine_cpu()[0]
    meter = CpuMeter(ctx.pids()).start()
    start = time.time()
    with ThreadPoolExecutor(max_workers=min(SUBMITTERS, n)) as pool:
        list(pool.map(submit, range(n)))
    rows = ctx.watcher.wait_all(ids, scenarios.JOB_TIMEOUT_S + 4 * latency_s + n * 0.2)
    cpu = meter.stop()
    machine1 = harness.machine_cpu()[0]
    times1, switches1 = user_system_s(orchestrator), context_switches(orchestrator)
    services1, sessions1 = service_cpu_s(), sessions_opened(lab.database_url)
    wal_bytes = wal_written_since(lab.database_url, wal0)
    ends = [r["finished"] for r in rows if scenarios._ok(r)]
    elapsed = max(ends) - start if ends else 0.0
    own = {k: v for k, v in cpu["cpu_s"].items() if k not in ("model_server", "bench_client")}
    per_job = lambda seconds: round(1000 * seconds / n, 2)  # noqa: E731
    busy_s = (machine1 - machine0) / TICK  # /proc/stat counts in clock ticks
    return {
        "jobs": n, "completed": len(ends), "failed": len(rows) - len(ends),
        "jobs_per_s": round(len(ends) / elapsed, 2) if elapsed > 0 else None,
        "cpu_ms_per_job": {k: per_job(v) for k, v in cpu["cpu_s"].items()},
        "agentq_cpu_ms_per_job": per_job(sum(own.values())),
        "orchestrator_user_ms_per_job": per_job(times1[0] - times0[0]),
        "orchestrator_system_ms_per_job": per_job(times1[1] - times0[1]),
        "orchestrator_voluntary_switches_per_job": round((switches1[0] - switches0[0]) / n),
        "orchestrator_involuntary_switches_per_job": round((switches1[1] - switches0[1]) / n),
        "services_cpu_ms_per_job": {k: per_job(services1[k] - services0[k])
                                    for k in services0},
        "machine_busy_ms_per_job": per_job(busy_s),
        "postgres_sessions_opened": sessions1 - sessions0,
        "postgres_wal_bytes_per_job": round(wal_bytes / n)}


def main(args) -> int:
    missing = harness.services_answer()
    if missing:
        print(f"cannot run: {' and '.join(missing)} not answering", file=sys.stderr)
        return 3
    if args.orchestrator_pool:
        os.environ["AGENTQ_ORCHESTRATOR_POOL"] = args.orchestrator_pool
    lab = harness.start_lab("agentq-burst-", log)
    if lab is None:
        return 4
    ctx = scenarios.Context(lab, scenarios.QUICK)
    rounds = []
    try:
        for _ in range(WARMUP_JOBS):
            ctx.one_job()
        lab.server.set_latency(args.latency)
        if args.paced:
            print(READY, flush=True)
        for r in range(args.rounds):
            if args.paced and not sys.stdin.readline():
                break  # whoever paced the rounds is done with them
            result = one_round(ctx, args.jobs, args.latency)
            rounds.append(result)
            if args.paced:
                print(ROUND + json.dumps(result), flush=True)
            log(f"round {r}: {result['completed']}/{args.jobs} jobs, {result['jobs_per_s']} "
                f"jobs/s, agentq {result['agentq_cpu_ms_per_job']} ms CPU per job "
                f"{result['cpu_ms_per_job']}; orchestrator user/system "
                f"{result['orchestrator_user_ms_per_job']}/"
                f"{result['orchestrator_system_ms_per_job']} ms, switches "
                f"{result['orchestrator_voluntary_switches_per_job']}/"
                f"{result['orchestrator_involuntary_switches_per_job']} per job; services "
                f"{result['services_cpu_ms_per_job']} ms; machine "
                f"{result['machine_busy_ms_per_job']} ms; Postgres sessions opened "
                f"{result['postgres_sessions_opened']}, WAL "
                f"{result['postgres_wal_bytes_per_job']} bytes per job")
        if args.paced:  # the stack stays up until told: its teardown would weigh on the
            sys.stdin.read()  # other stack's last round (backends gone, a database dropped)
    finally:
        lab.server.set_latency(0)
        ctx.close()
        lab.stop()
    out = {"meta": {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    "command": "python -m benchmarks burst " + " ".join(sys.argv[2:]),
                    "jobs": args.jobs, "latency_s": args.latency,
                    "machine": harness.machine_info(), "versions": harness.versions(),
                    "settings": {"orchestrator_pool": lab.settings().orchestrator_pool,
                                 "orchestrator_concurrency":
                                     lab.settings().orchestrator_concurrency,
                                 "db_pool_size": lab.settings().db_pool_size}},
           "rounds": rounds}
    path = harness.write_results(Path(args.results_dir), "burst", out,
                                 datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    log(f"results: {path}")
    return 0 if all(r["failed"] == 0 for r in rounds) else 1
