"""benchmarks/fair.py's arithmetic and benchmarks/report.py's fair tables, on made-up figures
(the fair run itself: tests/integration/test_benchmarks_smoke.py)."""
from __future__ import annotations

from benchmarks import fair, report


def _phase(jobs_per_s: float, machine: float, statements: float = 10.0) -> dict:
    return {"jobs": 4, "clients": 2, "completed": 4, "failed": 0, "elapsed_s": 1.0,
            "jobs_per_s": jobs_per_s,
            "latency": {"n": 4, "median_ms": 100.0, "p95_ms": 150.0},
            "cpu_ms_per_job": {"machine": machine, "system": machine - 5, "postgres": 4.0,
                               "redis": 1.0, "load_generator": 2.0, "model_server": 1.0},
            "per_job": {"statements": statements, "round_trips": statements + 4,
                        "transactions": 2.0, "rows_inserted": 3.0, "rows_updated": 1.0,
                        "rows_deleted": 0.0, "wal_bytes": 2048.0, "row_versions": 4.0}}


def _system(jobs_per_s: float, machine: float, kind: str = "service") -> dict:
    return {"kind": kind, "burst": _phase(jobs_per_s, machine),
            "closed_loop": _phase(jobs_per_s / 2, machine * 2)}


def test_per_job_divides_the_growth_and_adds_row_versions():
    before = {"statements": 100.0, "round_trips": 150.0, "transactions": 20.0,
              "rows_inserted": 10.0, "rows_updated": 5.0, "rows_deleted": 0.0,
              "wal_bytes": 1000.0}
    after = {"statements": 140.0, "round_trips": 210.0, "transactions": 28.0,
             "rows_inserted": 30.0, "rows_updated": 13.0, "rows_deleted": 0.0,
             "wal_bytes": 9000.0}
    got = fair.per_job(before, after, 4)
    assert got["statements"] == 10.0 and got["round_trips"] == 15.0
    assert got["transactions"] == 2.0 and got["wal_bytes"] == 2000.0
    assert got["row_versions"] == got["rows_inserted"] + got["rows_updated"] == 7.0


def test_ratios_set_agentq_against_the_best_peer_of_each_table():
    systems = {"agentq": _system(10.0, 100.0), "celery-langgraph": _system(20.0, 50.0),
               "dbos-service": _system(5.0, 80.0),
               "langgraph-sync": _system(40.0, 25.0, "library"),
               "dbos": {"error": "StackError: did not start"}}
    r = fair.ratios(systems)
    assert r["burst_jobs_per_s_vs_best_service"] == {"peer": "celery-langgraph", "ratio": 0.5}
    assert r["burst_machine_cpu_vs_best_service"] == {"peer": "celery-langgraph", "ratio": 2.0}
    assert r["closed_loop_jobs_per_s_vs_best_library"] == {"peer": "langgraph-sync",
                                                           "ratio": 0.25}
    assert r["closed_loop_machine_cpu_vs_best_library"]["ratio"] == 4.0
    assert fair.ratios({"agentq": {"error": "x"}}) == {}


def test_the_fair_tables_put_ratios_first_then_services_libraries_and_counts():
    systems = {"agentq": _system(10.0, 100.0), "celery-langgraph": _system(20.0, 50.0),
               "dbos-service": {"error": "StackError: the DBOS worker did not start"},
               "langgraph-sync": _system(40.0, 25.0, "library")}
    text = "\n".join(report.fair_tables({"sizes": vars(fair.SIZES["smoke"]), "poll_s": 0.02,
                                         "systems": systems, "ratios": fair.ratios(systems)}))
    order = [text.index(s) for s in ("| agentq against |", "Services (", "Libraries (",
                                     "| per job |")]
    assert order == sorted(order)
    assert "| round trips (with BEGIN/COMMIT) | 14 | 14 | 14 |" in text
    assert "Flask + DBOS queue worker failed: StackError" in text


def _results(scenarios: dict) -> dict:
    return {"meta": {"mode": "full", "date": "2026-11-26 04:13 UTC", "command": "x",
                     "duration_s": 1.0, "machine": {}, "versions": {"git_commit": "abc1234"}},
            "scenarios": scenarios}


def test_the_page_opens_with_the_ratios_and_counts_before_how_to_run():
    systems = {"agentq": _system(10.0, 100.0), "celery-langgraph": _system(20.0, 50.0)}
    page = report.markdown(_results({"fair": {"sizes": vars(fair.SIZES["full"]),
                                              "systems": systems,
                                              "ratios": fair.ratios(systems)}}), "notes")
    assert page.startswith("# Benchmarks")
    ratios = page.index("## Ratios and per-job counts (full run, 2026-11-26 04:13 UTC, "
                        "git abc1234)")
    assert ratios < page.index("| per job |") < page.index("## Running them") \
        < page.index("## Figures") < page.index("notes")
    assert page.count("| per job |") == 1  # not again among the other figures


def test_a_run_without_the_fair_comparison_says_so_and_gives_the_peer_ratios():
    head = "\n".join(report.headline(_results({"peer": {"ratios_to_best_peer": {
        "seq_median": 3.46, "burst_jobs_per_s": 0.56}}})))
    assert "This run has no fair comparison" in head
    assert "| seq median | ×3.46 |" in head and "| burst jobs per s | ×0.56 |" in head


def test_local_tools_are_their_own_row_beside_agentqs_chord_never_a_peer():
    systems = {"agentq": _system(10.0, 100.0), "agentq-local": _system(15.0, 60.0),
               "celery-langgraph": _system(20.0, 50.0)}
    systems["agentq-local"]["burst"]["per_job"]["round_trips"] = 7.0
    systems["agentq"]["burst"]["per_job"]["redis_commands"] = 40.0
    systems["agentq-local"]["burst"]["per_job"]["redis_commands"] = 10.0
    # the headline ratios are the chord's, against the peers only
    r = fair.ratios(systems)
    assert r["burst_jobs_per_s_vs_best_service"] == {"peer": "celery-langgraph", "ratio": 0.5}
    # local ÷ chord, phase by phase
    lvc = fair.local_vs_chord(systems)
    assert lvc["burst_jobs_per_s"] == 1.5 and lvc["burst_machine_cpu"] == 0.6
    assert lvc["burst_round_trips"] == 0.5 and lvc["closed_loop_jobs_per_s"] == 1.5
    assert lvc["burst_redis_commands"] == 0.25
    assert lvc["closed_loop_redis_commands"] is None  # not counted there (an older run)
    assert fair.local_vs_chord({"agentq": systems["agentq"]}) == {}
    text = "\n".join(report.fair_tables({"sizes": vars(fair.SIZES["smoke"]), "poll_s": 0.02,
                                         "systems": systems, "ratios": r,
                                         "local_vs_chord": lvc}))
    assert "Local tools: agentq with `math` local" in text
    assert "| agentq | agentq, `math` local |" in text
    assert "| Postgres round trips per job | ×0.5 | ×1.0 |" in text
    assert "| Redis commands per job | ×0.25 | – |" in text
    # and its counts are in the per-job table, a count a system lacks shown as such
    assert "| round trips (with BEGIN/COMMIT) | 14 | 7 | 14 |" in text
    assert "| Redis commands | 40 | 10 | – |" in text
