"""Run untrusted Python in a bubblewrap sandbox, under an unprivileged uid, without network.

`run_python(code, cpu_s=..., memory_mb=..., wall_s=..., max_output_chars=...)` returns
`{"stdout", "stderr", "exit_code", "exit_signal", "timed_out", "cpu_limited",
"memory_limited", "duration_s", "truncated"}`. A timeout or a nonzero exit is a normal result
(the model reads it); a sandbox that cannot be set up raises `SandboxUnavailable` and the
code is NOT run -- there is no unsandboxed fallback. `problem()` says why the sandbox cannot
be set up here (None when it can); `/health/ready` reports it.

The sandbox is bubblewrap (`bwrap`, Debian package `bubblewrap`), run without setuid:
  * when the worker is root, `bwrap` is started as AGENTQ_SANDBOX_UID/GID (default
    65534/65534, nobody/nogroup) with no supplementary groups, so the kernel checks every
    file access as that uid (an unprivileged worker runs it as itself). bwrap then builds
    a user namespace (uid kept), and new pid, network, ipc, uts and cgroup namespaces, and
    forbids nested user namespaces (`--disable-userns`): unshare/setns/mount fail;
  * the file system is a fresh tmpfs root holding only /usr/bin, /usr/lib*, /usr/share
    (read-only: the Python runtime, its shared libraries and standard library; /bin, /lib,
    /lib64 are the usual symlinks into them; not /usr/local, /usr/src), a fresh
    /proc of the sandbox's pid namespace (/proc/cmdline masked), a minimal read-only /dev
    (null, zero, full, random, urandom, a /dev/shm of SHM_SIZE_BYTES; no devpts, so no
    pty), a private /tmp (a tmpfs of TMP_SIZE_BYTES), and the run's own scratch
    directory, the cwd: a tmpfs of SCRATCH_SIZE_BYTES (with the caller's input files bound
    read-only) that ends with the run, or a host directory the caller shares with the run.
    Writing past a tmpfs's size fails with ENOSPC inside the code: a run cannot fill the
    host's memory or disk. No /etc, /run, /var, /root, /home, project or database files,
    no other run's scratch;
  * the network namespace holds only a loopback interface: TCP and UDP reach nothing;
    abstract Unix sockets are per network namespace; no socket file of the host is mounted;
  * inside, a small stdlib-only supervisor (SUPERVISOR, sandbox_scripts) sets the resource limits --
    RLIMIT_CPU (SIGXCPU at cpu_s, SIGKILL a second later), RLIMIT_AS, RLIMIT_FSIZE,
    RLIMIT_NOFILE, RLIMIT_CORE 0 and RLIMIT_NPROC -- forks and execs the user's code in a
    fresh `python -I -S -B`, waits for it and reports on a status pipe how it ended (exit
    code or signal, CPU seconds, an uncaught MemoryError). The kernel counts RLIMIT_NPROC
    per (uid, user namespace), and every run has its own user namespace, so the process cap
    holds per run, for any worker uid, with concurrent runs under the same uid;
  * bwrap's pid 1 reaps, and when bwrap goes (`--die-with-parent`, or killed by us at the
    wall deadline) the pid namespace and every process left in it die with it; when the
    code ends by itself, the supervisor kills what it left running (`kill(-1)`) and waits
    until it is gone before it reports, so no process of a run outlives its answer (bwrap
    outside returns as soon as the supervisor exits, while its pid 1 is still ending the
    namespace);
  * a new session, an empty stdin, an environment of PATH/HOME/TMPDIR/LANG/LC_ALL only;
  * stdout/stderr are read as they come; beyond the cap the bytes are read and discarded,
    so a chatty child cannot fill our memory or block on a full pipe. Output is cut once,
    here, by its length as a JSON string (a control character takes 6 characters there),
    so a caller can size the caps to make its whole result fit its JSON budget.

The second line (issue 30):
  * a seccomp filter (agentq.tools.seccomp, bwrap's --seccomp) denies with EPERM what could
    reach another process (ptrace, pidfd_*, process_vm_*) and the kernel's riskier
    surfaces (io_uring, keyrings, bpf, mounts, new namespaces, ...); no filter, no run;
  * each run gets a cgroup v2 group of its own (agentq.tools.cgroups: memory.max counting
    tmpfs and memfd, pids.max, cpu.max) and the whole run's CPU time is held to its limit;
    bwrap's two processes are moved into it before anything runs inside (--info-fd and
    --block-fd). Without cgroup v2 delegation the code is not run, unless CGROUP_ENV is
    `off` (a hybrid host): then the run's CPU time and private memory are summed from
    outside (sandbox_meter.ProcMeter) and memfd_create is denied;
  * the supervisor and the process that starts bwrap are not dumpable; bwrap inherits only
    its pipes; the status channel takes STATUS_MAX_BYTES, the output OUTPUT_KILL_BYTES,
    and more kills the run.

Why bubblewrap and not the hand-written namespaces we had: it is packaged by every major
distribution, maintained (Flatpak's sandbox), needs no daemon or setuid bit when user
namespaces are allowed, and sets up the minimal root, pid 1 and --disable-userns correctly;
what remains ours is the uid drop, the limits and the reporting.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from typing import Any

from agentq.errors import ToolError
from agentq.tools import cgroups, seccomp
from agentq.tools.sandbox_bwrap import (
    CHILD_PATH,
    Identity,
    SandboxUnavailable,
    binaries,
    bwrap_command,
)
from agentq.tools.sandbox_bwrap import identity as sandbox_identity
from agentq.tools.sandbox_collect import Child, collect
from agentq.tools.sandbox_meter import CgroupMeter, Meter, ProcMeter
from agentq.tools.sandbox_output import Capture, share
from agentq.tools.sandbox_scripts import SUPERVISOR, WRAPPER

log = logging.getLogger(__name__)

FILE_SIZE_LIMIT_BYTES = 16 * 1024 * 1024
OPEN_FILES_LIMIT = 256
MAX_PROCESSES = 64
"""Processes and threads one run may have at once (bwrap's pid 1 and the supervisor count)."""
MAX_CODE_BYTES = 100_000
"""One argv string may hold at most 128 KiB on Linux."""
CPU_KILL_AFTER_S = 1
"""RLIMIT_CPU: SIGXCPU at the limit, SIGKILL this much CPU time later (if it is caught)."""
CPU_ACCOUNTING_SLACK_S = 0.05
PROBE_TIMEOUT_S = 20
PROBE_CACHE_S = 30
CGROUP_ENV = "AGENTQ_SANDBOX_CGROUP"
"""`required` (default): every run in a cgroup v2 group of its own (agentq.tools.cgroups),
and no run where that cannot be set up. `off`: for hosts without cgroup v2 delegation (a
hybrid v1 host): the run's CPU time and private memory are summed from outside and the run
killed past them (polled, so not exact), memfd_create is denied (nothing would count it)."""
RUN_MEMORY_OVERHEAD_BYTES = 64 * 1024 * 1024
"""The run's memory (memory.max, or the summed private memory without cgroups) is the code's
memory_mb plus this: the supervisor's interpreter, bwrap, the run's tmpfs files."""
RUN_CPU_SLACK_S = 0.5
"""The whole run's CPU budget is the code's CPU limit plus this (two interpreters start)."""
START_TIMEOUT_S = 10
"""How long bwrap may take to say its sandbox's pid."""
PR_SET_DUMPABLE = 4


_probe_lock = threading.Lock()
_probing = threading.local()
"""Set while problem() runs its own `print(1)`: the cgroups are checked, not set up (the
probe runs in the API's process, whose cgroup is not ours to rearrange)."""
_probe_cache: tuple[float, str | None] | None = None


def problem() -> str | None:
    """Why the sandbox cannot run code here (None if it can): runs `print(1)` in it.
    Cached for PROBE_CACHE_S."""
    global _probe_cache
    with _probe_lock:
        now = time.monotonic()
        if _probe_cache is not None and now - _probe_cache[0] < PROBE_CACHE_S:
            return _probe_cache[1]
        _probing.active = True
        try:
            result = run_python("print(1)", cpu_s=5, memory_mb=256, wall_s=PROBE_TIMEOUT_S,
                                max_output_chars=100)
            found = None if result["stdout"] == "1\n" else (
                f"the sandbox's test run failed: {result['stderr'][-300:]}")
        except SandboxUnavailable as exc:
            found = str(exc)
        finally:
            _probing.active = False
        _probe_cache = (now, found)
        return found


def run_python(code: str, *, cpu_s: float, memory_mb: int, wall_s: float,
               max_output_chars: int, max_output_total_chars: int | None = None,
               scratch_dir: str | None = None, input_dir: str | None = None) -> dict[str, Any]:
    """Run `code` in the sandbox; see the module docstring for what it may and may not do.

    The code's scratch (its cwd, HOME and TMPDIR) is a fresh tmpfs of SCRATCH_SIZE_BYTES
    that ends with the run, holding the files of `input_dir` (read-only); or, given
    `scratch_dir`, that host directory itself, shared with the caller while the code runs
    (bounded only by the file-size limit: for callers that read it back).

    `max_output_chars` caps each of stdout and stderr by its length as a JSON string
    (marker included); with `max_output_total_chars` the two also share that total, one
    taking what the other leaves. A caller that adds the rest of its result's JSON to these
    knows the whole result's length before the run, so nothing after it cuts again."""
    _check_arguments(code, cpu_s=cpu_s, memory_mb=memory_mb, wall_s=wall_s,
                     max_output_chars=max_output_chars,
                     **({} if max_output_total_chars is None
                        else {"max_output_total_chars": max_output_total_chars}))
    identity = sandbox_identity()
    bwrap, python = binaries()
    if scratch_dir is not None and input_dir is not None:
        raise ValueError("run_python: give scratch_dir or input_dir, not both")
    files: dict[str, str] = {}
    if scratch_dir is None:
        # only inside the sandbox: nothing of it is on the host's disk
        workdir = f"/tmp/agentq-sandbox-{uuid.uuid4().hex}"
        if input_dir is not None:
            input_dir = os.path.realpath(input_dir)
            files = {entry.name: entry.path for entry in os.scandir(input_dir)
                     if entry.is_file(follow_symlinks=False)}
            _hand_over(input_dir, identity)   # bwrap, as the sandbox's uid, binds them
    else:
        workdir = os.path.realpath(scratch_dir)
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        _hand_over(workdir, identity)
    return _run(code, cpu_s=cpu_s, memory_mb=memory_mb, wall_s=wall_s,
                max_output_chars=int(max_output_chars),
                max_output_total_chars=(None if max_output_total_chars is None
                                        else int(max_output_total_chars)),
                workdir=workdir, bind_workdir=scratch_dir is not None, files=files,
                identity=identity, bwrap=bwrap, python=python)


def _hand_over(directory: str, identity: Identity) -> None:
    """Make `directory` the sandbox uid's alone (when we are root and switch to it)."""
    if identity.switch:
        os.chown(directory, identity.uid, identity.gid)
        os.chmod(directory, 0o700)


def _check_arguments(code: str, **limits: float) -> None:
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"run_python: {name} must be a positive number, got {value!r}")
    if not isinstance(code, str):
        raise _not_retryable(ToolError(f"code must be a string, not {type(code).__name__}"))
    if "\x00" in code:
        raise _not_retryable(ToolError("code contains a NUL character"))
    try:
        size = len(code.encode("utf-8"))
    except UnicodeEncodeError:
        raise _not_retryable(ToolError("code is not valid Unicode text "
                                       "(it contains a lone surrogate)")) from None
    if size > MAX_CODE_BYTES:
        raise _not_retryable(ToolError(f"code is {size} bytes; the limit is "
                                       f"{MAX_CODE_BYTES}"))


def _not_retryable(exc: ToolError) -> ToolError:
    exc.retryable = False
    return exc


def _cpu_limit(cpu_s: float) -> int:
    return max(1, math.ceil(cpu_s))


def _rlimits(cpu_s: float, memory_mb: int) -> list[tuple[str, int, int]]:
    cpu_seconds = _cpu_limit(cpu_s)
    memory_bytes = int(memory_mb * 1024 * 1024)
    return [
        ("RLIMIT_CPU", cpu_seconds, cpu_seconds + CPU_KILL_AFTER_S),
        ("RLIMIT_AS", memory_bytes, memory_bytes),
        ("RLIMIT_FSIZE", FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES),
        ("RLIMIT_NOFILE", OPEN_FILES_LIMIT, OPEN_FILES_LIMIT),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NPROC", MAX_PROCESSES, MAX_PROCESSES),
    ]


def _run(code: str, *, cpu_s: float, memory_mb: int, wall_s: float, max_output_chars: int,
         max_output_total_chars: int | None, workdir: str, bind_workdir: bool,
         files: dict[str, str], identity: Identity, bwrap: str, python: str) -> dict[str, Any]:
    hierarchy = _hierarchy()
    try:
        seccomp_fd = seccomp.program_fd(deny_memfd=hierarchy is None)
    except seccomp.SeccompUnavailable as exc:
        raise SandboxUnavailable(f"the sandbox's seccomp filter cannot be loaded: {exc}. "
                                 f"The code was not run.") from None
    ours: list[int] = []
    theirs = [seccomp_fd]
    try:
        _not_dumpable()
        for pair in range(3):  # status, bwrap's info, bwrap's block
            read_end, write_end = os.pipe()
            ours.append(write_end if pair == 2 else read_end)
            theirs.append(read_end if pair == 2 else write_end)
    except BaseException:
        for fd in ours + theirs:
            os.close(fd)
        raise
    (status_r, info_r, block_w), (_, status_w, info_w, block_r) = ours, theirs
    memory_bytes = _run_memory_bytes(memory_mb)
    config = {"status_fd": status_w, "rlimits": _rlimits(cpu_s, memory_mb),
              "wrapper": WRAPPER}
    control = ["--seccomp", str(seccomp_fd), "--info-fd", str(info_w),
               "--block-fd", str(block_r)]
    command = bwrap_command(bwrap, python, workdir, SUPERVISOR, bind_workdir, files, control) + [
        json.dumps(config), code]
    user_args: dict[str, Any] = {}
    if identity.switch:
        user_args = {"user": identity.uid, "group": identity.gid, "extra_groups": []}
    group: cgroups.RunGroup | None = None
    started = time.monotonic()
    try:
        if hierarchy is not None:
            group = cgroups.RunGroup(hierarchy, memory_bytes=memory_bytes,
                                     max_pids=MAX_PROCESSES)
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd="/", env={"PATH": CHILD_PATH}, start_new_session=True, close_fds=True,
            pass_fds=tuple(theirs), **user_args)
    except (OSError, cgroups.CgroupUnavailable) as exc:
        for fd in ours:
            os.close(fd)
        if group is not None:
            group.remove()
        raise SandboxUnavailable(f"the sandbox cannot start: {exc}. The code was not run.") \
            from None
    finally:
        for fd in theirs:
            os.close(fd)
    child = Child(proc)
    reports: list[dict[str, Any]] = []
    try:
        meter = _start(child, group, info_r, block_w, memory_bytes,
                       started + min(wall_s, START_TIMEOUT_S))
        captures, ended = collect(child, status_r, reports, started + wall_s,
                                   max_output_chars, meter,
                                   _cpu_limit(cpu_s) + RUN_CPU_SLACK_S)
    finally:
        for fd in ours:
            with contextlib.suppress(OSError):
                os.close(fd)
        child.kill()
        child.reap()
        child.close()
        if group is not None:
            group.remove()
    timed_out = ended.timed_out
    duration_s = time.monotonic() - started
    if not any(r.get("started") for r in reports) and not timed_out and not ended.killed:
        raise _start_failure(child, captures["stderr"])
    setup_error = next((r["error"] for r in reports if "error" in r), None)
    if setup_error:
        raise SandboxUnavailable(f"the sandbox could not be set up: {setup_error}")
    final = next((r for r in reports if "exit_code" in r), None)
    if final is not None and not timed_out and not ended.killed:
        exit_code = int(final["exit_code"])
    elif timed_out or ended.killed:
        exit_code = -signal.SIGKILL
    else:  # the supervisor was killed (by the code itself): bwrap says 128+signal
        code_ = child.exit_code if child.exit_code is not None else -signal.SIGKILL
        exit_code = -(code_ - 128) if code_ > 128 else code_
    cpu_used = float(final["cpu_s"]) if final else 0.0
    exit_signal = signal.Signals(-exit_code).name if exit_code < 0 and -exit_code in set(
        signal.Signals) else None
    cpu_limited = not timed_out and (
        ended.cpu_limited or exit_code == -signal.SIGXCPU
        or (exit_code == -signal.SIGKILL
            and cpu_used >= _cpu_limit(cpu_s) - CPU_ACCOUNTING_SLACK_S))
    memory_limited = not timed_out and (
        ended.memory_limited or bool(final and final.get("memory_error"))
        or (group is not None and group.oom_killed()))
    budgets = share(captures, max_output_total_chars)
    stdout, stdout_cut = captures["stdout"].text(budgets["stdout"])
    stderr, stderr_cut = captures["stderr"].text(budgets["stderr"])
    log.info("sandbox run finished", extra={
        "uid": identity.uid, "exit_code": exit_code, "timed_out": timed_out,
        "cpu_limited": cpu_limited, "memory_limited": memory_limited,
        "output_limited": ended.output_limited, "status_overflow": ended.status_overflow,
        "duration_ms": round(duration_s * 1000), "cpu_ms": round(cpu_used * 1000),
        "run_cpu_ms": round(ended.run_cpu_s * 1000), "cgroup": group is not None,
        "code_bytes": len(code.encode()), "stdout_bytes": captures["stdout"].total,
        "stderr_bytes": captures["stderr"].total})
    return {"stdout": stdout, "stderr": stderr, "exit_code": exit_code,
            "exit_signal": exit_signal, "timed_out": timed_out, "cpu_limited": cpu_limited,
            "memory_limited": memory_limited, "duration_s": round(duration_s, 3),
            "truncated": stdout_cut or stderr_cut or ended.output_limited}


def prepare() -> None:
    """At a worker's start, before its pool forks: the process made non-dumpable and the
    cgroup delegation set up (its pool processes start in the worker's leaf group). Where
    the sandbox cannot run code here, logs why (each run then refuses, saying so too)."""
    try:
        _not_dumpable()
        hierarchy = _hierarchy()
        seccomp.program(deny_memfd=hierarchy is None)
        if hierarchy is not None:
            cgroups.remove_stale(hierarchy)
    except (SandboxUnavailable, seccomp.SeccompUnavailable) as exc:
        log.error("sandbox unavailable at start", extra={"problem": str(exc)})
        return
    log.info("sandbox ready", extra={
        "cgroup": hierarchy.base if hierarchy is not None else None})


def _hierarchy() -> cgroups.Hierarchy | None:
    """The cgroup v2 delegation the runs' groups are made in; None when CGROUP_ENV is off.
    SandboxUnavailable (the code is not run) when it is required and impossible here."""
    mode = (os.environ.get(CGROUP_ENV) or "required").strip().lower()
    if mode == "off":
        return None
    if mode != "required":
        raise SandboxUnavailable(f"{CGROUP_ENV} must be `required` or `off`, not {mode!r}. "
                                 f"The code was not run.")
    try:
        if getattr(_probing, "active", False):
            why = cgroups.check()
            if why is not None:
                raise cgroups.CgroupUnavailable(why)
            return None
        return cgroups.setup()
    except cgroups.CgroupUnavailable as exc:
        raise SandboxUnavailable(
            f"per-run cgroup limits cannot be set up here: {exc}. The code was not run "
            f"(set {CGROUP_ENV}=off to run with the weaker limits that hold without "
            f"cgroups, see docs/security.md)") from None


def _run_memory_bytes(memory_mb: int) -> int:
    return int(memory_mb * 1024 * 1024) + RUN_MEMORY_OVERHEAD_BYTES


_libc: Any = None


def _not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0) on the process that starts the sandbox: no process of the
    same uid may ptrace it, open its /proc/<pid>/fd or copy its descriptors."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        raise SandboxUnavailable(f"cannot make the worker non-dumpable: {exc}. "
                                 f"The code was not run.") from None


def _start(child: Child, group: cgroups.RunGroup | None, info_fd: int, block_fd: int,
           memory_bytes: int, deadline: float) -> Meter | None:
    """bwrap says its sandbox's pid (--info-fd) and waits (--block-fd) before it starts
    anything in it: both go into the run's cgroup, then it may go on. None if bwrap failed
    before that (its stderr says why)."""
    data = bytearray()
    poller = select.poll()  # not select(): a busy worker's descriptors may pass 1024
    poller.register(info_fd, select.POLLIN)
    while time.monotonic() < deadline and len(data) < 65536:
        if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            break
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        ns_pid = int(json.loads(bytes(data))["child-pid"])
    except (ValueError, KeyError, TypeError):
        child.kill()  # nothing may run in it unless it is counted
        return None
    if group is not None:
        try:
            group.add(child.proc.pid)
            group.add(ns_pid)
        except cgroups.CgroupUnavailable as exc:
            child.kill()
            raise SandboxUnavailable(f"the sandbox cannot be limited: {exc}. "
                                     f"The code was not run.") from None
    with contextlib.suppress(OSError):
        os.write(block_fd, b"1")
    if group is not None:
        return CgroupMeter(group)
    return ProcMeter(ns_pid, memory_bytes)


def _start_failure(child: Child, stderr: Capture) -> SandboxUnavailable:
    detail = bytes(stderr.data).decode("utf-8", "replace").strip()[-500:]
    message = (f"the sandbox could not be set up (bwrap exit {child.exit_code}): "
               f"{detail or 'no message'}. The code was not run.")
    log.error("sandbox unavailable", extra={"problem": message})
    return SandboxUnavailable(message)
