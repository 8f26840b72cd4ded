"""`python -m benchmarks compare BASE [--jobs N] [--latency S] [--pairs P]`: this tree
against the commit BASE, burst by burst, in turn.

On a shared machine a burst's CPU per job moves by 10-15% from one minute to the next (the
neighbours' load), more than most single changes save; two runs made minutes apart say
little. Here BASE is exported (`git archive`) beside this tree, and each tree's `burst`
(benchmarks/burst.py: its own stack, one-tool jobs, N at once, the model answering after S
seconds) runs `--paced`: both stacks up at once (the idle one on its own Redis database and
Postgres database), their bursts taken in turn, the order swapped each pair (base then
here, here then base), so a drift of the machine's load weighs on both alike within
seconds. BASE must have `burst --paced` (b76396e on). For each measure: both trees'
medians and the median of the pairs' ratios (here / base), with their range. Postgres's
WAL bytes per job is the one figure the machine's other load does not move. Both stacks
keep at most PACED_DB_POOL_SIZE connections a process (two stacks at the default would not
fit Postgres's default 100).

Results: benchmarks/results/<date>-compare.json (and latest-compare.json); the table is
printed. It is how a change to the hot path shows what it saves (docs/benchmarks.md).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from benchmarks import harness
from benchmarks.burst import READY, ROUND
from benchmarks.harness import BENCH_REDIS_URL, ROOT
from benchmarks.observability import log

MEASURES: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "jobs/s": lambda r: r.get("jobs_per_s"),
    "agentq CPU ms/job": lambda r: r["agentq_cpu_ms_per_job"],
    "web": lambda r: r["cpu_ms_per_job"].get("web"),
    "orchestrator": lambda r: r["cpu_ms_per_job"].get("orchestrator"),
    "tools": lambda r: r["cpu_ms_per_job"].get("tools"),
    "postgres": lambda r: r["services_cpu_ms_per_job"].get("postgres"),
    "redis": lambda r: r["services_cpu_ms_per_job"].get("redis"),
    "machine CPU ms/job": lambda r: r["machine_busy_ms_per_job"],
    "postgres WAL bytes/job": lambda r: r["postgres_wal_bytes_per_job"],
}
"""What is compared, read off each round of `burst`'s results."""


def order(pairs: int) -> list[tuple[int, str]]:
    """(pair, tree) in the order they run: base first in even pairs, here first in odd."""
    runs = []
    for pair in range(pairs):
        trees = ("base", "here") if pair % 2 == 0 else ("here", "base")
        runs.extend((pair, tree) for tree in trees)
    return runs


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """`rounds[tree][pair]`: that tree's burst of the pair. Per measure: each tree's median,
    and the pairs' ratios here / base."""
    out: dict[str, Any] = {}
    for name, read in MEASURES.items():
        values = {tree: [_value(read, r) for r in rounds[tree]] for tree in ("base", "here")}
        ratios = [round(here / base, 3) for base, here in zip(values["base"], values["here"],
                                                                  strict=False)
                  if base and here is not None]
        out[name] = {
            "base_median": _median(values["base"]), "here_median": _median(values["here"]),
            "ratio_median": _median(ratios),
            "ratio_range": [min(ratios), max(ratios)] if ratios else None,
            "ratios": ratios}
    return out


def _value(read, round_: dict[str, Any]) -> float | None:
    try:
        return read(round_)
    except (KeyError, TypeError):
        return None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def render(summary: dict[str, Any], base: str, here: str) -> str:
    lines = [f"| measure | base ({base}) | here ({here}) | here / base, median of pairs "
             f"(range) |", "| --- | --- | --- | --- |"]
    for name, m in summary.items():
        spread = (f" ({m['ratio_range'][0]:.3f}–{m['ratio_range'][1]:.3f})"
                  if m["ratio_range"] else "")
        ratio = f"{m['ratio_median']:.3f}{spread}" if m["ratio_median"] is not None else "–"
        lines.append(f"| {name} | {_show(m['base_median'])} | {_show(m['here_median'])} | "
                     f"{ratio} |")
    return "\n".join(lines)


def _show(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def export(rev: str, into: Path) -> str:
    """`rev` of this repository, its files only, into `into`; its short hash."""
    commit = _git("rev-parse", "--short", rev)
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT,
                             capture_output=True, check=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


PACED_DB_POOL_SIZE = 10
"""Connections a process of either stack keeps (AGENTQ_DB_POOL_SIZE, unless set): two stacks
of the default 30 hold more than Postgres's default 100 between them, and a step that got
none failed its job for the sweeper (seen: a round's jobs not done in 180 s). Both trees
run with the same pool; `burst` alone runs with the default."""


def takes_turns(tree: Path) -> bool:
    """Whether `tree`'s burst runs `--paced` (b76396e on)."""
    source = tree / "benchmarks" / "burst.py"
    return source.exists() and "args.paced" in source.read_text()


def redis_db(url: str, offset: int) -> str:
    """`url` (redis://host:port/db) on database db + offset: two stacks never share one."""
    base, _, db = url.rpartition("/")
    return f"{base}/{int(db or 0) + offset}"


class PacedBurst:
    """A tree's `burst --paced` in its own process: its stack warm, a round on each `go`."""

    def __init__(self, tree: Path, args, redis_offset: int, logs: Path):
        self.tree = tree
        self.stderr = open(logs, "w")
        env = {**os.environ, "PYTHONPATH": str(tree),
               "AGENTQ_BENCH_REDIS": redis_db(BENCH_REDIS_URL, redis_offset),
               "AGENTQ_DB_POOL_SIZE": os.environ.get("AGENTQ_DB_POOL_SIZE",
                                                     str(PACED_DB_POOL_SIZE))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks", "burst", "--paced", "--jobs", str(args.jobs),
             "--rounds", str(args.pairs), "--latency", str(args.latency),
             "--results-dir", str(logs.parent / f"results-{redis_offset}")],
            cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr, text=True, preexec_fn=harness.die_with_parent)

    def _line(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):]
        self.proc.wait()
        raise RuntimeError(f"burst in {self.tree} exited {self.proc.returncode} before "
                           f"{prefix.strip()!r}: see {self.stderr.name}")

    def ready(self) -> None:
        self._line(READY)

    def round(self) -> dict[str, Any]:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return json.loads(self._line(ROUND))

    def stop(self) -> None:
        try:
            self.proc.stdin.close()  # no more rounds: it stops its stack and exits
            self.proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.terminate()
            self.proc.wait(timeout=60)
        finally:
            self.stderr.close()


def paced(trees: dict[str, Path], args, scratch: Path) -> dict[str, list[dict[str, Any]]]:
    """Both stacks up, bursts in turn (`order`): each tree's rounds, a pair's at its index."""
    rounds: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    bursts = {tree: PacedBurst(path, args, offset, scratch / f"{tree}.log")
              for offset, (tree, path) in enumerate(trees.items())}
    try:
        for burst in bursts.values():
            burst.ready()
        for pair, tree in order(args.pairs):
            result = bursts[tree].round()
            rounds[tree].append(result)
            log(f"pair {pair + 1}/{args.pairs}, {tree}: " + ", ".join(
                f"{name} {_show(_value(read, result))}" for name, read in MEASURES.items()))
    finally:
        for burst in bursts.values():
            burst.stop()
    return rounds


def main(args) -> int:
    missing = harness.services_answer()
    if missing:
        print(f"cannot run: {' and '.join(missing)} not answering", file=sys.stderr)
        return 3
    scratch = Path(tempfile.mkdtemp(prefix="agentq-compare-"))
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    here = _git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
    try:
        base = export(args.base, scratch / "base")
        rounds = (paced({"base": scratch / "base", "here": ROOT}, args, scratch)
                  if takes_turns(scratch / "base") else None)
    except BaseException:
        log(f"the stacks' logs are kept in {scratch}")
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    if rounds is None:
        print(f"cannot compare with {base}: its burst cannot take turns (--paced came with "
              f"b76396e)", file=sys.stderr)
        return 2
    summary = summarize(rounds)
    stamp = datetime.now(timezone.utc)
    out = {"meta": {"date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
                    "command": "python -m benchmarks compare " + " ".join(sys.argv[2:]),
                    "base": base, "here": here, "jobs": args.jobs, "latency_s": args.latency,
                    "pairs": args.pairs, "machine": harness.machine_info()},
           "summary": summary, "rounds": rounds}
    path = harness.write_results(Path(args.results_dir), "compare", out,
                                 stamp.strftime("%Y%m%dT%H%M%SZ"))
    print(render(summary, base, here))
    log(f"results: {path}")
    return 0
