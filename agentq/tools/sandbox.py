"""Run untrusted Python in a resource-limited child process without network access.

`run_python(code, cpu_s=..., memory_mb=..., wall_s=..., max_output_chars=...)` returns
`{"stdout", "stderr", "exit_code", "timed_out", "cpu_limited", "duration_s", "truncated"}`.
A timeout or a nonzero exit is a normal result (the model reads it); only a sandbox that
cannot be set up raises (`SandboxUnavailable`).

How the child is started: we exec `python -I -S -B -c BOOTSTRAP` (a small stdlib-only
program, below) which applies the limits and namespaces to itself and then execs the user's
code in a fresh `python -I -S -B`. No `preexec_fn`: the registry runs tools in a helper
thread, and code run between fork and exec in a multithreaded process can deadlock on a lock
another thread held at fork time. Exec'ing a helper is safe from any thread and costs one
extra interpreter start-up (~20 ms).

What the child gets:
  * resource limits: RLIMIT_CPU (SIGXCPU and SIGKILL at cpu_s, whole seconds), RLIMIT_AS
    (memory_mb), RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE 0 and RLIMIT_NPROC (the kernel
    does not apply RLIMIT_NPROC to uid 0, even inside a user namespace: run the slow worker
    as an unprivileged user to bound fork bombs; the wall clock still ends them);
  * namespaces, the first set `unshare` accepts: user+net+pid+mnt+ipc (the user namespace
    drops every capability the worker has), then net+pid+mnt+ipc (root without user
    namespaces), then user+net, then net. In the mount namespace every mount is remounted
    read-only except the scratch directory, and a fresh /proc shows only the sandbox. In the
    pid namespace the user's code is pid 1, so when it exits or is killed the kernel kills
    every process it left behind, including ones that called setsid() (as pid 1 it also
    ignores signals it sends itself without a handler). Without a pid namespace, leftovers
    are found by their network namespace and killed;
  * if no network namespace can be created the code is NOT run (SandboxUnavailable), unless
    AGENTQ_SANDBOX_ALLOW_NETWORK=1 is set (meant for development machines only);
  * a new session (its own process group, killed as a whole on timeout), an empty stdin, an
    environment of PATH/HOME/TMPDIR/LANG only (no secret of ours is inherited), the scratch
    directory as cwd (a fresh temporary one, removed afterwards, unless scratch_dir is given),
    PR_SET_NO_NEW_PRIVS, and PR_SET_PDEATHSIG so it dies with the thread that started it;
  * stdout/stderr are read as they come; beyond the cap the bytes are read and discarded, so
    a chatty child cannot fill our memory or block on a full pipe.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from agentq.errors import ToolError

log = logging.getLogger(__name__)

ALLOW_NETWORK_ENV = "AGENTQ_SANDBOX_ALLOW_NETWORK"
FILE_SIZE_LIMIT_BYTES = 16 * 1024 * 1024
OPEN_FILES_LIMIT = 256
MAX_PROCESSES = 64
MAX_CODE_BYTES = 100_000
"""One argv string may hold at most 128 KiB on Linux."""
READ_CHUNK_BYTES = 65536
POLL_INTERVAL_S = 0.05
"""How often to check for the exit of the child where pidfd_open is missing."""
DRAIN_GRACE_S = 0.5
"""After the child is gone, how long to wait for pipes that something else still holds."""
REAP_TIMEOUT_S = 5
SWEEP_ROUNDS = 20
CPU_ACCOUNTING_SLACK_S = 0.05
CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
ISOLATION_MODES = (
    ("user+net+pid+mnt+ipc", CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS
     | CLONE_NEWIPC),
    ("net+pid+mnt+ipc", CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC),
    ("user+net", CLONE_NEWUSER | CLONE_NEWNET),
    ("net", CLONE_NEWNET),
)


class SandboxUnavailable(ToolError):
    """The sandbox cannot be set up here; the code was not run."""
    code = "sandbox_unavailable"
    retryable = False


# The helper the child runs first (stdlib only; argv: config JSON, user code). It reports
# one JSON line on the status pipe -- {"ok": true, ...} just before exec'ing the user's code,
# or {"ok": false, "error": ...} -- then stays as a tiny supervisor that waits for the user's
# process and exits the same way (same exit code, or killed by the same signal).
BOOTSTRAP = r'''
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
status = cfg["status_fd"]
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
KEEP = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
        "relatime": 1 << 21}

def report(**fields):
    os.write(status, json.dumps(fields).encode() + b"\n")

def fail(message):
    report(ok=False, error=message)
    os._exit(1)

def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

def unescape(path):
    return path.encode().decode("unicode_escape").encode("latin-1")

def read_only_fs(workdir):
    # Private first: nothing done here may propagate to the worker's mounts.
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private mounts")
    with open("/proc/self/mountinfo") as f:
        mounts = [(unescape(p[4]), p[5].split(",")) for p in (l.split() for l in f)]
    wd = workdir.encode()
    check(libc.mount(wd, wd, None, MS_BIND | MS_REC, None), "bind " + workdir)
    notes = []
    for point, opts in mounts:
        # Flags a user namespace may not drop (nosuid, nodev, noexec, atime) are kept.
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | sum(KEEP.get(o, 0) for o in opts)
        if point != wd and libc.mount(None, point, None, flags, None) != 0:
            notes.append("writable: " + point.decode(errors="replace"))
    if libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None) != 0:
        notes.append("host /proc")
    if os.path.isdir("/dev/shm"):
        libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 2 | 4, b"size=16m,mode=1777")
    os.chdir(workdir)
    return "; ".join(["read-only"] + notes[:5])

try:
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
except (OSError, ValueError) as exc:
    fail(f"cannot apply the limits: {exc}")
if os.getppid() != cfg["parent_pid"]:
    os._exit(1)
mode, errors = None, []
for name, flags in cfg["modes"]:
    if libc.unshare(flags) == 0:
        mode = name
        break
    errors.append(f"unshare({name}): {os.strerror(ctypes.get_errno())}")
if mode is None:
    if not cfg["allow_network"]:
        fail("; ".join(errors))
    mode = "none"
try:
    pid = os.fork()
except OSError as exc:
    fail(f"fork: {exc}")
if pid == 0:
    filesystem = "shared"
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if "mnt" in mode:
            filesystem = read_only_fs(cfg["workdir"])
    except OSError as exc:
        filesystem = f"shared ({exc})"
    report(ok=True, isolation=mode, filesystem=filesystem)
    os.close(status)
    try:
        os.execv(cfg["python"], [cfg["python"], "-I", "-S", "-B", "-c", sys.argv[2]])
    except OSError as exc:
        os.write(2, f"sandbox: cannot start python: {exc}\n".encode())
        os._exit(127)
os.close(status)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.dup2(null, 2)
_, st = os.waitpid(pid, 0)
if os.WIFSIGNALED(st):
    sig = os.WTERMSIG(st)
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)
os._exit(os.waitstatus_to_exitcode(st))
'''


@dataclass
class _Capture:
    """Keeps the first `max_chars` characters of a stream (as bytes) and counts the rest."""
    max_chars: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.max_chars * 4 + 4 - len(self.data)  # UTF-8: at most 4 bytes a char
        if room > 0:
            self.data += chunk[:room]

    def text(self) -> tuple[str, bool]:
        text = bytes(self.data).decode("utf-8", "surrogateescape")
        if len(text) <= self.max_chars and self.total == len(self.data):
            return _printable(text), False
        kept = text[:self.max_chars]
        omitted = self.total - len(kept.encode("utf-8", "surrogateescape"))
        return _printable(kept) + f"\n... [truncated {omitted} bytes]", True


def _printable(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass
class _Child:
    """The bootstrap process: its exit status and CPU time (which include the user's)."""
    proc: subprocess.Popen
    exit_code: int | None = None
    cpu_s: float = 0.0
    netns_fd: int | None = None
    """Without a pid namespace, processes that left our process group (setsid) are found by
    their network namespace; this open fd keeps its inode from being reused meanwhile."""

    def kill_group(self) -> None:
        """SIGKILL the process group (pid == pgid: start_new_session). With a pid namespace
        this ends the user's pid 1 and with it every process in the namespace."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.netns_fd is not None:
            _kill_network_namespace(os.fstat(self.netns_fd))

    def watch_network_namespace(self) -> None:
        """Pin the child's network namespace if it differs from ours (for kill_group)."""
        try:
            fd = os.open(f"/proc/{self.proc.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # already exited
            return
        theirs, ours = os.fstat(fd), os.stat("/proc/self/ns/net")
        if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
            os.close(fd)  # no namespace of its own: never sweep ours
        else:
            self.netns_fd = fd

    def close(self) -> None:
        if self.netns_fd is not None:
            os.close(self.netns_fd)
            self.netns_fd = None
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def reap(self, block: bool = True) -> bool:
        """wait4() the child, for its exit code and CPU time; True once reaped."""
        give_up = time.monotonic() + REAP_TIMEOUT_S
        while self.exit_code is None:
            try:
                pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.exit_code = self.proc.returncode = -1
                break
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.cpu_s = usage.ru_utime + usage.ru_stime
                self.proc.returncode = self.exit_code  # Popen must not wait for it again
                break
            if not block:
                return False
            if time.monotonic() > give_up:
                log.error("sandbox child not reaped", extra={"pid": self.proc.pid})
                return False
            time.sleep(0.01)
        return True


def run_python(code: str, *, cpu_s: float, memory_mb: int, wall_s: float,
               max_output_chars: int, scratch_dir: str | None = None) -> dict[str, Any]:
    """Run `code` in the sandbox; see the module docstring for what it may and may not do."""
    _check_arguments(code, cpu_s=cpu_s, memory_mb=memory_mb, wall_s=wall_s,
                     max_output_chars=max_output_chars)
    own_dir = scratch_dir is None
    if own_dir:
        workdir = tempfile.mkdtemp(prefix="agentq-sandbox-")
    else:
        workdir = os.path.realpath(scratch_dir)
        os.makedirs(workdir, mode=0o700, exist_ok=True)
    try:
        return _run(code, cpu_s=cpu_s, memory_mb=memory_mb, wall_s=wall_s,
                    max_output_chars=int(max_output_chars), workdir=workdir)
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)
            if os.path.exists(workdir):
                log.warning("sandbox scratch not removed", extra={"path": workdir})


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


def _rlimits(cpu_s: float, memory_mb: int) -> list[tuple[str, int, int]]:
    # soft == hard: SIGXCPU and SIGKILL together. In a pid namespace the user's code is pid
    # 1, which the kernel shields from SIGXCPU's default action; SIGKILL still lands.
    cpu_seconds = max(1, math.ceil(cpu_s))
    memory_bytes = int(memory_mb * 1024 * 1024)
    processes = _process_limit()
    return [
        ("RLIMIT_CPU", cpu_seconds, cpu_seconds),
        ("RLIMIT_AS", memory_bytes, memory_bytes),
        ("RLIMIT_FSIZE", FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES),
        ("RLIMIT_NOFILE", OPEN_FILES_LIMIT, OPEN_FILES_LIMIT),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NPROC", processes, processes),
    ]


def _process_limit() -> int:
    """RLIMIT_NPROC counts every task of the real uid, so for an unprivileged worker the
    limit is what that uid already runs plus MAX_PROCESSES. (uid 0 is exempt anyway.)"""
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    wanted = MAX_PROCESSES
    if os.getuid() != 0:
        for entry in os.scandir("/proc"):
            try:
                if entry.name.isdigit() and entry.stat().st_uid == os.getuid():
                    wanted += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def _run(code: str, *, cpu_s: float, memory_mb: int, wall_s: float, max_output_chars: int,
         workdir: str) -> dict[str, Any]:
    allow_network = os.environ.get(ALLOW_NETWORK_ENV) == "1"
    if not sys.executable:
        raise SandboxUnavailable("the sandbox cannot find a Python interpreter")
    env = {"PATH": CHILD_PATH, "HOME": workdir, "TMPDIR": workdir,
           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    status_r, status_w = os.pipe()
    config = {"status_fd": status_w, "rlimits": _rlimits(cpu_s, memory_mb),
              "modes": ISOLATION_MODES, "allow_network": allow_network,
              "python": sys.executable, "workdir": workdir, "parent_pid": os.getpid()}
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", BOOTSTRAP, json.dumps(config), code],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=workdir, env=env, start_new_session=True, pass_fds=(status_w,))
    except OSError as exc:
        os.close(status_r)
        raise SandboxUnavailable(f"the sandbox cannot start a process: {exc}") from None
    finally:
        os.close(status_w)
    child = _Child(proc)
    try:
        status = _read_status(status_r, started + wall_s)
        if not status.get("ok"):
            child.kill_group()
            child.reap()
            raise _start_failure(child, status)
        if "pid" not in status["isolation"]:
            child.watch_network_namespace()
        captures, timed_out = _collect(child, started + wall_s, max_output_chars)
    finally:
        os.close(status_r)
        child.kill_group()
        child.reap()
        child.close()
    duration_s = time.monotonic() - started
    stdout, stdout_cut = captures["stdout"].text()
    stderr, stderr_cut = captures["stderr"].text()
    exit_code = child.exit_code if child.exit_code is not None else -signal.SIGKILL
    cpu_limited = (not timed_out and exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
                   and child.cpu_s >= max(1, math.ceil(cpu_s)) - CPU_ACCOUNTING_SLACK_S)
    log.info("sandbox run finished", extra={
        "isolation": status.get("isolation"), "filesystem": status.get("filesystem"),
        "exit_code": exit_code, "timed_out": timed_out, "cpu_limited": cpu_limited,
        "duration_ms": round(duration_s * 1000), "cpu_ms": round(child.cpu_s * 1000),
        "code_bytes": len(code.encode()), "stdout_bytes": captures["stdout"].total,
        "stderr_bytes": captures["stderr"].total})
    if status.get("isolation") == "none":
        log.warning("sandbox ran WITHOUT network isolation",
                    extra={"reason": f"{ALLOW_NETWORK_ENV}=1"})
    return {"stdout": stdout, "stderr": stderr, "exit_code": exit_code,
            "timed_out": timed_out, "cpu_limited": cpu_limited,
            "duration_s": round(duration_s, 3), "truncated": stdout_cut or stderr_cut}


def _read_status(fd: int, deadline: float) -> dict[str, Any]:
    """One JSON line from the bootstrap; {} if it died before writing one."""
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                return {"ok": False, "error": "the sandbox did not start in time"}
            chunk = os.read(fd, 4096)
            if not chunk:
                return {}
            data += chunk
    try:
        return json.loads(data.partition(b"\n")[0])
    except ValueError:
        return {}


def _start_failure(child: _Child, status: dict[str, Any]) -> SandboxUnavailable:
    error = status.get("error")
    if error and "unshare" in error:
        message = (f"the sandbox cannot isolate the network ({error}); the code was not run. "
                   f"Set {ALLOW_NETWORK_ENV}=1 to run without isolation (development only).")
    elif error:
        message = f"the sandbox could not be set up: {error}"
    else:
        detail = b""
        stderr = child.proc.stderr
        if stderr is not None:
            os.set_blocking(stderr.fileno(), False)
            try:
                detail = stderr.read(4000) or b""
            except OSError:
                pass
        message = (f"the sandbox failed to start (exit {child.exit_code}): "
                   f"{detail.decode('utf-8', 'replace').strip()[-500:]}")
    log.error("sandbox unavailable", extra={"problem": message})
    return SandboxUnavailable(message)


def _collect(child: _Child, deadline: float,
             max_chars: int) -> tuple[dict[str, _Capture], bool]:
    """Read both pipes until EOF and the child's exit; at the wall deadline kill the group.
    Once the child has exited, descendants still holding the pipes get a short grace, then
    are killed (that happens only without a pid namespace)."""
    captures = {"stdout": _Capture(max_chars), "stderr": _Capture(max_chars)}
    timed_out = False
    stop_at: float | None = None
    with selectors.DefaultSelector() as sel, _exit_watch(child.proc.pid) as pidfd:
        for name in captures:
            pipe = getattr(child.proc, name)
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, name)
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
            if stop_at is None and now >= deadline:
                timed_out = True
                child.kill_group()
                stop_at = now + DRAIN_GRACE_S
            elif stop_at is None and exited:
                child.kill_group()  # leftovers holding the pipes, if no pid namespace
                stop_at = now + DRAIN_GRACE_S
            if stop_at is not None and now >= stop_at:
                break
            wait = max(0.0, (stop_at or deadline) - now)
            if pidfd is None:  # no exit notification: poll
                wait = min(wait, POLL_INTERVAL_S)
            if not sel.get_map():
                time.sleep(wait)
                continue
            for key, _ in sel.select(wait):
                if key.data == "exit":
                    continue  # reaped at the top of the loop
                try:
                    chunk = os.read(key.fd, READ_CHUNK_BYTES)
                except BlockingIOError:
                    continue
                if chunk:
                    captures[key.data].feed(chunk)
                else:
                    sel.unregister(key.fileobj)
    return captures, timed_out


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


def _kill_network_namespace(netns: os.stat_result) -> None:
    """SIGKILL every process in the network namespace `netns` (never ours: checked by the
    caller), until none is left; bounded, as forks from a dying process are few."""
    for _ in range(SWEEP_ROUNDS):
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                ns = os.stat(f"/proc/{entry.name}/ns/net")
                if (ns.st_dev, ns.st_ino) == (netns.st_dev, netns.st_ino):
                    os.kill(int(entry.name), signal.SIGKILL)
                    found += 1
            except OSError:  # gone, a zombie, or not ours to inspect
                continue
        if not found:
            return
        time.sleep(0.01)
    log.error("sandbox processes survived the sweep", extra={"netns_inode": netns.st_ino})
