"""An orchestrator paused (SIGSTOP: a VM stalled, a long GC, a process frozen by its
cgroup) with steps in flight for longer than their lease, then resumed (SIGCONT) after
another orchestrator took its jobs over (issue 35). Resumed, it goes on from the middle of
its steps as if nothing happened: every write it then makes must lose to the worker that
took over (a step's writes are a compare-and-set on its owner and lease, agentq/loop/
step.py) rather than overwrite it. run_fault asserts every job completed once, no
duplicate message, tool result, event or token log, and no tool run twice."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

PAUSE_S = float(os.environ.get("AGENTQ_FAULT_PAUSE_S", "25"))
"""three step deadlines of the lab (8 s): the paused steps' leases run out, and the
sweeper re-drives their jobs to the other orchestrator"""


@pytest.fixture
def second_orchestrator(fault_lab):
    """Another orchestrator process, as on a second node, for the time of the test."""
    from tests.support.stack import ROOT, die_with_parent
    stack = fault_lab.stack
    log_path = stack.scratch / "orchestrator-2.log"
    command = [stack.agentq_bin(), "worker", "orchestrator", "-n", "orchestrator-2@%h"]
    with log_path.open("ab") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=stack.env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)
    deadline = time.monotonic() + 90
    while b" ready." not in log_path.read_bytes():
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "the second orchestrator did not start"
        time.sleep(0.2)
    yield proc
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_an_orchestrator_paused_past_its_leases_does_not_write_over_its_successor(
        run_fault, fault_lab, second_orchestrator):
    paused = fault_lab.stack.procs["orchestrator"]
    during: dict[str, int] = {}

    def pause_then_resume(lab):
        os.killpg(paused.pid, signal.SIGSTOP)
        try:
            before = _counts(lab)
            time.sleep(PAUSE_S)
            after = _counts(lab)
            during.update({k: after[k] - before[k] for k in after})
        finally:
            os.killpg(paused.pid, signal.SIGCONT)

    outcome = run_fault(f"orchestrator_paused_{int(PAUSE_S)}s", pause_then_resume)
    print({"while_paused": during})
    assert outcome.statuses == {"completed": outcome.jobs}
    # while it was frozen, steps it held were re-driven (their leases ran out) and the
    # other orchestrator completed jobs: it took over
    assert during["redriven"] > 0 and during["completed"] > 0, during
    # the paused process lived on and went back to work; what it wrote after waking did
    # not double anything (run_fault: no duplicate message, result, event, token log)
    assert paused.poll() is None
    assert outcome.duplicates.get("non_idempotent_tool_runs") == 0, outcome.as_dict()


def _counts(lab) -> dict[str, int]:
    [(completed, redriven)] = lab.sql(
        "SELECT (SELECT COUNT(*) FROM jobs WHERE status = 'completed'), "
        "(SELECT COUNT(*) FROM job_events WHERE type = 'job_redriven')")
    return {"completed": completed, "redriven": redriven}
