"""Per-run cgroup v2 limits for the code sandbox: memory (tmpfs, memfd and kernel memory
included), processes and CPU for the whole run, not per process.

The layout, under the cgroup the worker was started in (its own, `base`; with systemd a
service with `Delegate=yes`, in a container the container's cgroup):

    <base>/                      cgroup.subtree_control: +memory +pids +cpu
    <base>/agentq-worker/        the worker's own processes (moved here at set-up: a cgroup
                                 that hands controllers to its children may hold no
                                 process itself, cgroup v2's no-internal-process rule)
    <base>/agentq-run-<uuid>/    one per run, removed after it: memory.max, memory.swap.max 0,
                                 memory.oom.group 1 (the whole run is killed together),
                                 pids.max, cpu.max (one CPU at most); the run's total CPU
                                 time (cpu.stat usage_usec) is watched against its budget

`setup()` does it once per process (idempotent; concurrent pool processes may race, each
step tolerates the other having done it) and says exactly why when it cannot: no cgroup v2
mounted, a hybrid host whose memory/pids/cpu controllers are bound to cgroup v1, the base
not writable, or controllers the parent does not delegate. The sandbox then refuses to run.
"""
from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from dataclasses import dataclass

CONTROLLERS = ("memory", "pids", "cpu")
LEAF = "agentq-worker"
RUN_PREFIX = "agentq-run-"
CPU_PERIOD_US = 100_000
RUN_CPUS = 1
"""How many CPUs one run may use at once (cpu.max): its CPU budget is then spent at most
this fast, so the watcher's poll overshoots it by at most one poll interval."""
REMOVE_TIMEOUT_S = 5


class CgroupUnavailable(RuntimeError):
    """Per-run cgroup limits cannot be set up here; the message says why."""


@dataclass(frozen=True)
class Hierarchy:
    base: str
    """Our own cgroup's directory: where the runs' cgroups are made."""


_lock = threading.Lock()
_ready: dict[int, Hierarchy] = {}


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The cgroup v2 mount point seen by this process, or None."""
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return left.split(" ")[4].replace("\\040", " ")
    return None


def own_path(proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """This process's cgroup v2 path (the `0::` line), or None."""
    try:
        with open(proc_cgroup) as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def setup(mount: str | None = None, path: str | None = None) -> Hierarchy:
    """Set up this process's delegation (once per process) and return it, or raise
    CgroupUnavailable saying why. `mount`/`path` are for tests (a fake cgroupfs)."""
    pid = os.getpid()
    with _lock:
        if pid in _ready and mount is None:
            return _ready[pid]
        found = _setup(mount or cgroup2_mount(), path if path is not None else own_path())
        if mount is None:
            _ready[pid] = found
        return found


def check() -> str | None:
    """Why per-run groups cannot be set up for this process (None if they can), without
    changing anything."""
    try:
        _base(cgroup2_mount(), own_path())
    except CgroupUnavailable as exc:
        return str(exc)
    return None


def _base(mount: str | None, path: str | None) -> str:
    """Our base group, checked: it offers the controllers and we may write it."""
    if mount is None:
        raise CgroupUnavailable("no cgroup v2 file system is mounted")
    if path is None:
        raise CgroupUnavailable("this process is in no cgroup v2 group (/proc/self/cgroup "
                                "has no 0:: line)")
    here = os.path.normpath(os.path.join(mount, path.lstrip("/")))
    base = os.path.dirname(here) if os.path.basename(here) == LEAF else here
    try:
        available = _read(os.path.join(base, "cgroup.controllers")).split()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {base}/cgroup.controllers: {exc}") from None
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        raise CgroupUnavailable(
            f"the cgroup v2 group {base} has no {'/'.join(missing)} controller (it offers "
            f"{' '.join(available) or 'none'}): on a hybrid host they are bound to cgroup "
            f"v1, or the parent group does not delegate them")
    if not os.access(base, os.W_OK):
        raise CgroupUnavailable(f"the cgroup {base} is not writable by uid {os.getuid()} "
                                f"(delegate it, e.g. systemd's Delegate=yes)")
    return base


def _setup(mount: str | None, path: str | None) -> Hierarchy:
    base = _base(mount, path)
    try:
        enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {base}/cgroup.subtree_control: {exc}") from None
    if all(c in enabled for c in CONTROLLERS):
        return Hierarchy(base)
    leaf = os.path.join(base, LEAF)
    try:
        os.mkdir(leaf)
    except FileExistsError:
        pass
    except OSError as exc:
        raise CgroupUnavailable(f"cannot create {leaf}: {exc}") from None
    want = " ".join("+" + c for c in CONTROLLERS)
    # at the top of the hierarchy (the host's root group, or a container's own) only this
    # process moves: the others are not ours to move (a container's other processes, if
    # any, make the write below fail with EBUSY, and we say so)
    assert mount is not None  # _base refused a missing mount
    only = os.getpid() if os.path.normpath(base) == os.path.normpath(mount) else None
    last: OSError | None = None
    for _ in range(20):
        _move_all(base, leaf, only)
        try:
            _write(os.path.join(base, "cgroup.subtree_control"), want)
            return Hierarchy(base)
        except OSError as exc:
            if exc.errno != errno.EBUSY:  # EBUSY: a process came in meanwhile
                raise CgroupUnavailable(
                    f"cannot enable {want} in {base}/cgroup.subtree_control: {exc}") from None
            last = exc
        time.sleep(0.01)
    raise CgroupUnavailable(f"{base} keeps processes of its own: {last}")


def _move_all(source: str, leaf: str, only: int | None = None) -> None:
    """Every process of `source` into `leaf` (ours and our service's), or only `only`."""
    try:
        pids = _read(os.path.join(source, "cgroup.procs")).split()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {source}/cgroup.procs: {exc}") from None
    if only is not None:
        pids = [str(only)]
    for pid in pids:
        try:
            _write(os.path.join(leaf, "cgroup.procs"), pid)
        except OSError as exc:
            if exc.errno not in (errno.ESRCH, errno.EINVAL):  # gone, or a kernel thread
                raise CgroupUnavailable(f"cannot move pid {pid} to {leaf}: {exc}") from None


def remove_stale(hierarchy: Hierarchy) -> int:
    """Remove the empty runs' groups a worker that died left behind (its runs died with it:
    bwrap dies with its parent). A group still holding processes may be another worker's
    run, in the same base group: it is left alone. Returns how many were removed."""
    removed = 0
    for entry in os.scandir(hierarchy.base):
        if entry.name.startswith(RUN_PREFIX) and entry.is_dir(follow_symlinks=False):
            try:
                os.rmdir(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


class RunGroup:
    """One run's cgroup: made with its limits, the run's processes moved in, its CPU time
    and OOM kills read, and removed (its processes killed) at the end."""

    def __init__(self, hierarchy: Hierarchy, *, memory_bytes: int, max_pids: int) -> None:
        self.path = os.path.join(hierarchy.base, RUN_PREFIX + uuid.uuid4().hex)
        self._oom_at_removal: bool | None = None  # oom_killed() just before remove()
        try:
            os.mkdir(self.path, 0o755)
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create the run's cgroup {self.path}: {exc}") \
                from None
        try:
            self._set("memory.max", str(memory_bytes))
            self._set("memory.swap.max", "0", optional=True)  # no swap accounting: no swap
            self._set("memory.oom.group", "1")
            self._set("pids.max", str(max_pids))
            self._set("cpu.max", f"{RUN_CPUS * CPU_PERIOD_US} {CPU_PERIOD_US}")
        except BaseException:
            self.remove()
            raise

    def _set(self, name: str, value: str, optional: bool = False) -> None:
        try:
            _write(os.path.join(self.path, name), value)
        except FileNotFoundError:
            if not optional:
                raise CgroupUnavailable(f"{self.path} has no {name}") from None
        except OSError as exc:
            raise CgroupUnavailable(f"cannot write {name} of {self.path}: {exc}") from None

    def add(self, pid: int) -> None:
        try:
            _write(os.path.join(self.path, "cgroup.procs"), str(pid))
        except OSError as exc:
            raise CgroupUnavailable(f"cannot move pid {pid} into {self.path}: {exc}") \
                from None

    def cpu_s(self) -> float:
        """CPU time used by every process of the run, living or gone."""
        try:
            for line in _read(os.path.join(self.path, "cpu.stat")).splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return 0.0

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run at memory.max. After remove(), as
        it was just before: rmdir takes memory.events with the group."""
        if self._oom_at_removal is not None:
            return self._oom_at_removal
        try:
            for line in _read(os.path.join(self.path, "memory.events")).splitlines():
                key, _, value = line.partition(" ")
                if key in ("oom_kill", "oom_group_kill") and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def kill(self) -> None:
        """Kill every process of the run (cgroup.kill, Linux 5.14+; else one by one)."""
        try:
            _write(os.path.join(self.path, "cgroup.kill"), "1")
            return
        except OSError:
            pass
        try:
            pids = _read(os.path.join(self.path, "cgroup.procs")).split()
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (OSError, ValueError):
                pass

    def remove(self) -> None:
        """Kill what is left and remove the group (waiting until it is empty). Whether it
        was OOM-killed is kept (oom_killed())."""
        if self._oom_at_removal is None and os.path.isdir(self.path):
            self._oom_at_removal = self.oom_killed()
        give_up = time.monotonic() + REMOVE_TIMEOUT_S
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > give_up:
                    return
            self.kill()
            time.sleep(0.01)
