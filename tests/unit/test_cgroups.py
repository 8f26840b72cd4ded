"""agentq.tools.cgroups' run groups on a directory tree laid out as cgroup v2's, where the
kernel's answers matter emulated (tests/security/test_sandbox_cgroup_v2.py runs them on a
real cgroup v2 kernel)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentq.tools import cgroups


@pytest.fixture
def base(tmp_path, monkeypatch) -> Path:
    """A delegated group's directory whose runs' groups rmdir removes as the kernel does:
    with every file in them (a group's counters go with it)."""
    found = tmp_path / "svc"
    found.mkdir()
    real_rmdir = os.rmdir

    def rmdir(path, *args, **kwargs):
        here = Path(path)
        if here.parent == found and here.name.startswith(cgroups.RUN_PREFIX):
            for item in here.iterdir():
                item.unlink()
        real_rmdir(path, *args, **kwargs)
    monkeypatch.setattr(os, "rmdir", rmdir)
    return found


@pytest.mark.parametrize("events, killed", [
    ("low 0\nhigh 0\nmax 18\noom 1\noom_kill 5\noom_group_kill 1\n", True),
    ("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n", False),
])
def test_an_oom_kill_is_known_after_the_runs_group_is_removed(base, events, killed):
    # seen on a real cgroup v2 kernel: the sandbox asks whether the run was OOM-killed
    # after it removed the run's group, whose memory.events rmdir had taken with it, so a
    # run the kernel killed at memory.max (oom_kill 5) was not `memory_limited`
    group = cgroups.RunGroup(cgroups.Hierarchy(str(base)), memory_bytes=320 * 2 ** 20,
                             max_pids=64)
    Path(group.path, "memory.events").write_text(events)
    group.remove()
    assert not os.path.exists(group.path)
    assert group.oom_killed() is killed
