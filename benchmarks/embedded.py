"""`python -m benchmarks embedded [--runs N]`: agentq's own time for a one-tool job in the
embedded mode, through `agentq run` as a person runs it (a fresh process and AGENTQ_HOME
each run: SQLite, the in-process broker and worker), against the scripted model answering
at once (a `math.evaluate` call, then the answer). Needs no servers.

Per run, from the job's own rows: `job_ms` (created → finished, the job's whole life after
submission), `model_ms` (the router's measured latency of its two model calls, from the
log) and `agentq_ms` = job_ms − model_ms, the time agentq itself took: the hops (step →
tool task → step) through the broker, the database writes, building the context. The
process's start (imports, migrations, the worker) is reported apart as `process_s`.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is 6*7? Use the calculator."
LATENCY_RE = re.compile(r"llm\.reply .*latency_ms=(\d+)")


def one_run(home: Path, base_url: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENTQ_", "OPENAI_", "PROMETHEUS_"))}
    env.update({"AGENTQ_HOME": str(home), "OPENAI_BASE_URL": base_url,
                "OPENAI_API_KEY": "sk-bench"})
    agentq = str(Path(sys.executable).with_name("agentq"))
    started = time.perf_counter()
    done = subprocess.run([agentq, "run", QUESTION], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    process_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"agentq run exited {done.returncode}: {done.stderr[-2000:]}")
    with sqlite3.connect(home / "agentq.db") as db:
        job_ms, calls = db.execute(
            "SELECT (julianday(finished_at) - julianday(created_at)) * 86400000, "
            "(SELECT count(*) FROM tool_calls WHERE tool_calls.job_id = jobs.id) FROM jobs"
        ).fetchone()
    model_ms = [int(m) for m in LATENCY_RE.findall((home / "agentq.log").read_text())]
    return {"job_ms": round(job_ms, 1), "model_ms": sum(model_ms),
            "agentq_ms": round(job_ms - sum(model_ms), 1), "model_calls": len(model_ms),
            "tool_calls": calls, "process_s": round(process_s, 2),
            "answer": done.stdout.strip()}


def main(runs: int, results_dir: Path) -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from agentq.testing.scripted_llm import ScriptedLLM, react_responder
    rows = []
    with ScriptedLLM(responder=react_responder()) as llm, \
            tempfile.TemporaryDirectory(prefix="agentq-bench-embedded-") as scratch:
        for i in range(runs):
            row = one_run(Path(scratch) / f"run{i}", llm.base_url)
            rows.append(row)
            print(f"run {i + 1}: agentq {row['agentq_ms']} ms (job {row['job_ms']} ms, "
                  f"model {row['model_ms']} ms, {row['model_calls']} model calls, "
                  f"{row['tool_calls']} tool call); process {row['process_s']} s",
                  file=sys.stderr, flush=True)
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = None
    result = {"scenario": "embedded_one_tool_job", "command": "python -m benchmarks embedded "
              f"--runs {runs}", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "loadavg": load, "runs": rows,
              "median_agentq_ms": statistics.median(r["agentq_ms"] for r in rows),
              "median_job_ms": statistics.median(r["job_ms"] for r in rows),
              "median_process_s": statistics.median(r["process_s"] for r in rows)}
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "latest-embedded.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return 0
