"""`python -m benchmarks run`'s options that size scenario 3 (in flight)."""
from __future__ import annotations

import pytest

from benchmarks.__main__ import parse


def test_the_in_flight_models_latency_can_be_set():
    args = parse(["run", "--only", "inflight", "--inflight-jobs", "3000",
                  "--inflight-latency", "1.5"])
    assert (args.inflight_jobs, args.inflight_latency) == (3000, 1.5)
    assert parse(["run"]).inflight_latency is None  # the scenario's own 10 s


@pytest.mark.parametrize("value", ["-1", "x", "nan"])
def test_a_latency_that_is_no_duration_is_refused_by_name(value, capsys):
    with pytest.raises(SystemExit) as exited:
        parse(["run", "--inflight-latency", value])
    assert exited.value.code == 2
    assert "--inflight-latency" in capsys.readouterr().err
