"""benchmarks/faults.py: the fault and scale-out labs run the code sandbox as this machine
allows, whether started by pytest (whose conftest sets AGENTQ_SANDBOX_CGROUP) or by
`python -m benchmarks` (which did not, and on a hybrid cgroup v1 host every code call of the
mix failed before its tool ran: 4 of the scale-out run's node-kill calls, 2026-11-28)."""
from __future__ import annotations

from agentq.tools import cgroups
from benchmarks import faults


def test_code_runs_under_cgroup_limits_where_the_machine_delegates_them(monkeypatch):
    monkeypatch.setattr(cgroups, "check", lambda: None)
    assert faults.sandbox_cgroup_mode() == "required"


def test_code_runs_with_the_weaker_limits_on_a_host_that_cannot(monkeypatch):
    monkeypatch.setattr(cgroups, "check", lambda: "the cgroup v2 group has no memory controller")
    assert faults.sandbox_cgroup_mode() == "off"
