"""The benchmark code runs: `python -m benchmarks run --quick --smoke` end to end (tiny sizes),
and its results file has every scenario with the expected keys. No timing is asserted.

Needs PostgreSQL and Redis on 127.0.0.1 (as the integration tests do); skipped when they do
not answer (failed under CI=true, where .ci/run starts them).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 240

EXPECTED = {
    "server": {"requests_per_s", "latency", "server_cpu_ms_per_call"},
    "overhead": {"agentq", "floor", "ratio_median", "ratio_p95", "agentq_breakdown_ms",
                 "floor_breakdown_ms"},
    "throughput": {"levels", "saturated_jobs_per_s", "knee_clients", "knee_latency"},
    "inflight": {"max_model_calls_waiting", "jobs_per_s", "ideal_jobs_per_s",
                 "fraction_of_ideal", "orchestrator_rss_mib", "latency", "targets"},
    "growth": {"by_stored_messages", "by_tool_turns", "history_ratio", "turns_ratio"},
    "batch": {"lines", "admit_s", "complete_s", "jobs_per_s", "counts",
              "results_in_request_order", "chat_latency", "batch_finished_when_chat_ended"},
}
PEER_KEYS = {"agentq", "langgraph", "ahead_on_jobs_per_s", "ahead_on_median_latency"}
SUMMARY_KEYS = {"n", "median_ms", "p95_ms"}


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def servers_up():
    missing = [name for name, port in (("PostgreSQL", 5432), ("Redis", 6379))
               if not _answers(port)]
    if missing:
        message = f"{' and '.join(missing)} not answering on 127.0.0.1"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message + ": the benchmark smoke run needs both (.ci/run starts them)")


def _run_stopping_cleanly(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the benchmark; past the timeout, TERM it (it then stops its stack) and fail."""
    proc = subprocess.Popen(args, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the smoke run took over {SMOKE_TIMEOUT_S} s:\n{err[-4000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def test_quick_smoke_run_writes_results_with_every_scenario(servers_up, tmp_path):
    docs = tmp_path / "benchmarks.md"
    proc = _run_stopping_cleanly(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--smoke",
         "--results-dir", str(tmp_path), "--docs", str(docs)],
        # its own Redis database: the integration stack may be running on the default one
        env={**os.environ, "PYTHONWARNINGS": "ignore",
             "AGENTQ_TEST_REDIS": "redis://127.0.0.1:6379/11"})
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]

    latest = tmp_path / "latest-smoke.json"
    assert latest.exists(), sorted(p.name for p in tmp_path.iterdir())
    dated = [p for p in tmp_path.glob("*-smoke.json") if p.name != latest.name]
    assert len(dated) == 1
    results = json.loads(latest.read_text())

    meta = results["meta"]
    assert meta["mode"] == "smoke"
    for key in ("date", "command", "machine", "versions", "sizes", "settings", "duration_s"):
        assert key in meta, key
    scenarios = results["scenarios"]
    assert set(scenarios) == set(EXPECTED) | {"peer"}
    for name, keys in EXPECTED.items():
        assert "error" not in scenarios[name], scenarios[name]
        assert keys <= set(scenarios[name]), (name, keys - set(scenarios[name]))
    assert SUMMARY_KEYS <= set(scenarios["overhead"]["agentq"])
    assert SUMMARY_KEYS <= set(scenarios["overhead"]["floor"])
    for level in scenarios["throughput"]["levels"]:
        assert {"clients", "jobs_per_s", "latency", "cpu_ms_per_job"} <= set(level)
    peer = scenarios["peer"]
    assert "error" not in peer, peer
    assert "skipped" in peer or PEER_KEYS <= set(peer), peer
    # --smoke writes no markdown
    assert not docs.exists()
