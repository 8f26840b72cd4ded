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
  * inside, a small stdlib-only supervisor (SUPERVISOR, below) sets the resource limits --
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
    outside (_ProcMeter) and memfd_create is denied;
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
import selectors
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from agentq.errors import ToolError
from agentq.tools import cgroups, seccomp

log = logging.getLogger(__name__)

UID_ENV, GID_ENV = "AGENTQ_SANDBOX_UID", "AGENTQ_SANDBOX_GID"
"""The host uid/gid the code runs as when the worker is root (default 65534, nobody)."""
BWRAP_ENV = "AGENTQ_SANDBOX_BWRAP"
"""The bubblewrap binary (default: `bwrap` on PATH)."""
PYTHON_ENV = "AGENTQ_SANDBOX_PYTHON"
"""The interpreter the code runs with; it must live under /usr (default /usr/bin/python3)."""
DEFAULT_UID = DEFAULT_GID = 65534
DEFAULT_PYTHON = "/usr/bin/python3"
FILE_SIZE_LIMIT_BYTES = 16 * 1024 * 1024
SCRATCH_SIZE_BYTES = 64 * 1024 * 1024
"""The run's own scratch (a tmpfs in the sandbox, unless the caller binds a directory of its
own): writing past it fails with ENOSPC inside the code. tmpfs lives in memory, outside the
code's RLIMIT_AS, so it is bounded here."""
TMP_SIZE_BYTES = 16 * 1024 * 1024
"""The private /tmp (a tmpfs): writing past it fails with ENOSPC."""
OPEN_FILES_LIMIT = 256
MAX_PROCESSES = 64
"""Processes and threads one run may have at once (bwrap's pid 1 and the supervisor count)."""
MAX_CODE_BYTES = 100_000
"""One argv string may hold at most 128 KiB on Linux."""
CPU_KILL_AFTER_S = 1
"""RLIMIT_CPU: SIGXCPU at the limit, SIGKILL this much CPU time later (if it is caught)."""
READ_CHUNK_BYTES = 65536
POLL_INTERVAL_S = 0.05
DRAIN_GRACE_S = 0.5
"""After the sandbox is gone, how long to wait for pipes (nothing should still hold them)."""
REAP_TIMEOUT_S = 5
CPU_ACCOUNTING_SLACK_S = 0.05
PROBE_TIMEOUT_S = 20
PROBE_CACHE_S = 30
CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"
CGROUP_ENV = "AGENTQ_SANDBOX_CGROUP"
"""`required` (default): every run in a cgroup v2 group of its own (agentq.tools.cgroups),
and no run where that cannot be set up. `off`: for hosts without cgroup v2 delegation (a
hybrid v1 host): the run's CPU time and private memory are summed from outside and the run
killed past them (polled, so not exact), memfd_create is denied (nothing would count it)."""
STATUS_MAX_BYTES = 4096
"""The supervisor writes two short lines; more on the status channel is not it: the run is
killed and what came is ignored."""
OUTPUT_KILL_BYTES = 64 * 1024 * 1024
"""stdout and stderr together: past this the run is killed (its answer keeps the start)."""
RUN_MEMORY_OVERHEAD_BYTES = 64 * 1024 * 1024
"""The run's memory (memory.max, or the summed private memory without cgroups) is the code's
memory_mb plus this: the supervisor's interpreter, bwrap, the run's tmpfs files."""
RUN_CPU_SLACK_S = 0.5
"""The whole run's CPU budget is the code's CPU limit plus this (two interpreters start)."""
METER_INTERVAL_S = 0.05
START_TIMEOUT_S = 10
"""How long bwrap may take to say its sandbox's pid."""
PR_SET_DUMPABLE = 4


class SandboxUnavailable(ToolError):
    """The sandbox cannot be set up here; the code was not run."""
    code = "sandbox_unavailable"
    retryable = False


# Runs inside the sandbox (stdlib only; argv: config JSON, user code). Reports
# {"started": true} on the status fd, applies the limits, runs the user's code in a fresh
# interpreter and reports {"exit_code", "cpu_s", "memory_error"}; then exits the same way.
SUPERVISOR = r'''
import json, os, resource, signal, sys, time
cfg = json.loads(sys.argv[1])
status = cfg["status_fd"]
def report(**fields):
    try:
        os.write(status, json.dumps(fields).encode() + b"\n")
    except OSError:
        pass
report(started=True)
import ctypes
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
    report(error=f"prctl(PR_SET_DUMPABLE): {os.strerror(ctypes.get_errno())}")
    os._exit(1)
try:
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
except (OSError, ValueError) as exc:
    report(error=f"cannot apply the limits: {exc}")
    os._exit(1)
mem_r, mem_w = os.pipe()
try:
    pid = os.fork()
except OSError as exc:
    report(error=f"fork: {exc}")
    os._exit(1)
if pid == 0:
    os.close(status)
    os.close(mem_r)
    os.set_inheritable(mem_w, True)
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "-c", cfg["wrapper"],
                                  str(mem_w), sys.argv[2]])
    except OSError as exc:
        os.write(2, f"sandbox: cannot start python: {exc}\n".encode())
        os._exit(127)
os.close(mem_w)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.dup2(null, 2)
_, st, usage = os.wait4(pid, 0)
def end_the_rest(give_up_s=5.0):
    # What the code left running (a grandchild in a session of its own) is killed now and
    # waited for, so that nothing of the run outlives its answer. bwrap's pid 1 kills them
    # as the namespace ends, but bwrap outside returns as soon as we exit: our caller was
    # told the run was over while they could still write to the scratch directory.
    # kill(-1) reaches every process of this pid namespace but pid 1 and us.
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        return
    me, until = os.getpid(), time.monotonic() + give_up_s
    while time.monotonic() < until:  # pid 1 reaps them; bounded, the wall limit is outside
        if not any(p.isdigit() and int(p) not in (1, me) for p in os.listdir("/proc")):
            return
        time.sleep(0.005)
end_the_rest()
os.set_blocking(mem_r, False)
try:
    memory_error = os.read(mem_r, 1) == b"M"
except OSError:
    memory_error = False
report(exit_code=os.waitstatus_to_exitcode(st), cpu_s=usage.ru_utime + usage.ru_stime,
       memory_error=memory_error)
if os.WIFSIGNALED(st):
    sig = os.WTERMSIG(st)
    try:
        signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)
os._exit(os.waitstatus_to_exitcode(st))
'''

# The user's process: runs the code as `python -c` would, and tells the supervisor (one byte
# on its pipe) when the code died of an uncaught MemoryError (the RLIMIT_AS cap).
WRAPPER = r'''
import os, sys
_fd, _code = int(sys.argv[1]), sys.argv[2]
del sys.argv[1:]
def _hook(kind, value, tb, _fd=_fd, _os=os, _sys=sys):
    if issubclass(kind, MemoryError):
        try:
            _os.write(_fd, b"M")
        except OSError:
            pass
    if tb is not None:
        tb = tb.tb_next
        value = value.with_traceback(tb)
    _sys.__excepthook__(kind, value, tb)
sys.excepthook = _hook
del os, sys, _hook
exec(compile(_code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
'''


@dataclass(frozen=True)
class _Identity:
    uid: int
    gid: int
    switch: bool
    """True when we are root and start bwrap as uid/gid (else it runs as ourselves)."""


def _identity() -> _Identity:
    if os.getuid() != 0:
        return _Identity(os.getuid(), os.getgid(), False)
    try:
        uid = int(os.environ.get(UID_ENV) or DEFAULT_UID)
        gid = int(os.environ.get(GID_ENV) or DEFAULT_GID)
    except ValueError:
        raise SandboxUnavailable(f"{UID_ENV}/{GID_ENV} must be numbers") from None
    if uid <= 0 or gid <= 0:
        raise SandboxUnavailable(f"{UID_ENV}/{GID_ENV} must name an unprivileged uid/gid "
                                 f"(not 0)")
    return _Identity(uid, gid, True)


def _tools() -> tuple[str, str]:
    """(bwrap, python) paths, or SandboxUnavailable naming what is missing."""
    bwrap = shutil.which(os.environ.get(BWRAP_ENV) or "bwrap")
    if not bwrap:
        raise SandboxUnavailable("bubblewrap (`bwrap`) is not installed; install the "
                                 "`bubblewrap` package. The code was not run.")
    python = os.environ.get(PYTHON_ENV) or DEFAULT_PYTHON
    real = os.path.realpath(python)
    if not real.startswith("/usr/") or not os.access(real, os.X_OK):
        raise SandboxUnavailable(f"the sandbox's Python {python!r} is not an executable "
                                 f"under /usr (set {PYTHON_ENV}). The code was not run.")
    return bwrap, real


def _bwrap_command(bwrap: str, python: str, workdir: str, bind_workdir: bool = True,
                   files: dict[str, str] | None = None,
                   control: list[str] | None = None) -> list[str]:
    """bwrap's arguments. The scratch `workdir` is the host directory bound in
    (`bind_workdir`), or a fresh tmpfs of SCRATCH_SIZE_BYTES holding `files` ({name: host
    path}, bound read-only)."""
    command = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
               "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    for path in _runtime_dirs(python):
        command += ["--ro-bind", path, path]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            command += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            command += ["--ro-bind", path, path]
    command += ["--proc", "/proc", "--ro-bind", "/dev/null", "/proc/cmdline"]
    command += _dev_args()
    command += ["--size", str(TMP_SIZE_BYTES), "--perms", "1777", "--tmpfs", "/tmp"]
    if bind_workdir:
        command += ["--bind", workdir, workdir]
    else:
        command += ["--size", str(SCRATCH_SIZE_BYTES), "--perms", "0700", "--tmpfs", workdir]
        for name, path in (files or {}).items():
            command += ["--ro-bind", path, os.path.join(workdir, name)]
    command += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", workdir, "--clearenv"]
    env = {"PATH": CHILD_PATH, "HOME": workdir, "TMPDIR": workdir,
           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    for name, value in env.items():
        command += ["--setenv", name, value]
    return command + list(control or ()) + ["--", python, "-I", "-S", "-B", "-c", SUPERVISOR]


DEVICES = ("null", "zero", "full", "random", "urandom")
DEV_SIZE_BYTES = 64 * 1024
SHM_SIZE_BYTES = 16 * 1024 * 1024
"""/dev/shm (POSIX shared memory, multiprocessing's semaphores): a tmpfs of this size."""


def _dev_args() -> list[str]:
    """A minimal /dev: a tiny read-only tmpfs holding the host's null, zero, full, random
    and urandom, the fd/stdin/stdout/stderr links, and a sized /dev/shm. No devpts (so no
    pseudo-terminal: a run cannot use up the host's ptys, which a new devpts instance
    shares with every other), no tty, no unsized tmpfs (bwrap's --dev is one, /dev/shm in
    it too: a run could fill the host's memory there)."""
    args = ["--size", str(DEV_SIZE_BYTES), "--perms", "0755", "--tmpfs", "/dev"]
    for name in DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for target, name in (("/proc/self/fd", "fd"), ("/proc/self/fd/0", "stdin"),
                         ("/proc/self/fd/1", "stdout"), ("/proc/self/fd/2", "stderr")):
        args += ["--symlink", target, f"/dev/{name}"]
    return args + ["--size", str(SHM_SIZE_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm"]


USR_DIRS = ("bin", "lib", "lib32", "lib64", "libx32", "share")
"""What of /usr the sandbox sees: programs, shared libraries, the standard library, shared
data (zoneinfo). Not /usr/local, /usr/src, /usr/include, /usr/sbin, /usr/etc."""


def _runtime_dirs(python: str) -> list[str]:
    """The directories bound read-only: USR_DIRS of /usr, and the bin and lib of the
    interpreter's own prefix when it is elsewhere under /usr (e.g. /usr/local)."""
    dirs = [f"/usr/{name}" for name in USR_DIRS]
    prefix = os.path.dirname(os.path.dirname(python))
    if prefix != "/usr":
        dirs += [os.path.join(prefix, "bin"), os.path.join(prefix, "lib")]
    return [d for d in dirs if os.path.isdir(d) and not os.path.islink(d)]


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


MARKER = "\n... [truncated {n} bytes]"


def json_chars(text: str) -> int:
    """How many characters `text` takes as a JSON string (json.dumps, ensure_ascii=False,
    as tool results are written), quotes excluded."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


@dataclass
class _Capture:
    """Keeps the start of a stream (as bytes) and counts the rest. Its text is cut so that
    it takes at most `max_chars` characters as a JSON string, the marker included: a
    control character takes 6 (\\u0001), a quote 2, so the caller's JSON budget holds."""
    max_chars: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        # a character takes at least one JSON character and at most 4 UTF-8 bytes
        room = self.max_chars * 4 + 4 - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def whole(self) -> str | None:
        """The stream, if it was kept whole."""
        if self.total != len(self.data):
            return None
        return _printable(bytes(self.data).decode("utf-8", "surrogateescape"))

    def text(self, max_chars: int | None = None) -> tuple[str, bool]:
        """The stream as text taking at most `max_chars` (default: ours) JSON characters,
        and whether it was cut."""
        limit = self.max_chars if max_chars is None else max_chars
        whole = self.whole()
        if whole is not None and json_chars(whole) <= limit:
            return whole, False
        text = bytes(self.data).decode("utf-8", "surrogateescape")
        guess = self.total  # the marker's count, at most this many digits
        while True:
            room = limit - json_chars(MARKER.format(n=guess))
            low, high = 0, min(len(text), max(room, 0))
            while low < high:  # the longest prefix within the room
                mid = (low + high + 1) // 2
                if json_chars(_printable(text[:mid])) <= room:
                    low = mid
                else:
                    high = mid - 1
            kept = text[:low]
            omitted = self.total - len(kept.encode("utf-8", "surrogateescape"))
            if len(str(omitted)) == len(str(guess)):
                break
            guess = omitted  # fewer digits: room for a little more text
        return _printable(kept) + MARKER.format(n=omitted), True


def _printable(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _share(captures: dict[str, "_Capture"], total: int | None) -> dict[str, int]:
    """Each stream's JSON budget: its own cap, and when the streams share `total`, what one
    does not use goes to the other."""
    caps = {name: c.max_chars for name, c in captures.items()}
    if total is None or sum(caps.values()) <= total:
        return caps
    need = {}
    for name, capture in captures.items():
        whole = capture.whole()
        need[name] = json_chars(whole) if whole is not None else caps[name]
        need[name] = min(need[name], caps[name])
    fair = total // len(caps)
    small = [n for n in caps if need[n] <= fair]
    spare = total - sum(need[n] for n in small)
    large = [n for n in caps if n not in small]
    out = {n: need[n] for n in small}
    for n in large:
        out[n] = min(caps[n], spare // len(large))
    return out


@dataclass
class _Child:
    """The bwrap process (its own session): killing it ends the sandbox's pid namespace."""
    proc: subprocess.Popen
    exit_code: int | None = None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def reap(self, block: bool = True) -> bool:
        give_up = time.monotonic() + REAP_TIMEOUT_S
        while self.exit_code is None:
            try:
                pid, status = os.waitpid(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                self.exit_code = self.proc.returncode = -1
                break
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.exit_code
                break
            if not block:
                return False
            if time.monotonic() > give_up:
                log.error("sandbox child not reaped", extra={"pid": self.proc.pid})
                return False
            time.sleep(0.01)
        return True


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
    identity = _identity()
    bwrap, python = _tools()
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


def _hand_over(directory: str, identity: "_Identity") -> None:
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
         files: dict[str, str], identity: _Identity, bwrap: str, python: str) -> dict[str, Any]:
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
    command = _bwrap_command(bwrap, python, workdir, bind_workdir, files, control) + [
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
    child = _Child(proc)
    reports: list[dict[str, Any]] = []
    try:
        meter = _start(child, group, info_r, block_w, memory_bytes,
                       started + min(wall_s, START_TIMEOUT_S))
        captures, ended = _collect(child, status_r, reports, started + wall_s,
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
    budgets = _share(captures, max_output_total_chars)
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


def _start(child: _Child, group: cgroups.RunGroup | None, info_fd: int, block_fd: int,
           memory_bytes: int, deadline: float) -> "_Meter | None":
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
        return _CgroupMeter(group)
    return _ProcMeter(ns_pid, memory_bytes)


class _Meter:
    def sample(self) -> tuple[float, bool]:
        """(CPU seconds the whole run used so far, whether it is over its memory)."""
        raise NotImplementedError


@dataclass
class _CgroupMeter(_Meter):
    """The kernel counts and caps the run's memory; its CPU time is cpu.stat's."""
    group: cgroups.RunGroup

    def sample(self) -> tuple[float, bool]:
        return self.group.cpu_s(), False


@dataclass
class _ProcMeter(_Meter):
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
                private[name] = max(0, int(statm[1]) - int(statm[2])) * _PAGE_SIZE
        self.cpu_max = max(self.cpu_max, cpu_ticks / _CLOCK_TICKS)
        over = sum(private.values()) > self.memory_bytes
        if over:  # an upper bound: a fork's pages shared with its parent count twice there
            over = sum(_anon_pss(root, name, bound)
                       for name, bound in private.items()) > self.memory_bytes
        # the processes are read one after another, not at one instant (a fork or an exit
        # between two reads skews the shares): over twice in a row, 50 ms apart, it is
        self.over_before, over = over, over and self.over_before
        return self.cpu_max, over


def _anon_pss(root: str, pid: str, bound: int) -> int:
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
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class _Ended:
    """How the collection ended: the wall deadline, or the run killed by us for its CPU
    budget, its memory, its output or a flooded status channel."""
    timed_out: bool = False
    cpu_limited: bool = False
    memory_limited: bool = False
    output_limited: bool = False
    status_overflow: bool = False
    run_cpu_s: float = 0.0

    @property
    def killed(self) -> bool:
        return (self.cpu_limited or self.memory_limited or self.output_limited
                or self.status_overflow)


def _start_failure(child: _Child, stderr: _Capture) -> SandboxUnavailable:
    detail = bytes(stderr.data).decode("utf-8", "replace").strip()[-500:]
    message = (f"the sandbox could not be set up (bwrap exit {child.exit_code}): "
               f"{detail or 'no message'}. The code was not run.")
    log.error("sandbox unavailable", extra={"problem": message})
    return SandboxUnavailable(message)


def _collect(child: _Child, status_fd: int, reports: list[dict[str, Any]], deadline: float,
             max_chars: int, meter: _Meter | None,
             cpu_budget_s: float) -> tuple[dict[str, _Capture], _Ended]:
    """Read the pipes and the status lines until EOF and bwrap's exit; kill the sandbox at
    the wall deadline, when the whole run's CPU time passes `cpu_budget_s` or its memory
    its limit (`meter`), past OUTPUT_KILL_BYTES of output or STATUS_MAX_BYTES of status."""
    captures = {"stdout": _Capture(max_chars), "stderr": _Capture(max_chars)}
    status_data = bytearray()
    ended = _Ended()
    stop_at: float | None = None
    next_sample = time.monotonic()

    def stop(now: float) -> None:
        nonlocal stop_at
        child.kill()
        if stop_at is None:
            stop_at = now + DRAIN_GRACE_S

    with selectors.DefaultSelector() as sel, _exit_watch(child.proc.pid) as pidfd:
        for name in captures:
            pipe = getattr(child.proc, name)
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, name)
        os.set_blocking(status_fd, False)
        sel.register(status_fd, selectors.EVENT_READ, "status")
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        while True:
            now = time.monotonic()
            exited = child.reap(block=False)
            if exited and pidfd is not None and pidfd in sel.get_map():
                sel.unregister(pidfd)
            pipes_open = any(key.data != "exit" for key in sel.get_map().values())
            if exited and not pipes_open:
                break
            if meter is not None and stop_at is None and now >= next_sample:
                ended.run_cpu_s, over_memory = meter.sample()
                next_sample = now + METER_INTERVAL_S
                if ended.run_cpu_s >= cpu_budget_s:
                    ended.cpu_limited = True
                    stop(now)
                elif over_memory:
                    ended.memory_limited = True
                    stop(now)
            if stop_at is None and now >= deadline:
                ended.timed_out = not exited
                stop(now)
            elif stop_at is None and exited:
                stop_at = now + DRAIN_GRACE_S
            if stop_at is not None and now >= stop_at:
                break
            wait = max(0.0, (stop_at or deadline) - now)
            if pidfd is None:
                wait = min(wait, POLL_INTERVAL_S)
            if meter is not None and stop_at is None:
                wait = min(wait, max(0.0, next_sample - now))
            for key, _ in sel.select(wait):
                if key.data == "exit":
                    continue
                try:
                    chunk = os.read(key.fd, READ_CHUNK_BYTES)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data == "status":
                    room = STATUS_MAX_BYTES - len(status_data)
                    status_data += chunk[:max(room, 0)]
                    if len(chunk) > room and not ended.status_overflow:
                        ended.status_overflow = True  # not the supervisor's few lines
                        log.warning("sandbox status channel flooded; run killed")
                        stop(time.monotonic())
                else:
                    captures[key.data].feed(chunk)
                    if (captures["stdout"].total + captures["stderr"].total
                            > OUTPUT_KILL_BYTES and not ended.output_limited):
                        ended.output_limited = True
                        stop(time.monotonic())
    for line in bytes(status_data).splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            reports.append(item)
    return captures, ended


@contextlib.contextmanager
def _exit_watch(pid: int) -> Iterator[int | None]:
    """A pidfd that becomes readable when `pid` exits (Linux 5.3+), else None (we poll)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)
