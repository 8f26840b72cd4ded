"""`python -m benchmarks compare`: the order the two trees run in and what is reported."""
from __future__ import annotations

from benchmarks.compare import order, redis_db, render, summarize, takes_turns


def _round(jobs_per_s, orchestrator, machine):
    return {"jobs_per_s": jobs_per_s, "agentq_cpu_ms_per_job": orchestrator + 5,
            "cpu_ms_per_job": {"web": 3.0, "orchestrator": orchestrator, "tools": 2.0},
            "services_cpu_ms_per_job": {"postgres": 9.0, "redis": 0.5},
            "machine_busy_ms_per_job": machine}


def test_the_trees_take_turns_going_first():
    assert order(3) == [(0, "base"), (0, "here"), (1, "here"), (1, "base"),
                        (2, "base"), (2, "here")]


def test_each_pair_is_compared_within_itself():
    # given two pairs of bursts on a machine that got busier between them (every figure of
    # the second pair 50% higher), "here" 10% cheaper in the orchestrator in each pair
    rounds = {"base": [_round(50, 10.0, 30.0), _round(40, 15.0, 45.0)],
              "here": [_round(55, 9.0, 29.0), _round(44, 13.5, 43.5)]}
    summary = summarize(rounds)
    # then the pairs' ratios show the saving the medians of mixed rounds would blur
    assert summary["orchestrator"]["ratios"] == [0.9, 0.9]
    assert summary["orchestrator"]["ratio_median"] == 0.9
    assert summary["jobs/s"]["ratios"] == [1.1, 1.1]
    assert summary["orchestrator"]["base_median"] == 12.5
    assert summary["orchestrator"]["here_median"] == 11.25
    assert summary["postgres"]["ratio_range"] == [1.0, 1.0]


def test_a_measure_a_round_lacks_is_left_out_not_guessed():
    # given rounds where no job completed (no jobs/s) in one tree
    rounds = {"base": [_round(None, 10.0, 30.0)], "here": [_round(50, 9.0, 29.0)]}
    summary = summarize(rounds)
    assert summary["jobs/s"]["ratio_median"] is None and summary["jobs/s"]["ratios"] == []
    assert "| jobs/s | – | 50 | – |" in render(summary, "abc1234", "def5678")
    assert "| orchestrator | 10 | 9 | 0.900 (0.900–0.900) |" in render(
        summary, "abc1234", "def5678")


def test_the_two_stacks_never_share_a_redis_database():
    assert redis_db("redis://127.0.0.1:6379/12", 0) == "redis://127.0.0.1:6379/12"
    assert redis_db("redis://127.0.0.1:6379/12", 1) == "redis://127.0.0.1:6379/13"


def test_a_base_whose_burst_cannot_take_turns_is_told_apart(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    assert not takes_turns(tmp_path)  # no burst at all
    (tmp_path / "benchmarks" / "burst.py").write_text("for r in range(args.rounds): ...")
    assert not takes_turns(tmp_path)
    (tmp_path / "benchmarks" / "burst.py").write_text("if args.paced: ...")
    assert takes_turns(tmp_path)
