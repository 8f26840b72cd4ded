"""Scale-out measured (issue 35, DESIGN 1.2): 1, 2 and 4 nodes, each an orchestrator and a
tools worker in a network namespace of its own with a CPU quota of its own (equal per node;
benchmarks/netns.py), against one Postgres and one broker on the host.

    python -m benchmarks nodes [--nodes 1 --nodes 2 --nodes 4] [--cpus 0.25]
                               [--jobs-per-node 150] [--broker redis|amqp] [--kill-jobs 300]

For each node count a lab of its own (benchmarks/faults.py FaultLab: a private Postgres,
Redis, RabbitMQ with `--broker amqp`, the model server answering at once; on the host the
API (gunicorn 2 x 8), beat, `webhooks` and `tools-slow`, which the one-tool jobs do not
use) is warmed up, then `jobs-per-node x nodes` one-tool jobs (two model calls, one
`math.evaluate`) are submitted at once through the API, once to warm up and then for each
measured run; jobs/s is the jobs over the time
from the first one's creation to the last one's end. Per job: each node's CPU (its cgroup's
cpuacct, its time waiting for quota), and the shared tier's: Postgres (the postmaster and
every backend, moved into a counting cgroup, so backends that ended count too), the broker
(and Redis beside RabbitMQ, the result backend), the API, the model server.

Scale efficiency at N nodes: jobs/s(N) / (N x jobs/s(1)), of the best run and of the runs'
mean. The shared tier's CPU per job projects the ceiling: a Postgres of C cores runs out at
C / (its CPU seconds per job) jobs/s. Part of that CPU is spent whatever the load (beat, the
sweeper, heartbeats, the workers' polls): each server's idle CPU per second is measured
after the warm-up (`--idle-s`) and its CPU per job also shown net of it over each burst's
window.

Then, on the largest lab, a node is killed (SIGKILL to every process in its cgroup, not
restarted) while jobs flow (`--kill-jobs` of the fault suite's mix at 2/3 of the measured
rate, the kill 40% in): every job must complete, none twice (benchmarks/faults.py
run_scenario's counts).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.faults import ONE_TOOL_JOB, FaultLab, Submitter, run_scenario
from benchmarks.harness import TERMINAL
from benchmarks.observability import loadavg, log

HOST_WORKERS = ("tools-slow", "webhooks")
"""What the host runs beside the API and beat: the kill scenario's job mix needs them; the
measured one-tool jobs do not touch them."""
BENCH_ENV = {"AGENTQ_QUOTA_REQUESTS_PER_SECOND": "0"}
"""Beside the fault lab's settings: no per-key rate limit (one key submits every job)."""


def plain_job(n: int) -> tuple[str, str]:
    """Job n's user and message: a one-tool ReAct job (two model calls, math.evaluate)."""
    return f"u{n % 50}", ONE_TOOL_JOB


def counting_groups(lab: FaultLab) -> dict[str, Any]:
    """Counting cgroups (no quota) for the shared tier's processes, made once per lab."""
    import psutil

    def tree(pid: int) -> list[int]:
        try:
            return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    postmaster = int((lab.pg.data / "postmaster.pid").read_text().split()[0])
    groups = {"postgres": lab.network.count("postgres", tree(postmaster))}
    if lab.rabbit is not None:
        groups["rabbitmq"] = lab.network.count("rabbitmq", tree(lab.rabbit.proc.pid))
    groups["redis"] = lab.network.count("redis", tree(lab.redis.proc.pid))
    groups["api"] = lab.network.count("api", tree(lab.stack.procs["web"].pid))
    groups["model"] = lab.network.count("model", tree(lab.server.pid))
    return groups


def wait_ended(lab: FaultLab, job_ids: list[str], timeout_s: float) -> dict[str, str]:
    """The jobs' statuses once all ended (or at `timeout_s`), read each second on one
    connection: a connection a read (`FaultLab.sql`'s) made Postgres start a backend
    twice a second, which the shared tier's CPU counted (a cost per second of the
    measurement, borne by fewer jobs the fewer the nodes)."""
    import psycopg2
    deadline = time.monotonic() + timeout_s
    statuses: dict[str, str] = {}
    conn = psycopg2.connect(lab.database_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            while time.monotonic() < deadline:
                cursor.execute("SELECT id, status FROM jobs WHERE id = ANY(%s::uuid[])",
                               (job_ids,))
                statuses = {str(i): s for i, s in cursor.fetchall()}
                if len(statuses) == len(job_ids) and all(
                        s in TERMINAL for s in statuses.values()):
                    break
                time.sleep(1.0)
    finally:
        conn.close()
    return statuses


def _sessions(lab: FaultLab) -> int:
    """Connections Postgres has accepted so far (`pg_stat_database.sessions`, every
    database): a burst that opens some pays their backends' first statements' cost (the
    catalog caches filled, each statement prepared anew); the harness's own reads
    open one (`wait_ended`) and the span query one more."""
    [(sessions,)] = lab.sql("SELECT coalesce(sum(sessions), 0) FROM pg_stat_database")
    return int(sessions)


def idle_rates(groups: dict[str, Any], seconds: float) -> dict[str, float]:
    """Each shared-tier group's CPU per second with no job running (ms/s): what it spends
    whatever the load (beat, the sweeper, the broker's heartbeats, pooled connections'
    checks, the workers' polls), measured over `seconds` once the warm-up's jobs ended."""
    cpu0 = {name: g.cpu_s() for name, g in groups.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    return {name: round((g.cpu_s() - cpu0[name]) * 1000 / elapsed, 3)
            for name, g in groups.items()}


def burst(lab: FaultLab, jobs: int, groups: dict[str, Any], timeout_s: float,
          idle: dict[str, float] | None = None) -> dict:
    """`jobs` one-tool jobs at once; jobs/s and CPU per job of each node and server. With
    `idle` (`idle_rates`): each server's CPU per job net of what it spends idle over the
    burst's window too (`net_cpu_ms_per_job`)."""
    sessions0 = _sessions(lab)
    window0 = time.monotonic()
    cpu0 = {name: g.cpu_s() for name, g in groups.items()}
    node0 = {node.name: (node.cpu.cpu_s(), node.cpu.throttled_s()) for node in lab.nodes}
    sub = Submitter(lab.stack.base, lab.key, None, threads=16, content=plain_job)
    t0 = time.monotonic()
    sub.run(jobs, float("inf"))
    submitted_s = time.monotonic() - t0
    statuses = wait_ended(lab, sub.job_ids, timeout_s)
    cpu = {name: g.cpu_s() - cpu0[name] for name, g in groups.items()}
    window = time.monotonic() - window0
    opened = _sessions(lab) - sessions0
    nodes = {node.name: (node.cpu.cpu_s() - node0[node.name][0],
                         node.cpu.throttled_s() - node0[node.name][1]) for node in lab.nodes}
    ids = ",".join(f"'{j}'" for j in sub.job_ids) or "NULL"
    [(span,)] = lab.sql(f"SELECT extract(epoch from max(finished_at) - min(created_at)) "
                        f"FROM jobs WHERE id IN ({ids})")
    done = sum(1 for s in statuses.values() if s == "completed")
    per_job = lambda seconds: round(seconds * 1000 / max(done, 1), 2)  # noqa: E731
    return {
        "jobs": jobs, "completed": done, "api": dict(sub.api),
        "seconds": round(float(span or 0), 2), "submitted_in_s": round(submitted_s, 2),
        "jobs_per_s": round(done / float(span), 2) if span else None,
        "cpu_ms_per_job": {name: per_job(s) for name, s in cpu.items()},
        "window_s": round(window, 2), "postgres_sessions_opened": opened,
        **({"net_cpu_ms_per_job": {
            name: per_job(max(0.0, s - idle[name] * window / 1000))
            for name, s in cpu.items()}} if idle is not None else {}),
        "node_cpu_ms_per_job": {name: per_job(c) for name, (c, _) in nodes.items()},
        "node_cpu_share": {name: round(c / float(span), 3) if span else None
                           for name, (c, _) in nodes.items()},
        "node_throttled_s": {name: round(t, 2) for name, (_, t) in nodes.items()},
    }


def kill_node(lab: FaultLab) -> None:
    """SIGKILL to every process of the lab's first node (its cgroup), not restarted."""
    node = lab.nodes[0]
    for pid in node.cpu.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in lab.node_stacks[0].procs.values():
        proc.wait()


def one_size(nodes: int, args, scratch: Path, kill: bool) -> dict:
    lab = FaultLab(scratch / f"nodes-{nodes}", extra_env=BENCH_ENV, broker=args.broker,
                   nodes=nodes, node_cpus=args.cpus, host_workers=HOST_WORKERS)
    try:
        t0 = time.monotonic()
        lab.start()
        log(f"{nodes} node(s) of {args.cpus} CPU up in {time.monotonic() - t0:.1f} s "
            f"(load {loadavg()})")
        groups = counting_groups(lab)
        # warmed up by a burst of the measured size: each process's pool opens the
        # connections such a burst needs, and each prepares its statements, before any
        # measured run (a smaller warm-up left that cost in the first runs: Postgres's CPU
        # per job fell run after run)
        warm = burst(lab, args.jobs_per_node * nodes, groups, args.timeout)
        log(f"warm-up: {warm['completed']}/{warm['jobs']}, "
            f"{warm['postgres_sessions_opened']} Postgres sessions opened")
        idle = idle_rates(groups, args.idle_s)
        log(f"idle CPU ms/s: {idle}")
        result: dict[str, Any] = {"nodes": nodes, "loadavg_before": loadavg(),
                                  "idle_cpu_ms_per_s": idle}
        result["runs"] = [burst(lab, args.jobs_per_node * nodes, groups, args.timeout, idle)
                          for _ in range(args.rounds)]
        result["loadavg_after"] = loadavg()
        best = max(result["runs"], key=lambda r: r["jobs_per_s"] or 0)
        result["jobs_per_s"] = best["jobs_per_s"]
        log(f"{nodes} node(s): " + ", ".join(
            f"{r['jobs_per_s']} jobs/s ({r['postgres_sessions_opened']} sessions opened)"
            for r in result["runs"]) + f" (load {loadavg()})")
        if kill and nodes > 1:
            rate = max(1.0, round((best["jobs_per_s"] or 3) * 2 / 3, 1))
            log(f"killing a node of {nodes} while {args.kill_jobs} jobs flow at {rate}/s")
            out = run_scenario(lab, f"node_kill_of_{nodes}", kill_node, args.kill_jobs, rate,
                               args.timeout)
            result["node_kill"] = {**out.as_dict(), "rate": rate,
                                   "alive": lab.alive()}
            log(f"node kill: {out.completed}/{out.jobs} completed, ok={out.ok()}")
        return result
    finally:
        lab.stop()


def main(args) -> int:
    from benchmarks.harness import machine_info, write_results
    from benchmarks.netns import available
    why = available()
    if why:
        print(f"python -m benchmarks nodes: {why}", file=sys.stderr)
        return 3
    sizes = sorted(set(args.nodes or [1, 2, 4]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the finally blocks
    scratch = Path(tempfile.mkdtemp(prefix="agentq-nodes-"))
    stamp = datetime.now(timezone.utc)
    results: dict[str, Any] = {
        "meta": {"date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
                 "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
                 "machine": machine_info(), "cpus_per_node": args.cpus,
                 "broker": args.broker, "jobs_per_node": args.jobs_per_node,
                 "loadavg_start": loadavg()},
        "sizes": []}
    failed = []
    for n in sizes:
        try:
            results["sizes"].append(one_size(n, args, scratch, kill=not args.no_kill
                                             and n == sizes[-1]))
        except Exception as exc:  # noqa: BLE001 - a size that did not run is reported
            log(f"{n} node(s): {type(exc).__name__}: {str(exc)[:300]}")
            failed.append({"nodes": n, "error": f"{type(exc).__name__}: {exc}"})
    results["meta"]["loadavg_end"] = loadavg()
    results["failed"] = failed
    if not results["sizes"]:
        print("python -m benchmarks nodes: no node count ran", file=sys.stderr)
        return 1
    base = next((s["jobs_per_s"] for s in results["sizes"] if s["nodes"] == 1), None)
    mean = {s["nodes"]: sum(r["jobs_per_s"] or 0 for r in s["runs"]) / len(s["runs"])
            for s in results["sizes"]}
    for size in results["sizes"]:
        size["efficiency"] = (round(size["jobs_per_s"] / (size["nodes"] * base), 3)
                              if base and size["jobs_per_s"] else None)
        size["efficiency_mean"] = (round(mean[size["nodes"]] / (size["nodes"] * mean[1]), 3)
                                   if mean.get(1) else None)
    path = write_results(Path(args.results_dir), "nodes", results,
                         stamp.strftime("%Y%m%dT%H%M%SZ"))
    log(f"results: {path}")
    print(render(results))
    kills = [s["node_kill"] for s in results["sizes"] if "node_kill" in s]
    return 0 if all(k["ok"] for k in kills) and not failed else 1


def _gross_net(run: dict, name: str) -> str:
    """A server's CPU per job in a run, and in brackets net of its idle CPU."""
    gross, net = run["cpu_ms_per_job"], run.get("net_cpu_ms_per_job") or {}
    return f"{gross[name]} ({net[name]})" if name in net else str(gross[name])


def render(results: dict) -> str:
    """The figures as markdown tables."""
    meta = results["meta"]
    lines = [f"`{meta['command']}` ({meta['date']}, broker {meta['broker']}, "
             f"{meta['cpus_per_node']} CPU per node, load average {meta['loadavg_start']} "
             f"at the start, {meta['loadavg_end']} at the end)", "",
             "| nodes | jobs/s (best of runs) | runs | efficiency, best / mean | "
             "node CPU ms/job | Postgres CPU ms/job (net of idle) | broker CPU ms/job "
             "(net) | API CPU ms/job (net) | load before/after |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for size in results["sizes"]:
        best = max(size["runs"], key=lambda r: r["jobs_per_s"] or 0)
        gross = best["cpu_ms_per_job"]
        broker = _gross_net(best, "rabbitmq" if "rabbitmq" in gross else "redis")
        if "rabbitmq" in gross:
            broker += f" + Redis {_gross_net(best, 'redis')}"
        node_ms = round(sum(best["node_cpu_ms_per_job"].values()), 2)
        lines.append(
            f"| {size['nodes']} | {size['jobs_per_s']} | "
            f"{', '.join(str(r['jobs_per_s']) for r in size['runs'])} | "
            f"{size['efficiency']} / {size.get('efficiency_mean')} | {node_ms} | "
            f"{_gross_net(best, 'postgres')} | {broker} | {_gross_net(best, 'api')} | "
            f"{size['loadavg_before']} / {size['loadavg_after']} |")
    largest = results["sizes"][-1]
    best = max(largest["runs"], key=lambda r: r["jobs_per_s"] or 0)
    pg_ms = best["cpu_ms_per_job"]["postgres"]
    per_node = largest["jobs_per_s"] / largest["nodes"] if largest["jobs_per_s"] else None
    lines += ["", "| Postgres cores | jobs/s at 100% of them | at 70% | nodes of this size "
                  "at 70% |", "| --- | --- | --- | --- |"]
    for cores in (2, 4, 8, 16):
        ceiling = cores * 1000 / pg_ms if pg_ms else None
        lines.append(f"| {cores} | {ceiling:.0f} | {0.7 * ceiling:.0f} | "
                     f"{0.7 * ceiling / per_node:.0f} |" if ceiling and per_node
                     else f"| {cores} | | | |")
    for size in results["sizes"]:
        kill = size.get("node_kill")
        if kill:
            lines += ["", f"Node killed mid-run ({size['nodes']} nodes, {kill['jobs']} jobs at "
                          f"{kill['rate']}/s, the kill 40% in): completed {kill['completed']} "
                          f"of {kill['jobs']}, failed {kill['failed']}, duplicates "
                          f"{json.dumps(kill['duplicates'])}, tool re-runs "
                          f"{json.dumps(kill['tool_reruns'])}, API {json.dumps(kill['api'])}, "
                          f"drain {kill['drain_s']} s, ok: {kill['ok']}."]
    return "\n".join(lines)
