"""`python -m benchmarks run`'s options that size scenario 3 (in flight) and the stack's
orchestrators, and what the in-flight scenario reports of them."""
from __future__ import annotations

import pytest

from benchmarks.__main__ import parse


def test_the_in_flight_models_latency_can_be_set():
    args = parse(["run", "--only", "inflight", "--inflight-jobs", "3000",
                  "--inflight-latency", "1.5"])
    assert (args.inflight_jobs, args.inflight_latency) == (3000, 1.5)
    assert parse(["run"]).inflight_latency is None  # the scenario's own 10 s


@pytest.mark.parametrize(("option", "value"), [
    ("--inflight-latency", "-1"), ("--inflight-latency", "x"), ("--inflight-latency", "nan"),
    ("--orchestrators", "0"), ("--orchestrators", "-2"), ("--orchestrators", "two")])
def test_a_value_the_option_cannot_take_is_refused_by_name(option, value, capsys):
    with pytest.raises(SystemExit) as exited:
        parse(["run", option, value])
    assert exited.value.code == 2
    assert option in capsys.readouterr().err


def test_the_stack_can_run_more_than_one_orchestrator():
    assert parse(["run", "--orchestrators", "2"]).orchestrators == 2
    assert parse(["run"]).orchestrators is None  # the lab's one


def test_each_further_orchestrator_consumes_the_same_queue_under_a_name_of_its_own(tmp_path):
    from benchmarks.harness import BenchStack
    stack = BenchStack("postgresql://x/y", "http://127.0.0.1:1/v1", tmp_path,
                       {"AGENTQ_BROKER_URL": "redis://127.0.0.1:1/0"}, orchestrators=3)
    commands = stack.commands()
    assert stack.orchestrators == ["orchestrator", "orchestrator-2", "orchestrator-3"]
    assert commands["orchestrator"][-2:] == ["worker", "orchestrator"]
    for name in ("orchestrator-2", "orchestrator-3"):
        assert commands[name][-4:] == ["worker", "orchestrator", "-n", f"{name}@%h"]
        assert name in stack.workers  # the stack waits for it to be ready
    assert "tools" in commands and "web" in commands


def test_the_lab_refuses_no_orchestrator(tmp_path, monkeypatch):
    from benchmarks import harness
    monkeypatch.setenv(harness.ORCHESTRATORS_ENV, "0")
    with pytest.raises(ValueError, match=harness.ORCHESTRATORS_ENV):
        harness.Lab(tmp_path)
    monkeypatch.setenv(harness.ORCHESTRATORS_ENV, "2")
    assert harness.Lab(tmp_path).orchestrators == 2


def test_the_submit_timeline_shows_a_stall_as_an_empty_bucket():
    from benchmarks.scenarios import submit_timeline
    assert submit_timeline([]) == []
    assert submit_timeline([0.1, 1.0, 4.9, 5.0, 17.2], bucket_s=5.0) == [
        [0.0, 3], [5.0, 1], [10.0, 0], [15.0, 1]]


def test_the_in_flight_report_sums_the_orchestrators_and_shows_each_ones_memory():
    from benchmarks.report import _in_flight_cpu, _in_flight_rss
    cpu = {"web": 6.9, "orchestrator": 13.7, "orchestrator-2": 13.6, "tools": 5.5,
           "model_server": 1.2, "bench_client": 3.9}
    assert _in_flight_cpu(cpu) == "6.9 / 27.3 / 5.5 (all agentq's processes: 39.7)"
    one = {"orchestrator_rss_mib": {"before_mib": 95.1, "peak_mib": 519.0}}
    assert _in_flight_rss(one) == "519.0 MiB (before 95.1)"
    two = {**one, "orchestrators_rss_mib": {
        "orchestrator": {"before_mib": 95.1, "peak_mib": 283.6},
        "orchestrator-2": {"before_mib": 95.0, "peak_mib": 280.6}}}
    assert _in_flight_rss(two) == "283.6 + 280.6 MiB (2 processes; before 95.1 + 95.0)"
