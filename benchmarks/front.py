"""`python -m benchmarks front [--slow N] [--streams M] [--clients C] [--seconds S]
[--settle S] [--rounds R]`: the web front under slow clients (issue 30; docs/benchmarks.md, "Slow
clients").

The bench stack (`harness.Lab`: the Procfile's processes, web = gunicorn's gevent workers, 2
of them, as gunicorn.conf.py sets them) is measured in R pairs of runs, quiet then attacked:

- C closed-loop clients submit one-tool jobs for S seconds (each submits, waits for its job
  to end, submits again: the `throughput` scenario's loop) — submitted jobs/s;
- a probe asks GET /health every 0.1 s on a new connection (30 s timeout; one that gets no
  answer counts as unanswered) — its p50/p99/max;
- attacked: meanwhile N connections each send half a request head and never the rest (a
  slowloris: when the server closes one, at its header timeout, it is opened again at once,
  so N stay open or opening all the time), and M event streams are held open on a job that
  waits for a person's approval (it never ends while measured), M / 10 keys with 10
  streams each (under the default `streams_per_key`); measured from `--settle` seconds
  after they are all opened (the workers first accept the N at once). The probe's answers
  over 1 s are listed with when they came.

The targets (issue 30): attacked jobs/s within 10% of quiet; /health p99 < 1 s attacked.
Results: benchmarks/results/<date>-front.json (and latest-front.json). The open-files limit
of this process is raised to its hard limit (N + M sockets are held here).
"""
from __future__ import annotations

import http.client
import math
import resource
import selectors
import socket
import statistics
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests

from benchmarks import harness, scenarios
from benchmarks.observability import log

WARMUP_JOBS = 5
PROBE_EVERY_S = 0.1
PROBE_TIMEOUT_S = 30.0
STREAMS_PER_KEY = 10
HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow"


class HealthProbe(threading.Thread):
    """GET /health on a new connection every PROBE_EVERY_S: latencies, and failures."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.latencies: list[float] = []
        self.slow: list[tuple[float, float]] = []  # (seconds into the run, seconds taken)
        self.unanswered = 0
        self.started = time.perf_counter()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            t0 = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                  timeout=PROBE_TIMEOUT_S)
                conn.request("GET", "/health")
                response = conn.getresponse()
                response.read()
                conn.close()
                if response.status != 200:
                    raise RuntimeError(response.status)
                taken = time.perf_counter() - t0
                self.latencies.append(taken)
                if taken > 1:
                    self.slow.append((round(t0 - self.started, 1), round(taken, 2)))
            except Exception:  # noqa: BLE001 - counted
                self.unanswered += 1
            self.stopping.wait(PROBE_EVERY_S)

    def stop(self) -> dict[str, Any]:
        self.stopping.set()
        self.join(PROBE_TIMEOUT_S + 5)
        ms = [1000 * v for v in self.latencies]
        return {"n": len(ms), "unanswered": self.unanswered, "over_1_s": self.slow[:50],
                **({"p50_ms": round(harness.percentile(ms, 50), 1),
                    "p99_ms": round(harness.percentile(ms, 99), 1),
                    "max_ms": round(max(ms), 1)} if ms else {})}


class Attack(threading.Thread):
    """`slow` half-open connections kept at that count, and streams held open."""

    def __init__(self, port: int, slow: int, streams: list[tuple[str, str]]):
        super().__init__(daemon=True)
        self.port, self.slow_count, self.stream_specs = port, slow, streams
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.reopened = 0
        self.streams_ended = 0
        self.stream_refused = 0
        self.open_slow = 0
        self.open_streams = 0
        self.min_open_slow = slow

    def _open_slow(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.sendall(HALF_HEAD)
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, "slow")
        self.open_slow += 1

    def _open_stream(self, key: str, job_id: str) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.sendall(f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Accept: text/event-stream\r\nAuthorization: Bearer {key}\r\n\r\n"
                     .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
        if not head.startswith(b"HTTP/1.1 200"):
            self.stream_refused += 1
            sock.close()
            return
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, "stream")
        self.open_streams += 1

    def open_all(self) -> float:
        """Open everything; the seconds it took."""
        t0 = time.perf_counter()
        for key, job_id in self.stream_specs:
            self._open_stream(key, job_id)
        for _ in range(self.slow_count):
            self._open_slow()
        return time.perf_counter() - t0

    def run(self) -> None:
        while not self.stopping.is_set():
            for selected, _ in self.selector.select(0.5):
                sock, kind = selected.fileobj, selected.data
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if data:
                    continue  # a stream's events and keep-alives
                self.selector.unregister(sock)
                sock.close()
                if kind == "stream":
                    self.open_streams -= 1
                    self.streams_ended += 1
                    continue
                self.open_slow -= 1
                self.min_open_slow = min(self.min_open_slow, self.open_slow)
                try:
                    self._open_slow()
                    self.reopened += 1
                except OSError:
                    pass

    def stop(self) -> dict[str, Any]:
        self.stopping.set()
        self.join(10)
        stats = {"slow_connections": self.slow_count, "open_slow_at_end": self.open_slow,
                 "fewest_open_slow": self.min_open_slow,
                 "slow_reopened_after_the_server_closed_them": self.reopened,
                 "streams": len(self.stream_specs), "streams_open_at_end": self.open_streams,
                 "streams_refused": self.stream_refused, "streams_ended": self.streams_ended}
        for selected in list(self.selector.get_map().values()):
            selected.fileobj.close()
        self.selector.close()
        return stats


def measure(ctx: scenarios.Context, clients: int, seconds: float) -> dict[str, Any]:
    probe = HealthProbe(ctx.lab.stack.port)
    probe.start()
    loop = scenarios._closed_loop(ctx, clients, seconds)
    loop["health"] = probe.stop()
    return loop


def held_job(ctx: scenarios.Context) -> str:
    """A job that waits for a person's approval of its first tool call: it never ends while
    measured (and holds no worker)."""
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {ctx.lab.key}"
    base = ctx.lab.stack.base
    persona = http.post(f"{base}/v1/personas", json={
        "name": "bench front approvals", "platform": "bench-front", "is_default": False,
        "requires_approval": ["math.evaluate"]}, timeout=30)
    persona.raise_for_status()
    job_id, _ = ctx.client.submit(scenarios.ONE_TOOL_TURN, persona_id=persona.json()["id"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = http.get(f"{base}/v1/jobs/{job_id}", timeout=30).json()
        if job["status"] == "waiting":
            return job_id
        if job["status"] in ("completed", "failed", "cancelled"):
            raise RuntimeError(f"the held job ended: {job}")
        time.sleep(0.2)
    raise RuntimeError("the held job did not come to wait for approval")


def raise_open_files() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(args) -> int:
    missing = harness.services_answer()
    if missing:
        print(f"cannot run: {' and '.join(missing)} not answering", file=sys.stderr)
        return 3
    files = raise_open_files()
    needed = args.slow + args.streams + 200
    if files < needed:
        print(f"cannot run: the open-files limit is {files}, {needed} needed (ulimit -n)",
              file=sys.stderr)
        return 3
    lab = harness.start_lab("agentq-front-", log)
    if lab is None:
        return 4
    ctx = scenarios.Context(lab, scenarios.QUICK)
    now = datetime.now(timezone.utc)
    results: dict[str, Any] = {"meta": {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks front " + " ".join(sys.argv[2:]),
        "machine": harness.machine_info(), "versions": harness.versions(),
        "slow": args.slow, "streams": args.streams, "clients": args.clients,
        "seconds": args.seconds, "rounds": args.rounds, "settle_s": args.settle,
        "web": f"gunicorn, {lab.web_workers} gevent workers x "
               f"{lab.settings().front.web_connections} connections, header timeout "
               f"{lab.settings().front.header_timeout_s} s"}, "rounds": []}
    try:
        for _ in range(WARMUP_JOBS):
            ctx.one_job()
        job_id = held_job(ctx)
        keys = [lab.stack.create_key(f"streams-{i}", admin=True)
                for i in range(math.ceil(args.streams / STREAMS_PER_KEY))]
        specs = [(keys[i // STREAMS_PER_KEY], job_id) for i in range(args.streams)]
        for r in range(args.rounds):
            log(f"round {r}: quiet, {args.clients} clients for {args.seconds:g} s")
            quiet = measure(ctx, args.clients, args.seconds)
            attack = Attack(lab.stack.port, args.slow, specs)
            opened_in = attack.open_all()
            attack.start()
            time.sleep(args.settle)
            log(f"round {r}: {args.slow} slow connections and {args.streams} streams opened "
                f"in {opened_in:.1f} s, {args.settle:g} s to settle; attacked, {args.clients} "
                f"clients")
            attacked = measure(ctx, args.clients, args.seconds)
            attacked["attack"] = {**attack.stop(), "opened_in_s": round(opened_in, 1)}
            results["rounds"].append({"quiet": quiet, "attacked": attacked})
            log(f"round {r}: jobs/s {quiet['jobs_per_s']} quiet, {attacked['jobs_per_s']} "
                f"attacked; /health p99 {quiet['health'].get('p99_ms')} / "
                f"{attacked['health'].get('p99_ms')} ms, unanswered "
                f"{quiet['health']['unanswered']} / {attacked['health']['unanswered']}; "
                f"attack {attacked['attack']}")
    finally:
        ctx.close()
        lab.stop()
    results["summary"] = summarize(results["rounds"])
    path = harness.write_results(Path(args.results_dir), "front", results,
                                 now.strftime("%Y%m%dT%H%M%SZ"))
    log(f"results: {path}")
    print(render(results))
    return 0 if results["summary"]["targets_met"] else 1


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    quiet = statistics.median(r["quiet"]["jobs_per_s"] or 0 for r in rounds)
    attacked = statistics.median(r["attacked"]["jobs_per_s"] or 0 for r in rounds)
    p99 = max(r["attacked"]["health"].get("p99_ms") or math.inf for r in rounds)
    unanswered = sum(r["attacked"]["health"]["unanswered"] for r in rounds)
    ratio = attacked / quiet if quiet else None
    return {"quiet_jobs_per_s": quiet, "attacked_jobs_per_s": attacked,
            "attacked_to_quiet": round(ratio, 3) if ratio is not None else None,
            "attacked_health_p99_ms_worst_round": p99, "attacked_health_unanswered": unanswered,
            "targets_met": bool(ratio is not None and ratio >= 0.9 and p99 < 1000
                                and unanswered == 0)}


def render(results: dict[str, Any]) -> str:
    meta, s = results["meta"], results["summary"]
    lines = [f"{meta['slow']} slow connections + {meta['streams']} held streams, "
             f"{meta['clients']} clients, {meta['seconds']:g} s a run ({meta['web']})", "",
             "| round | jobs/s quiet | jobs/s attacked | /health p50 / p99 / max ms quiet | "
             "attacked | unanswered | slow reopened | streams open at end |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(results["rounds"]):
        q, a = r["quiet"], r["attacked"]
        lines.append(
            f"| {i} | {q['jobs_per_s']} | {a['jobs_per_s']} | "
            f"{q['health'].get('p50_ms')} / {q['health'].get('p99_ms')} / "
            f"{q['health'].get('max_ms')} | {a['health'].get('p50_ms')} / "
            f"{a['health'].get('p99_ms')} / {a['health'].get('max_ms')} | "
            f"{a['health']['unanswered']} | "
            f"{a['attack']['slow_reopened_after_the_server_closed_them']} | "
            f"{a['attack']['streams_open_at_end']}/{a['attack']['streams']} |")
    lines += ["", f"Median jobs/s attacked / quiet: {s['attacked_to_quiet']} (target ≥ 0.9); "
                  f"worst /health p99 attacked: {s['attacked_health_p99_ms_worst_round']} ms "
                  f"(target < 1000); targets met: {s['targets_met']}."]
    return "\n".join(lines)

