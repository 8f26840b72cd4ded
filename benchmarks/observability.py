"""`python -m benchmarks observability [--pairs N] [--clients C] [--seconds S]
[--on both|metrics|tracing] [--together]`: what metrics and traces cost on the throughput
scenario, on vs off in the same run.

Two stacks are started side by side, each on its own Postgres database, its own Redis
server (a `redis-server` on a free port, so neither consumes the other's queues) and its
own model server; metrics and tracing are set per process at start:

  off  AGENTQ_METRICS=0 and AGENTQ_TRACING=0: no recording, no tracer provider;
  on   the defaults with an OTLP endpoint: Prometheus multiprocess metrics recorded by every
       process (its own $AGENTQ_HOME/metrics) and scraped at `GET /metrics` every
       `--scrape-s` seconds while it is measured; OpenTelemetry spans (Flask, Celery,
       `llm.request`, `job.end`) exported over OTLP/HTTP by the SDK's batch processor (its
       default 5 s schedule) to `benchmarks/otlp_sink.py`, a receiver in its own process.

Then bursts of scenario 2's closed loop (`scenarios._closed_loop`: C clients, each
submitting a one-tool-turn job against the instant model and waiting for its end, for S
seconds) go to one stack, then the other, in pairs whose order alternates (off/on, on/off,
...), so the shared machine's changing load falls on both sides alike; the idle stack
waits (its workers poll, nothing more). After each burst a pause of `--pause-s` (6 s, past
the span processor's 5 s schedule) lets the spans of an "on" burst be exported before the
next burst starts, so that cost is not charged to an "off" one.

With `--together` the two bursts of a pair run at the same time instead, each stack with
its own C clients: on a shared machine whose other load comes and goes, both sides then
meet the same load. Read its CPU per job: its jobs/s say as much how the kernel shared the
two cores between the two stacks' threads as what "on" costs (the spans exported are
counted for the pair, all of them the "on" stack's).

Per mode: the median over the bursts of jobs/s, of the median latency and of the stack's
CPU per job; the median of the per-pair ratios; and the pooled rate (all jobs / all
measured seconds). The "on" stack is checked to have exported spans and counted its jobs
at `/metrics`; the "off" stack runs with no OTLP endpoint in its environment (the spans the
sink gets during an "off" burst are the idle "on" stack's: its beat's and sweeper's).
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STACK_PROCESSES = ("web", "orchestrator", "tools", "tools-slow", "webhooks", "beat")
ENDED_RE = re.compile(r'^agentq_jobs_ended_total\{[^}]*status="completed"[^}]*\} ([0-9.e+]+)$',
                      re.M)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg() -> str | None:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return None


class Sink:
    """`python -m benchmarks.otlp_sink` as a child process."""

    def __init__(self):
        from tests.support.stack import die_with_parent
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.otlp_sink"], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                     start_new_session=True, preexec_fn=die_with_parent)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.stop()
            raise RuntimeError(f"the OTLP sink did not start: {self.url!r}")

    def stats(self) -> dict[str, Any]:
        import requests
        return requests.get(f"{self.url}/stats", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class Scraper(threading.Thread):
    """GET /metrics every `interval_s` (as Prometheus would) until stopped."""

    def __init__(self, base: str, interval_s: float):
        super().__init__(daemon=True, name="scraper")
        self.url, self.interval_s = f"{base}/metrics", interval_s
        self.scrapes, self.failures, self.last = 0, 0, ""
        self._halt = threading.Event()

    def scrape(self) -> str:
        import requests
        response = requests.get(self.url, timeout=30)
        response.raise_for_status()
        return response.text

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            try:
                self.last = self.scrape()
                self.scrapes += 1
            except Exception:  # noqa: BLE001 - counted
                self.failures += 1

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=35)


class PrivateRedis:
    """A redis-server of one stack's own on a free port (no persistence)."""

    def __init__(self):
        import shutil

        from tests.support.stack import answers, die_with_parent, free_port
        self.port = free_port()
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
        deadline = time.monotonic() + 15
        while not answers("127.0.0.1", self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.1)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class Side:
    """One stack ("off" or "on"), its Redis, its context, its scraper."""

    def __init__(self, mode: str, sink: Sink, on: tuple[str, ...], scratch: Path,
                 warmup: int):
        from benchmarks.harness import Lab
        from benchmarks.scenarios import Context, Sizes

        self.mode, self.on = mode, (on if mode == "on" else ())
        self.redis = PrivateRedis()
        overrides = {"AGENTQ_METRICS": "0", "AGENTQ_TRACING": "0",
                     "AGENTQ_BROKER_URL": self.redis.url,
                     "AGENTQ_RESULT_BACKEND_URL": self.redis.url}
        if "metrics" in self.on:
            overrides["AGENTQ_METRICS"] = "1"
        if "tracing" in self.on:
            overrides.update({"AGENTQ_TRACING": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url})

        class SideLab(Lab):
            def env(self) -> dict[str, str]:
                return {**super().env(), **overrides}

        self.lab = SideLab(scratch)
        self.lab.db_name = f"agentq_bench_{mode}_{os.getpid()}"
        self.ctx = None
        try:
            self.lab.start()
            if "tracing" not in self.on:  # nothing inherited from the benchmark's environment
                names = [k for k in self.lab.stack.env if k.startswith("OTEL_EXPORTER_OTLP")]
                if names:
                    raise RuntimeError(f"{names[0]} is set in the environment: unset it")
            self.ctx = Context(self.lab, Sizes(warmup_jobs=warmup))
            self.lab.server.set_latency(0)
            for _ in range(warmup):
                self.ctx.one_job()
        except BaseException:
            self.stop()
            raise

    def burst(self, clients: int, seconds: float, scrape_s: float) -> dict[str, Any]:
        from benchmarks.scenarios import _closed_loop
        scraper = None
        if "metrics" in self.on:
            scraper = Scraper(self.lab.stack.base, scrape_s)
            scraper.start()
        load_start = loadavg()
        try:
            level = _closed_loop(self.ctx, clients, seconds)
        finally:
            if scraper is not None:
                scraper.stop()
        stack_cpu = sum(level["cpu_ms_per_job"].get(name) or 0 for name in STACK_PROCESSES)
        out = {"mode": self.mode, "clients": clients, "seconds": seconds,
               "jobs_per_s": level["jobs_per_s"], "completed": level["completed"],
               "failed": level["failed"], "elapsed_s": level["elapsed_s"],
               "latency": level["latency"], "machine_busy": level["machine_busy"],
               "cpu_ms_per_job": level["cpu_ms_per_job"],
               "stack_cpu_ms_per_job": round(stack_cpu, 2), "loadavg_start": load_start,
               "loadavg_end": loadavg()}
        if scraper is not None:
            out["scrapes"], out["scrape_failures"] = scraper.scrapes, scraper.failures
        return out

    def jobs_counted_by_metrics(self) -> float | None:
        if "metrics" not in self.on:
            return None
        text = Scraper(self.lab.stack.base, 0).scrape()
        return sum(float(v) for v in ENDED_RE.findall(text))

    def stop(self) -> None:
        try:
            if self.ctx is not None:
                self.ctx.close()
        finally:
            try:
                self.lab.stop()
            finally:
                self.redis.stop()


def main(args) -> int:
    import signal

    from benchmarks import harness
    missing = harness.services_answer()
    if missing:
        print(f"cannot run: {' and '.join(missing)} not answering", file=sys.stderr)
        return 3
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stacks on a TERM
    on = ("metrics", "tracing") if args.on == "both" else (args.on,)
    command = (f"python -m benchmarks observability --pairs {args.pairs} --clients "
               f"{args.clients} --seconds {args.seconds:g}"
               + (f" --on {args.on}" if args.on != "both" else "")
               + (" --together" if args.together else ""))
    started = time.perf_counter()
    now = datetime.now(timezone.utc)
    runs: list[dict[str, Any]] = []
    scratch_root = Path(tempfile.mkdtemp(prefix="agentq-bench-obs-"))
    log(f"starting an off and an on ({'+'.join(on)}) stack (logs in {scratch_root})")
    sink = Sink()
    sides: dict[str, Side] = {}
    try:
        for mode in ("off", "on"):
            sides[mode] = Side(mode, sink, on, scratch_root / mode, args.warmup)
        time.sleep(args.pause_s)  # the warm-up's spans go out before anything is measured
        log(f"{args.pairs} pairs of bursts, {args.clients} clients x {args.seconds:g} s each"
            + (", both stacks at once" if args.together else ""))
        for pair in range(args.pairs):
            if args.together:
                spans_before = sink.stats()["spans"]
                both = bursts_together(sides, args.clients, args.seconds, args.scrape_s)
                time.sleep(args.pause_s)
                spans = sink.stats()["spans"] - spans_before
                for mode in ("off", "on"):  # the off stack has no endpoint: all are on's
                    both[mode]["spans_exported"] = spans if mode == "on" else None
                pair_runs = [both["off"], both["on"]]
            else:
                pair_runs = []
                for mode in (("off", "on") if pair % 2 == 0 else ("on", "off")):
                    spans_before = sink.stats()["spans"]
                    run = sides[mode].burst(args.clients, args.seconds, args.scrape_s)
                    time.sleep(args.pause_s)  # this burst's spans are exported now
                    run["spans_exported"] = sink.stats()["spans"] - spans_before
                    pair_runs.append(run)
            for run in pair_runs:
                run["pair"] = pair
                runs.append(run)
                log(f"pair {pair + 1} {run['mode']}: {run['jobs_per_s']} jobs/s, median "
                    f"{run['latency']['median_ms']} ms, stack CPU "
                    f"{run['stack_cpu_ms_per_job']} ms/job"
                    + (f", {run['spans_exported']} spans"
                       if run["spans_exported"] is not None else "")
                    + (f", {run['scrapes']} scrapes" if "scrapes" in run else "")
                    + f" (load {run['loadavg_start']})")
        counted = sides["on"].jobs_counted_by_metrics()
    finally:
        for side in sides.values():
            side.stop()
        sink.stop()
    result = summarize(runs)
    result["meta"] = {"command": command, "date": now.strftime("%Y-%m-%d %H:%M UTC"),
                      "duration_s": round(time.perf_counter() - started, 1),
                      "machine": harness.machine_info(), "versions": harness.versions(),
                      "scrape_s": args.scrape_s, "pause_s": args.pause_s,
                      "warmup_jobs": args.warmup, "on": list(on),
                      "on_jobs_counted_by_metrics": counted}
    result["runs"] = runs
    harness.write_results(Path(args.results_dir), "observability", result,
                          now.strftime("%Y%m%dT%H%M%SZ"))
    print(render(result))
    problems = check(runs, on, counted, args.warmup)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def bursts_together(sides: dict[str, "Side"], clients: int, seconds: float,
                    scrape_s: float) -> dict[str, dict[str, Any]]:
    """One burst on each stack, both at the same time."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="burst") as pool:
        futures = {mode: pool.submit(sides[mode].burst, clients, seconds, scrape_s)
                   for mode in ("off", "on")}
        return {mode: future.result() for mode, future in futures.items()}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(mode: str, pick) -> float | None:
        values = [pick(r) for r in runs if r["mode"] == mode and pick(r) is not None]
        return round(statistics.median(values), 2) if values else None

    picks = {"jobs_per_s": lambda r: r["jobs_per_s"],
             "median_latency_ms": lambda r: r["latency"]["median_ms"],
             "p95_latency_ms": lambda r: r["latency"]["p95_ms"],
             "stack_cpu_ms_per_job": lambda r: r["stack_cpu_ms_per_job"]}
    modes = {mode: {name: med(mode, pick) for name, pick in picks.items()}
             for mode in ("off", "on")}
    pairs: dict[int, dict[str, dict]] = {}
    for r in runs:
        pairs.setdefault(r["pair"], {})[r["mode"]] = r
    pair_ratios = {name: [] for name in picks}
    for pair in pairs.values():
        if "on" in pair and "off" in pair:
            for name, pick in picks.items():
                on, off = pick(pair["on"]), pick(pair["off"])
                if on is not None and off:
                    pair_ratios[name].append(on / off)
    ratios = {name: round(statistics.median(v), 3) if v else None
              for name, v in pair_ratios.items()}
    of_medians = {name: round(modes["on"][name] / modes["off"][name], 3)
                  if modes["on"][name] is not None and modes["off"][name] else None
                  for name in picks}
    for mode in ("off", "on"):
        done = sum(r["completed"] for r in runs if r["mode"] == mode)
        spent = sum(r["elapsed_s"] for r in runs if r["mode"] == mode)
        modes[mode]["pooled_jobs_per_s"] = round(done / spent, 2) if spent else None
    pooled = (round(modes["on"]["pooled_jobs_per_s"] / modes["off"]["pooled_jobs_per_s"], 3)
              if modes["off"]["pooled_jobs_per_s"] else None)
    throughput_cost = (1 - ratios["jobs_per_s"]) if ratios["jobs_per_s"] else None
    return {"off": modes["off"], "on": modes["on"], "ratio_on_off_pooled_jobs_per_s": pooled,
            "ratio_on_off_of_medians": of_medians,
            "ratio_on_off_median_of_pairs": ratios,
            "pair_ratios": {k: [round(x, 3) for x in v] for k, v in pair_ratios.items()},
            "throughput_overhead_pct": round(100 * throughput_cost, 1)
            if throughput_cost is not None else None,
            "target": "metrics and tracing cost under 5% of throughput",
            "met": throughput_cost is not None and throughput_cost < 0.05}


def check(runs: list[dict[str, Any]], on: tuple[str, ...], counted: float | None,
          warmup: int) -> list[str]:
    problems = []
    for r in runs:
        where = f"pair {r['pair'] + 1} {r['mode']}"
        if r["failed"]:
            problems.append(f"{where}: {r['failed']} jobs failed")
        if r["mode"] == "on" and "tracing" in on and r["spans_exported"] <= 0:
            problems.append(f"{where}: no spans reached the sink")
        if "tracing" not in on and r["spans_exported"]:
            problems.append(f"{where}: {r['spans_exported']} spans exported with tracing off")
    measured = sum(r["completed"] for r in runs if r["mode"] == "on")
    if "metrics" in on and (counted or 0) < measured + warmup:
        problems.append(f"/metrics counted {counted} completed jobs on the on stack, fewer "
                        f"than the {measured + warmup} it ran")
    return problems


def render(result: dict[str, Any]) -> str:
    off, on = result["off"], result["on"]
    pr, mr = result["ratio_on_off_median_of_pairs"], result["ratio_on_off_of_medians"]
    lines = ["| | off | on | on/off (of medians) | on/off (median of pairs) |",
             "| --- | --- | --- | --- | --- |"]
    for name, label in (("jobs_per_s", "jobs/s"), ("median_latency_ms", "median latency ms"),
                        ("p95_latency_ms", "p95 latency ms"),
                        ("stack_cpu_ms_per_job", "stack CPU ms per job")):
        lines.append(f"| {label} | {off[name]} | {on[name]} | {mr[name]} | {pr[name]} |")
    lines.append(f"| pooled jobs/s | {off['pooled_jobs_per_s']} | {on['pooled_jobs_per_s']} | "
                 f"{result['ratio_on_off_pooled_jobs_per_s']} | |")
    lines.append("")
    lines.append(f"Throughput overhead (median of pairs): {result['throughput_overhead_pct']}% "
                 f"(target under 5%: {'yes' if result['met'] else 'no'}).")
    return "\n".join(lines)
