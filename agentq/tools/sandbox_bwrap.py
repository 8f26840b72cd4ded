"""How a run's sandbox is built (`agentq.tools.sandbox`): the uid it runs as, the bwrap and
Python it runs with, and bwrap's arguments: a fresh tmpfs root holding only what of /usr the
interpreter needs, a minimal /dev, a private /tmp and the run's scratch directory, every
namespace new, the environment cleared."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from agentq.errors import ToolError

UID_ENV, GID_ENV = "AGENTQ_SANDBOX_UID", "AGENTQ_SANDBOX_GID"
"""The host uid/gid the code runs as when the worker is root (default 65534, nobody)."""
BWRAP_ENV = "AGENTQ_SANDBOX_BWRAP"
"""The bubblewrap binary (default: `bwrap` on PATH)."""
PYTHON_ENV = "AGENTQ_SANDBOX_PYTHON"
"""The interpreter the code runs with; it must live under /usr (default /usr/bin/python3)."""
DEFAULT_UID = DEFAULT_GID = 65534
DEFAULT_PYTHON = "/usr/bin/python3"
SCRATCH_SIZE_BYTES = 64 * 1024 * 1024
"""The run's own scratch (a tmpfs in the sandbox, unless the caller binds a directory of its
own): writing past it fails with ENOSPC inside the code. tmpfs lives in memory, outside the
code's RLIMIT_AS, so it is bounded here."""
TMP_SIZE_BYTES = 16 * 1024 * 1024
"""The private /tmp (a tmpfs): writing past it fails with ENOSPC."""
CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxUnavailable(ToolError):
    """The sandbox cannot be set up here; the code was not run."""
    code = "sandbox_unavailable"
    retryable = False


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    switch: bool
    """True when we are root and start bwrap as uid/gid (else it runs as ourselves)."""


def identity() -> Identity:
    if os.getuid() != 0:
        return Identity(os.getuid(), os.getgid(), False)
    try:
        uid = int(os.environ.get(UID_ENV) or DEFAULT_UID)
        gid = int(os.environ.get(GID_ENV) or DEFAULT_GID)
    except ValueError:
        raise SandboxUnavailable(f"{UID_ENV}/{GID_ENV} must be numbers") from None
    if uid <= 0 or gid <= 0:
        raise SandboxUnavailable(f"{UID_ENV}/{GID_ENV} must name an unprivileged uid/gid "
                                 f"(not 0)")
    return Identity(uid, gid, True)


def binaries() -> tuple[str, str]:
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


def bwrap_command(bwrap: str, python: str, workdir: str, supervisor: str,
                  bind_workdir: bool = True, files: dict[str, str] | None = None,
                  control: list[str] | None = None) -> list[str]:
    """bwrap's arguments, running `supervisor` (SUPERVISOR) inside. The scratch `workdir`
    is the host directory bound in
    (`bind_workdir`), or a fresh tmpfs of SCRATCH_SIZE_BYTES holding `files` ({name: host
    path}, bound read-only)."""
    command = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
               "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    for path in runtime_dirs(python):
        command += ["--ro-bind", path, path]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            command += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            command += ["--ro-bind", path, path]
    command += ["--proc", "/proc", "--ro-bind", "/dev/null", "/proc/cmdline"]
    command += dev_args()
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
    return command + list(control or ()) + ["--", python, "-I", "-S", "-B", "-c", supervisor]


DEVICES = ("null", "zero", "full", "random", "urandom")
DEV_SIZE_BYTES = 64 * 1024
SHM_SIZE_BYTES = 16 * 1024 * 1024
"""/dev/shm (POSIX shared memory, multiprocessing's semaphores): a tmpfs of this size."""


def dev_args() -> list[str]:
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


def runtime_dirs(python: str) -> list[str]:
    """The directories bound read-only: USR_DIRS of /usr, and the bin and lib of the
    interpreter's own prefix when it is elsewhere under /usr (e.g. /usr/local)."""
    dirs = [f"/usr/{name}" for name in USR_DIRS]
    prefix = os.path.dirname(os.path.dirname(python))
    if prefix != "/usr":
        dirs += [os.path.join(prefix, "bin"), os.path.join(prefix, "lib")]
    return [d for d in dirs if os.path.isdir(d) and not os.path.islink(d)]
