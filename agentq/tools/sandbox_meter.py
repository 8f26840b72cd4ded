"""A sandboxed run's CPU time and memory, measured while it runs (`agentq.tools.sandbox`):
from its cgroup v2 group when it has one (the kernel caps its memory), or, without cgroups
(AGENTQ_SANDBOX_CGROUP=off), summed from outside over its processes through the sandbox's
own /proc."""
from __future__ import annotations

import os
from dataclasses import dataclass

from agentq.tools import cgroups


class Meter:
    def sample(self) -> tuple[float, bool]:
        """(CPU seconds the whole run used so far, whether it is over its memory)."""
        raise NotImplementedError


@dataclass
class CgroupMeter(Meter):
    """The kernel counts and caps the run's memory; its CPU time is cpu.stat's."""
    group: cgroups.RunGroup

    def sample(self) -> tuple[float, bool]:
        return self.group.cpu_s(), False


@dataclass
class ProcMeter(Meter):
    """Without cgroups (CGROUP_ENV=off): the run's CPU time and private memory summed over
    its processes from outside, through the sandbox's own /proc (its pid namespace). CPU:
    each process's user+system time plus what it reaped (cutime/cstime: the code, orphans
    reaped by pid 1). Memory: resident minus file-backed and shared memory pages (the
    interpreter's libraries are not counted per process), summed; only when that sum is
    over the limit is it measured exactly (each process's anonymous PSS, smaps_rollup: the
    pages a fork still shares with its parent counted once), which is slower."""
    ns_pid: int
    memory_bytes: int
    cpu_max: float = 0.0
    over_before: bool = False
    ready: bool = False
    """Whether the sandbox's /proc is mounted yet (bwrap sets it up after saying its pid):
    before, /proc/<pid>/root/proc may be the host's."""

    def sample(self) -> tuple[float, bool]:
        root = f"/proc/{self.ns_pid}/root/proc"
        cpu_ticks = 0
        try:
            if not self.ready:
                self.ready = (os.readlink(f"{root}/1/ns/pid")
                              == os.readlink(f"/proc/{self.ns_pid}/ns/pid"))
                if not self.ready:
                    return self.cpu_max, False
            names = os.listdir(root)
        except OSError:
            return self.cpu_max, False
        private: dict[str, int] = {}
        for name in names:
            if not name.isdigit():
                continue
            try:
                with open(f"{root}/{name}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                with open(f"{root}/{name}/statm", "rb") as f:
                    statm = f.read().split()
            except OSError:
                continue  # gone meanwhile: its time is in its reaper's cutime
            cpu_ticks += sum(int(v) for v in fields[11:15])
            if not int(fields[6]) & PF_EXITING:  # its memory is being given back
                private[name] = max(0, int(statm[1]) - int(statm[2])) * PAGE_SIZE
        self.cpu_max = max(self.cpu_max, cpu_ticks / CLOCK_TICKS)
        over = sum(private.values()) > self.memory_bytes
        if over:  # an upper bound: a fork's pages shared with its parent count twice there
            over = sum(anon_pss(root, name, bound)
                       for name, bound in private.items()) > self.memory_bytes
        # the processes are read one after another, not at one instant (a fork or an exit
        # between two reads skews the shares): over twice in a row, 50 ms apart, it is
        self.over_before, over = over, over and self.over_before
        return self.cpu_max, over


def anon_pss(root: str, pid: str, bound: int) -> int:
    """A process's anonymous memory, each page shared by n processes counted 1/n (PSS);
    `bound` (its resident private pages) where smaps_rollup cannot be read."""
    try:
        with open(f"{root}/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss_Anon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return bound


PF_EXITING = 0x4
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
