"""Nothing consuming is not a reason to fail (issue 11, cause 2): the orchestrator is down
for many step deadlines (50 s against the lab's 8 s deadline and 2 s sweep; the old sweeper
failed every live job after 3 unconsumed re-drives, about 40 s), then comes back, and every
job completes, once."""
from __future__ import annotations

import os
import signal
import time

import requests

DOWN_S = float(os.environ.get("AGENTQ_FAULT_ORCHESTRATOR_DOWN_S", "30"))


def test_orchestrator_down_for_many_deadlines_then_back(run_fault, fault_lab):
    backlog: list[int] = []

    def down_then_back(lab):
        proc = lab.stack.procs["orchestrator"]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + DOWN_S
        while time.monotonic() < deadline:  # the backlog, as an operator sees it
            ready = requests.get(f"{lab.stack.base}/health/ready", timeout=30).json()
            backlog.append(ready["backlog"]["unclaimed_jobs"] or 0)
            time.sleep(2)
        lab.stack.spawn("orchestrator")

    outcome = run_fault(f"orchestrator_down_{int(DOWN_S)}s", down_then_back)
    assert outcome.statuses == {"completed": outcome.jobs}
    # while nothing consumed, /health/ready showed the re-driven jobs waiting
    assert max(backlog) > 0, backlog
    ready = requests.get(f"{fault_lab.stack.base}/health/ready", timeout=30).json()
    assert ready["backlog"]["unclaimed_jobs"] == 0
