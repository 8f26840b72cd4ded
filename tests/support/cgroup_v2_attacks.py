"""Issue 30's whole-run attacks against the sandbox's real per-run cgroup v2 groups, run
inside the cgroup v2 machine (tests/support/cgroup_v2_vm.py) with
AGENTQ_SANDBOX_CGROUP=required: by tests/security/test_sandbox_cgroup_v2.py, which checks
them, or by hand, `python -m tests.support.cgroup_v2_attacks [--pytest [PYTEST ARGS]]`:
boots the machine, runs them and prints the figures docs/security.md quotes; with
`--pytest`, also the sandbox's attack and unit tests (INNER_TESTS) in the machine, which
under QEMU's emulator take long (see docs/security.md). Inside the machine it is
`python -m tests.support.cgroup_v2_attacks --inside OUT.json`.

These are the attacks that `AGENTQ_SANDBOX_CGROUP=off` (this host, a hybrid cgroup v1 one)
only meters from outside: memory written to memfd and tmpfs files (never mapped, so outside
RLIMIT_AS), processes each under RLIMIT_AS, spinning processes each under RLIMIT_CPU, and a
fork bomb. Each runs through the real `run_python` (bwrap, the seccomp filter, the run's own
group); just before the run's group is removed, what the kernel set and counted in it is
read (memory.max/peak/events, pids.max/peak/events, cpu.max/stat): the JSON holds, per
attack, the run's result and those readings.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from tests.support.attacks import (
    FORK_BOMB,
    FOUR_TIMES_200_MIB,
    HOLD_640_MIB,
    SPIN,
    SUPERVISOR_ATTACK,
    SUPERVISOR_ATTACK_REFUSED,
    held_mib,
)

ROOT = Path(__file__).resolve().parents[2]

CPU_S = 300
"""The CPU limit of the memory and process attacks: high enough that what stops them is the
limit they attack, not their CPU. Under QEMU's emulator (where the machine runs here) the
machine's CPU seconds are its vCPU threads' wall time: two interpreters' start cost 3 CPU-s
on a quiet host and 21 at load 27, and the 640 MiB attack 62 before its OOM kill."""
SPIN_CPU_S = 20
"""The spinners' CPU limit: RLIMIT_CPU per process would let nine of them use 180 CPU-s."""
WALL_S = 1200

GROUP_FILES = ("memory.max", "memory.peak", "memory.swap.max", "memory.oom.group",
               "pids.max", "pids.peak", "cpu.max")
GROUP_COUNTERS = ("memory.events", "pids.events", "cpu.stat")


def read_group(path: str) -> dict:
    """What the kernel has set and counted in a run's group (a file the kernel lacks is
    left out: pids.peak is Linux 6.13+)."""
    found: dict = {"path": path}
    for name in GROUP_FILES:
        try:
            found[name] = Path(path, name).read_text().strip()
        except OSError:
            pass
    for name in GROUP_COUNTERS:
        try:
            found[name] = {k: int(v) for k, v in (line.split() for line in
                                                   Path(path, name).read_text().splitlines())}
        except OSError:
            pass
    return found


def main(out: str) -> None:
    os.environ["AGENTQ_SANDBOX_CGROUP"] = "required"
    from agentq.tools import cgroups, sandbox

    groups: dict[str, dict] = {}
    real_remove = cgroups.RunGroup.remove

    def remove(self):
        if self.path not in groups and os.path.isdir(self.path):
            groups[self.path] = read_group(self.path)
        real_remove(self)
    cgroups.RunGroup.remove = remove  # type: ignore[method-assign]

    hierarchy = cgroups.setup()
    report: dict = {"kernel": os.uname().release, "base": hierarchy.base,
                    "own_cgroup": Path("/proc/self/cgroup").read_text().strip(),
                    "base_subtree_control": Path(hierarchy.base,
                                                 "cgroup.subtree_control").read_text().split(),
                    "attacks": {}}

    def attack(name: str, code: str, **limits) -> dict:
        before = set(groups)
        limits = {"cpu_s": CPU_S, "memory_mb": 256, "wall_s": WALL_S,
                  "max_output_chars": 4000, **limits}
        result = sandbox.run_python(code, **limits)
        made = [groups[p] for p in groups if p not in before]
        entry = {"limits": {k: v for k, v in limits.items() if k != "scratch_dir"},
                 "result": result, "group": made[0] if len(made) == 1 else made}
        report["attacks"][name] = entry
        print(name, json.dumps({k: result[k] for k in ("exit_code", "exit_signal",
                                                       "cpu_limited", "memory_limited",
                                                       "timed_out")}), flush=True)
        return entry

    attack("print_1", "print(1)")
    entry = attack("hold_640_mib", HOLD_640_MIB, memory_mb=256)
    entry["held_mib"] = held_mib(entry["result"]["stdout"])

    attack("four_times_200_mib", FOUR_TIMES_200_MIB, memory_mb=256)

    scratch = Path(tempfile.mkdtemp(prefix="agentq-test-scratch-"))
    try:
        entry = attack("spinners", SPIN, cpu_s=SPIN_CPU_S, scratch_dir=str(scratch))
        entry["spinners_cpu_s"] = round(sum(
            float(p.read_text().split()[0]) for p in scratch.glob("cpu-*")
            if p.read_text().strip()), 3)
        entry["budget_s"] = sandbox._cpu_limit(SPIN_CPU_S) + sandbox.RUN_CPU_SLACK_S
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    attack("fork_bomb", FORK_BOMB)
    # the same bomb with the per-user-namespace process cap (RLIMIT_NPROC) lifted: what
    # stops it then is the group's pids.max alone
    real_rlimits = sandbox._rlimits

    def without_nproc(cpu_s, memory_mb):
        return [(name, soft, hard) if name != "RLIMIT_NPROC" else (name, 4096, 4096)
                for name, soft, hard in real_rlimits(cpu_s, memory_mb)]
    sandbox._rlimits = without_nproc  # type: ignore[assignment]
    try:
        attack("fork_bomb_pids_max_alone", FORK_BOMB)
    finally:
        sandbox._rlimits = real_rlimits  # type: ignore[assignment]

    # the second line's other half, with memfd allowed (the memory cgroup counts it): the
    # code's supervisor is out of its reach
    entry = attack("supervisor", SUPERVISOR_ATTACK)
    entry["refused"] = dict(line.split(" ", 1)
                            for line in entry["result"]["stdout"].splitlines()) \
        == SUPERVISOR_ATTACK_REFUSED

    report["left_behind"] = sorted(e.name for e in os.scandir(hierarchy.base)
                                   if e.name.startswith(cgroups.RUN_PREFIX))
    Path(out).write_text(json.dumps(report, indent=1))


def script(*commands: str) -> str:
    """The machine's script: the environment, this checkout as the cwd, then `commands`."""
    from tests.support import cgroup_v2_vm
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "AGENTQ_SANDBOX_CGROUP": "required"}
    return (cgroup_v2_vm.shell_env(env) + f"cd {ROOT}\n"
            f"{sys.executable} -m tests.support.cgroup_v2_attacks --inside "
            f"{cgroup_v2_vm.SHARE_IN_VM}/attacks.json > {cgroup_v2_vm.SHARE_IN_VM}/attacks.log "
            f"2>&1\necho $? > {cgroup_v2_vm.SHARE_IN_VM}/attacks.exit\n"
            + "".join(command + "\n" for command in commands))


def table(report: dict) -> str:
    """The figures, as a Markdown table: each attack's limits, what the run's group reached
    and how the run ended."""
    rows = ["| Attack | Limits (run_python; the run's group) | Reached (the group's "
            "counters) | Ended |", "|---|---|---|---|"]
    for name, entry in report["attacks"].items():
        group, result, limits = entry["group"], entry["result"], entry["limits"]
        mib = int(group["memory.max"]) // 2 ** 20
        quota, period = group["cpu.max"].split()
        cpu = group["cpu.stat"]
        reached = [f"memory.peak {int(group['memory.peak']) / 2 ** 20:.0f} MiB",
                   f"pids.peak {group.get('pids.peak', '?')}",
                   f"CPU {cpu['usage_usec'] / 1e6:.2f} s (throttled {cpu['nr_throttled']} of "
                   f"{cpu['nr_periods']} periods)"]
        events = {k: v for k, v in group["memory.events"].items() if v and k != "max"}
        if events:
            reached.append("memory.events " + ", ".join(f"{k} {v}" for k, v in events.items()))
        if group["pids.events"].get("max"):
            reached.append(f"pids.events max {group['pids.events']['max']}")
        if "held_mib" in entry:
            reached.append(f"the code said it held {entry['held_mib']} MiB")
        if "spinners_cpu_s" in entry:
            reached.append(f"the spinners' own count {entry['spinners_cpu_s']:.2f} CPU-s "
                           f"(budget {entry['budget_s']} s)")
        if name.startswith("fork_bomb"):
            reached.append(f"forks made before {result['stdout'].split()[-1]}: "
                           f"{result['stdout'].split()[0]}")
        ended = ", ".join(k for k in ("cpu_limited", "memory_limited", "timed_out")
                          if result[k]) or "ran to its end"
        ended = f"exit {result['exit_code']} ({result['exit_signal'] or 'its own'}); {ended}"
        rows.append(f"| {name} | cpu_s {limits['cpu_s']}, memory_mb {limits['memory_mb']}; "
                    f"memory.max {mib} MiB, pids.max {group['pids.max']}, cpu.max "
                    f"{int(quota) / int(period):g} CPU | {'; '.join(reached)} | {ended} |")
    return "\n".join(rows)


INNER_TESTS = ("tests/security/test_sandbox_attacks.py", "tests/unit/test_sandbox.py")
NEEDS_THE_MACHINES_SERVICES = (
    "test_postgres_unix_socket_is_not_reachable",
    "test_tcp_to_the_machines_services_is_not_reachable",
    "test_postgres_cannot_be_written_over_any_socket",
)
"""The attack tests that need this host's own Postgres and Redis, which the machine runs
neither of; what they test (the network namespace) is the same with cgroups or without."""


def pytest_commands(pytest_args: list[str]) -> list[str]:
    """The machine's commands that run the sandbox's tests (INNER_TESTS, or `pytest_args`)
    into pytest.log, pytest.exit."""
    from tests.support import cgroup_v2_vm
    share = cgroup_v2_vm.SHARE_IN_VM
    deselect = " or ".join(NEEDS_THE_MACHINES_SERVICES)
    args = " ".join(shlex.quote(a) for a in pytest_args) or (
        f"-k 'not ({deselect})' {' '.join(INNER_TESTS)}")
    return ["export AGENTQ_TEST_SERVERS_ERROR='the cgroup v2 machine runs no Postgres or "
            "Redis'",
            f"{sys.executable} -m pytest -p no:cacheprovider --no-cov -n 0 -q -rfE "
            f"{args} > {share}/pytest.log 2>&1",
            f"echo $? > {share}/pytest.exit"]


def boot(argv: list[str]) -> int:
    """Boot the machine, run the attacks (and with `--pytest [ARGS]`, the sandbox's tests)
    and print the figures; 0 if all ran."""
    from tests.support import cgroup_v2_vm
    with_pytest = argv[:1] == ["--pytest"]
    commands = pytest_commands(argv[1:]) if with_pytest else []
    result = cgroup_v2_vm.run(script(*commands), timeout_s=3600)
    try:
        log = (result.share / "attacks.log").read_text(errors="replace")
        if (result.share / "attacks.exit").read_text().strip() != "0":
            print(f"the attacks did not run to their end:\n{log[-3000:]}")
            return 1
        report = json.loads((result.share / "attacks.json").read_text())
        print(f"kernel {report['kernel']}, the worker in {report['own_cgroup']}, "
              f"runs' groups under {report['base']} "
              f"({' '.join(report['base_subtree_control'])})")
        print(table(report))
        if with_pytest:
            print((result.share / "pytest.log").read_text(errors="replace"))
            return int((result.share / "pytest.exit").read_text())
    finally:
        shutil.rmtree(result.share, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        main(sys.argv[2])
    else:
        sys.exit(boot(sys.argv[1:]))
