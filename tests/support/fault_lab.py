"""The fault suite's lab as tests use it: its size and time settings (read from the
environment, described in tests/faults/conftest.py), a lab started for a fixture, a runner
that asserts the promise of a scenario, and a server restarted under load."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.stack import StackError

JOBS = int(os.environ.get("AGENTQ_FAULT_JOBS", "100"))
RATE = float(os.environ.get("AGENTQ_FAULT_RATE", "20"))
STORM_S = float(os.environ.get("AGENTQ_FAULT_STORM_S", "20"))
DRAIN_TIMEOUT_S = float(os.environ.get("AGENTQ_FAULT_DRAIN_TIMEOUT_S", "240"))
BROKER = os.environ.get("AGENTQ_FAULT_BROKER", "redis")
"""The shared lab's broker: its private Redis, or (amqp) a private RabbitMQ node;
test_rabbitmq_restart.py makes a lab of its own on RabbitMQ either way."""
TEST_TIMEOUT_S = int(2 * DRAIN_TIMEOUT_S + 120)
"""above the longest a scenario waits (its fault, then its drain) plus the lab's start"""


def started_lab(broker: str, nodes: int = 0):
    """A fault lab on `broker` (with `nodes` nodes in network namespaces of their own) in a
    scratch directory of its own, for a fixture to yield; stopped after, its directory
    removed (kept with AGENTQ_FAULT_KEEP: the processes' logs, for a failed run)."""
    from benchmarks.faults import FaultLab
    scratch = Path(tempfile.mkdtemp(prefix=f"agentq-faults-{broker}-"))
    lab = FaultLab(scratch, broker=broker, nodes=nodes)
    try:
        lab.start()
    except StackError as exc:
        lab.stop()
        pytest.fail(str(exc))
    try:
        yield lab
    finally:
        lab.stop()
    if os.environ.get("AGENTQ_FAULT_KEEP"):
        print(f"fault lab kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)


def make_runner(lab):
    """run(name, fault): one scenario on `lab`; asserts the promise; returns the outcome."""
    from benchmarks.faults import run_scenario

    def run(name, fault, jobs=JOBS, rate=RATE):
        outcome = run_scenario(lab, name, fault, jobs, rate, DRAIN_TIMEOUT_S)
        print(outcome.as_dict())
        dead = {n: lab.log_tail(n) for n, up in lab.alive().items() if not up}
        assert not dead, f"processes died: {dead}"
        assert outcome.not_submitted == 0, outcome.as_dict()
        assert outcome.api_500 == 0, outcome.as_dict()
        assert not any(outcome.duplicates.values()), outcome.as_dict()
        assert outcome.completed == jobs, outcome.as_dict()
        assert not outcome.webhook_problems(), outcome.as_dict()
        return outcome
    return run


def restarted_under_load(run, lab, name: str, server: str, times: int, down_s: float,
                         pause_s: float):
    """Scenario `name` on `lab` with its `server` (`redis`, `rabbit`) restarted `times`
    times while the jobs flow (down `down_s` each, `pause_s` between): every job completes,
    the server really went away each time (a new process), and the same worker processes
    carried on (none died and was replaced). Returns the outcome."""
    pids = [getattr(lab, server).proc.pid]  # the one before, then one per restart

    def restarts(lab):
        for _ in range(times):
            getattr(lab, server).restart(down_s=down_s)
            pids.append(getattr(lab, server).proc.pid)
            time.sleep(pause_s)
    workers = {n: p.pid for n, p in lab.stack.procs.items()}
    outcome = run(name, restarts)
    assert outcome.statuses == {"completed": outcome.jobs}
    assert len(set(pids)) == times + 1, pids
    assert {n: p.pid for n, p in lab.stack.procs.items()} == workers
    return outcome
