"""The sandbox's seccomp filter: a deny-list compiled by libseccomp (through `pyseccomp`, a
ctypes binding with libseccomp's own Python API) into a BPF program that bubblewrap loads
(`--seccomp FD`) into the sandbox's processes right before it execs the supervisor.

Everything the filter names fails with EPERM; every other system call is allowed (the
namespaces, the uid and the limits are the first line; this is the second). What it closes:

  * reaching another process: ptrace, process_vm_readv/writev, pidfd_open, pidfd_getfd,
    pidfd_send_signal, kcmp (the code could otherwise copy the supervisor's descriptors or
    take it over, and forge how the run ended);
  * kernel surfaces an untrusted program never needs, the usual sources of escapes:
    io_uring_*, bpf, perf_event_open, userfaultfd, keyctl/add_key/request_key (keyrings are
    per uid, shared across runs), the module and kexec calls, the mount API, pivot_root,
    chroot, open_by_handle_at, fanotify, personality, acct, swapon/swapoff, reboot, the
    clocks, syslog, quotactl, ioperm/iopl, memory-policy calls on other processes;
  * new namespaces: unshare and setns, and clone with a CLONE_NEW* flag (clone3, whose flags
    a filter cannot read, answers ENOSYS so that the C library falls back to clone);
  * memory outside the run's accounting: SysV shared memory and message queues (shmget,
    msgget: kernel memory outside RLIMIT_AS and every tmpfs size) always, and memfd_create
    when no memory cgroup counts the run (`deny_memfd`): without one, a memfd's pages count
    against nothing once unmapped.

Other architectures' system calls (int 0x80, x32) do not match the filter's architecture
and kill the process (libseccomp's default for a foreign architecture).
"""
from __future__ import annotations

import errno
import functools
import os
import tempfile

DENIED = (
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "kcmp",
    # kernel surfaces
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "open_by_handle_at",
    "name_to_handle_at", "fanotify_init", "personality", "acct", "swapon", "swapoff",
    "reboot", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog",
    "quotactl", "quotactl_fd", "lookup_dcookie", "uselib", "vhangup", "ioperm", "iopl",
    "migrate_pages", "move_pages", "mbind", "set_mempolicy", "memfd_secret",
    # namespaces
    "unshare", "setns",
    # memory outside the run's accounting
    "shmget", "msgget",
)
"""System calls that fail with EPERM in the sandbox."""
MEMFD = "memfd_create"
"""Denied too when no memory cgroup counts the run (`deny_memfd`)."""
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080,
}


class SeccompUnavailable(RuntimeError):
    """libseccomp or its binding is missing, or the filter could not be built."""


def denied(deny_memfd: bool) -> tuple[str, ...]:
    """The system calls that fail with EPERM."""
    return DENIED + ((MEMFD,) if deny_memfd else ())


@functools.lru_cache(maxsize=2)
def program(deny_memfd: bool) -> bytes:
    """The filter as a BPF program (struct sock_filter[]) for this machine's architecture,
    as bwrap's --seccomp reads it. Raises SeccompUnavailable when it cannot be built."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, AttributeError, TypeError) as exc:
        raise SeccompUnavailable(
            f"libseccomp's Python binding cannot be loaded ({type(exc).__name__}: {exc}); "
            "install the `pyseccomp` package and the `libseccomp2` system package") from None
    try:
        flt = seccomp.SyscallFilter(seccomp.ALLOW)
        eperm = seccomp.ERRNO(errno.EPERM)
        names = denied(deny_memfd)
        for name in names:
            if _known(seccomp, name):
                flt.add_rule(eperm, name)
        for bit in CLONE_NEW_FLAGS.values():
            flt.add_rule(eperm, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, bit, bit))
        flt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as out:
            flt.export_bpf(out)
            out.seek(0)
            data = out.read()
    except OSError as exc:
        raise SeccompUnavailable(f"the seccomp filter cannot be built: {exc}") from None
    if not data or len(data) % 8:
        raise SeccompUnavailable("libseccomp exported an empty or malformed BPF program")
    return data


def _known(seccomp, name: str) -> bool:
    """Whether this architecture has the system call (e.g. x86-64 has no `umount`)."""
    try:
        return seccomp.resolve_syscall(seccomp.system_arch(), name) >= 0
    except (OSError, ValueError):
        return False


def program_fd(deny_memfd: bool) -> int:
    """A descriptor to read the BPF program from (a pipe holding it, its write end
    closed), for bwrap's --seccomp; the caller closes it once bwrap has started."""
    data = program(deny_memfd)
    read_end, write_end = os.pipe()
    try:
        if len(data) > 65536:  # a pipe's default capacity: the write would block
            raise SeccompUnavailable(f"the BPF program is {len(data)} bytes, too large")
        os.write(write_end, data)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end
