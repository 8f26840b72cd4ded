"""A newcomer never waits in silence: after an `agentq run` timed out (its model call never
answered), the next run in the same directory and channel waits behind that job. It says
so at once, naming the job and the command that cancels it; at its own timeout it says it
never started (not "still running"); `agentq jobs cancel` works in the embedded mode (no
API running) and frees the conversation, so the run after it answers."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agentq.testing.scripted_llm import text
from tests.support.cli_run import agentq_run, finish
from tests.support.stack import ROOT

pytestmark = pytest.mark.integration
JOB_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def agentq(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENTQ_", "OPENAI_", "PROMETHEUS_"))}
    env["AGENTQ_HOME"] = str(home)
    return subprocess.run([str(Path(sys.executable).with_name("agentq")), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_run_behind_a_stuck_job_names_it_and_jobs_cancel_frees_the_channel(llm, script,
                                                                             tmp_path):
    # given a run whose model call never answers: it times out
    answer = threading.Event()
    stuck_marker = llm.script(f"stuck_{tmp_path.name}", [text("late", hold=answer)])
    try:
        code, _out, err = finish(agentq_run(tmp_path, stuck_marker, llm, "--timeout", "2"))
        assert code == 7, err
        last = err.strip().splitlines()[-1]
        stuck = re.search(JOB_ID, last).group(0)
        assert f"`agentq jobs cancel {stuck}` cancels it" in last, last

        # the next run in that directory and channel waits behind it, and says so
        code, _out, err = finish(agentq_run(tmp_path, stuck_marker, llm, "--timeout", "3"))
        assert code == 7, err
        lines = err.strip().splitlines()
        told = [line for line in lines if line.startswith("· waits behind job")]
        assert told and stuck in told[0] and f"`agentq jobs cancel {stuck}`" in told[0], err
        assert "did not start within 3 s" in lines[-1] and stuck in lines[-1], lines[-1]
        assert "still running" not in err
        waiting = re.search(rf"job ({JOB_ID}) did not start", lines[-1]).group(1)

        # the stuck job is cancelled with no API running: at once
        cancelled = agentq(tmp_path, "jobs", "cancel", stuck)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == f"job {stuck} cancelled"
    finally:
        answer.set()

    # the job that waited behind it starts when agentq next runs there, then this run's
    marker = script([text("the waiting job's answer"), text("The calculator returned: 42.")])
    code, out, err = finish(agentq_run(tmp_path, marker, llm, "--timeout", "120"))
    assert code == 0, err
    assert out.strip() == "The calculator returned: 42."
    assert f"waits behind job {waiting}" in err  # it said so while it waited
    listed = agentq(tmp_path, "jobs", "list").stdout
    assert re.search(rf"{stuck}\s+cancelled", listed) and re.search(rf"{waiting}\s+completed",
                                                                    listed), listed


def test_cancelling_an_unknown_job_says_so_in_one_line(tmp_path):
    assert agentq(tmp_path, "db", "upgrade").returncode == 0
    missing = "00000000-0000-0000-0000-000000000001"
    result = agentq(tmp_path, "jobs", "cancel", missing)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith(f"Error: no job {missing}"), result.stderr
