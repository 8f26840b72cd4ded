"""Issue 9: attacks on `code.run_python`'s sandbox, each with the outcome that must hold.

Every test runs real code in the real sandbox (bubblewrap, `.ci/run` installs it). Each
checks first, where it can, that the target is reachable from the test process itself, so
that a refusal inside the sandbox means the sandbox refused it."""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from agentq.loop.context import render_tool_result
from agentq.tools import sandbox, sandbox_bwrap, sandbox_meter
from agentq.tools.sandbox import run_python
from tests.support.attacks import (
    FLOOD_STDOUT,
    FORK_BOMB,
    FOUR_TIMES_200_MIB,
    HOLD_640_MIB,
    SPIN,
    SPINNERS,
    SUPERVISOR_ATTACK,
    SUPERVISOR_ATTACK_REFUSED,
    SYSCALLS,
    held_mib,
    pg_write,
)
from tool_workers.code import MODULE as CODE_MODULE

LIMITS = dict(cpu_s=5, memory_mb=256, wall_s=60, max_output_chars=4000)
PG_SOCKET = "/var/run/postgresql/.s.PGSQL.5432"
RUN_DEADLINE_S = 120


def run(code: str, **overrides) -> dict:
    return run_python(textwrap.dedent(code), **{**LIMITS, **overrides})


def connect_code(family: str, address) -> str:
    return f"""
        import socket
        s = socket.socket(socket.{family})
        try:
            s.connect({address!r})
            print("connected")
        except OSError as exc:
            print(exc.errno)
    """


@pytest.fixture
def unix_listener():
    """A listening Unix socket in a directory any uid may reach, like a service's socket."""
    def make(name: str) -> str:
        directory = Path(f"/tmp/agentq-sec-{uuid.uuid4().hex[:8]}")
        directory.mkdir(mode=0o755)
        made.append(directory)
        path = str(directory / name)
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen()
        servers.append(server)
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(path)               # reachable from outside the sandbox
        return path
    made: list[Path] = []
    servers: list[socket.socket] = []
    yield make
    for server in servers:
        server.close()
    for directory in made:
        for item in directory.iterdir():
            item.unlink()
        directory.rmdir()


# --- sockets ------------------------------------------------------------------------------

def test_postgres_unix_socket_is_not_reachable():
    assert os.path.exists(PG_SOCKET), "the machine's Postgres listens on its Unix socket"
    result = run(connect_code("AF_UNIX", PG_SOCKET))
    assert result["stdout"] == f"{errno.ENOENT}\n"


@pytest.mark.parametrize("name", ["redis.sock", "gunicorn.ctl", "mysqld.sock"])
def test_service_unix_sockets_are_not_reachable(unix_listener, name):
    path = unix_listener(name)
    result = run(connect_code("AF_UNIX", path))
    assert result["stdout"] == f"{errno.ENOENT}\n"


def test_abstract_unix_socket_is_not_reachable():
    name = f"\0agentq-sec-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(name)
        server.listen()
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(name)
        result = run(connect_code("AF_UNIX", name))
    assert result["stdout"] == f"{errno.ECONNREFUSED}\n"


@pytest.mark.parametrize("port", [5432, 6379])
def test_tcp_to_the_machines_services_is_not_reachable(port):
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    result = run(connect_code("AF_INET", ("127.0.0.1", port)))
    assert result["stdout"] in (f"{errno.ECONNREFUSED}\n", f"{errno.ENETUNREACH}\n")


def test_tcp_and_udp_to_the_outside_are_not_reachable():
    result = run("""
        import socket
        for kind, address in ((socket.SOCK_STREAM, ("1.1.1.1", 443)),
                              (socket.SOCK_DGRAM, ("8.8.8.8", 53)),
                              (socket.SOCK_STREAM, ("::1", 5432))):
            family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
            s = socket.socket(family, kind)
            try:
                if kind == socket.SOCK_DGRAM:
                    s.sendto(b"x", address)
                else:
                    s.connect(address)
                print("reached")
            except OSError as exc:
                print(exc.errno)
    """)
    assert result["stdout"].split() == [str(errno.ENETUNREACH), str(errno.ENETUNREACH),
                                        str(errno.ECONNREFUSED)]


def test_udp_to_a_host_listener_never_arrives():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        result = run(f"""
            import socket
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(b"exfiltrated", ("127.0.0.1", {port}))
            print("sent")
        """)
        assert result["exit_code"] == 0
        # loopback delivery happens inside sendto: had it reached us, it would be queued now
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.recv(100)


def test_postgres_cannot_be_written_over_any_socket():
    table = f"sandbox_escape_{uuid.uuid4().hex[:8]}"
    result = run(pg_write(PG_SOCKET, None, "postgres", table) + "\n"
                 + pg_write(None, "127.0.0.1", "postgres", table))
    lines = result["stdout"].splitlines()
    assert len(lines) == 2 and all(line.startswith("blocked:") for line in lines), lines


# --- files --------------------------------------------------------------------------------

def test_etc_shadow_and_host_directories_are_not_there():
    checkout = str(Path(__file__).resolve().parents[2])   # this project's files
    result = run(f"""
        import os
        for path in ("/etc/shadow", "/etc/passwd", "/proc/1/root/etc/shadow", "/root",
                     "/home", "/run", "/var/run", "/var/lib/postgresql", "/work",
                     "/usr/src", "/usr/local", "/usr/include", {checkout!r}):
            print(path, os.path.exists(path))
        print(sorted(os.listdir("/")))
    """)
    lines = result["stdout"].splitlines()
    assert all(line.endswith(" False") for line in lines[:-1]), lines
    assert set(eval(lines[-1])) <= {"bin", "dev", "lib", "lib32", "lib64", "libx32", "proc",
                                     "sbin", "tmp", "usr"}


def test_code_runs_as_an_unprivileged_uid_on_the_host(scratch_dir):
    result = run("""
        import os
        print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())
        open("made-here", "w").write("x")
    """, scratch_dir=str(scratch_dir))
    owner = (scratch_dir / "made-here").stat()
    assert owner.st_uid != 0 and owner.st_gid != 0     # as the host's kernel sees it
    if os.getuid() == 0:
        assert owner.st_uid == sandbox_bwrap.DEFAULT_UID
    uid, euid, gid, _groups = result["stdout"].split(maxsplit=3)
    assert uid == euid == str(owner.st_uid) and gid == str(owner.st_gid)


def test_a_root_only_file_is_not_readable_even_when_visible(scratch_dir):
    if os.getuid() != 0:
        pytest.skip("needs a root worker to make a root-only file")
    secret = scratch_dir / "root-only"
    secret.write_text("secret")
    secret.chmod(0o600)
    result = run("""
        try:
            print(open("root-only").read())
        except OSError as exc:
            print(exc.errno)
    """, scratch_dir=str(scratch_dir))
    assert result["stdout"] == f"{errno.EACCES}\n"


def test_a_concurrent_runs_scratch_is_not_reachable(scratch_dir):
    # given run A holding a secret in its scratch, and still running
    release = scratch_dir / "release"
    results: dict[str, dict] = {}

    def run_a():
        results["a"] = run("""
            import os, time
            open("secret", "w").write("A's secret")
            while not os.path.exists("release"):
                time.sleep(0.02)
            print("a done")
        """, scratch_dir=str(scratch_dir), wall_s=RUN_DEADLINE_S)
    thread = threading.Thread(target=run_a)
    thread.start()
    try:
        deadline = time.monotonic() + RUN_DEADLINE_S
        while not (scratch_dir / "secret").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (scratch_dir / "secret").exists()
        # when run B looks for it, by path and by listing
        result = run(f"""
            import os
            print(os.path.exists({str(scratch_dir)!r}))
            print([n for n in os.listdir("/tmp") if n != os.path.basename(os.getcwd())])
            try:
                print(open({str(scratch_dir / "secret")!r}).read())
            except OSError as exc:
                print(exc.errno)
        """)
    finally:
        release.write_text("")
        thread.join()
    # then it finds nothing
    assert result["stdout"].splitlines() == ["False", "[]", str(errno.ENOENT)]
    assert results["a"]["stdout"] == "a done\n"


# --- processes ----------------------------------------------------------------------------

def _processes_in_pid_namespace(inode: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(f"/proc/{entry.name}/ns/pid").st_ino == inode:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_fork_bomb_stops_at_the_cap():
    result = run(FORK_BOMB)
    made, err = result["stdout"].split()
    assert err == "EAGAIN", result
    assert 0 < int(made) < sandbox.MAX_PROCESSES


def test_threads_count_against_the_cap():
    result = run("""
        import threading, time
        threading.stack_size(256 * 1024)     # the cap binds, not the memory limit
        made = 0
        try:
            while True:
                threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
                made += 1
        except RuntimeError as exc:
            print(made, flush=True)
        import os; os._exit(0)
    """)
    assert 0 < int(result["stdout"]) < sandbox.MAX_PROCESSES


def test_a_real_fork_bomb_is_bounded_and_leaves_nothing_behind(monkeypatch):
    # the cap is the run's RLIMIT_NPROC, whatever its size (the tests above show the real
    # one binds): at 8 processes the bomb's first process gets a quarter of two cores, not a
    # 32nd, so its CPU second comes eight times sooner
    monkeypatch.setattr(sandbox, "MAX_PROCESSES", 8)
    result = run("""
        import os
        print(os.stat("/proc/self/ns/pid").st_ino, flush=True)
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, cpu_s=1, wall_s=RUN_DEADLINE_S)
    # its first process ends at its CPU limit (or, on a starved machine, at the wall clock)
    assert result["cpu_limited"] or result["timed_out"], result
    inode = int(result["stdout"].split()[0])
    deadline = time.monotonic() + RUN_DEADLINE_S
    while _processes_in_pid_namespace(inode) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_in_pid_namespace(inode) == []


def test_concurrent_runs_each_get_the_whole_cap():
    # two runs hold their processes at the same time (each waits for the host's release)
    code = """
        import os, time
        made = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(600)
                    os._exit(0)
                made += 1
        except OSError:
            open("count", "w").write(str(made))
        while not os.path.exists("release"):
            time.sleep(0.02)
    """
    dirs = [Path(tempfile.mkdtemp(prefix="agentq-test-scratch-")) for _ in range(2)]
    threads = [threading.Thread(target=run, args=(code,),
                                kwargs={"scratch_dir": str(d), "wall_s": RUN_DEADLINE_S})
               for d in dirs]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + RUN_DEADLINE_S
        while (not all((d / "count").exists() for d in dirs)
               and time.monotonic() < deadline):
            time.sleep(0.05)
        counts = [int((d / "count").read_text()) for d in dirs]
    finally:
        for d in dirs:
            (d / "release").write_text("")
        for thread in threads:
            thread.join()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    assert counts[0] == counts[1] > sandbox.MAX_PROCESSES // 2


# --- escapes ------------------------------------------------------------------------------

def test_unshare_setns_mount_and_chroot_fail():
    result = run("""
        import ctypes, os, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        def attempt(name, value):
            print(name, "ok" if value == 0 else os.strerror(ctypes.get_errno()))
        attempt("unshare-user", libc.unshare(0x10000000))
        attempt("unshare-mnt", libc.unshare(0x00020000))
        attempt("unshare-net", libc.unshare(0x40000000))
        fd = os.open("/proc/1/ns/mnt", os.O_RDONLY)
        attempt("setns", libc.setns(fd, 0))
        attempt("mount", libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None))
        attempt("chroot", libc.chroot(b"/tmp"))
        cmd = subprocess.run(["unshare", "-r", "-m", "id"], capture_output=True)
        print("unshare-cmd", cmd.returncode)
    """)
    outcome = dict(line.split(" ", 1) for line in result["stdout"].splitlines())
    assert set(outcome) == {"unshare-user", "unshare-mnt", "unshare-net", "setns", "mount",
                            "chroot", "unshare-cmd"}, result
    assert outcome.pop("unshare-cmd") != "0"
    assert "ok" not in outcome.values(), outcome


# --- truthful results ---------------------------------------------------------------------

def _code_tool():
    return next(t for t in CODE_MODULE.tools if t.name == "code.run_python").function


def test_a_cpu_bound_run_says_it_was_cpu_limited():
    from agentq.tools.manifest import ToolContext
    ctx = ToolContext(tool_use_id="t", job_id="j", user_id="u", conversation_id="c",
                      permission_level="user")
    result = _code_tool()({"code": "while True: pass", "timeout_s": 3}, ctx)
    # the tool's wall clock is 2 s above its CPU limit: on a loaded machine the wall clock
    # may stop it first; either way the result names what did (issue 9 saw neither)
    assert result["cpu_limited"] != result["timed_out"], result
    assert result["exit_signal"] == ("SIGXCPU" if result["cpu_limited"] else "SIGKILL")


def test_a_sleeping_run_says_it_timed_out():
    result = run("import time; time.sleep(600)", wall_s=2)
    assert result["timed_out"] is True and result["cpu_limited"] is False
    assert result["exit_signal"] == "SIGKILL"


def test_long_output_reaches_the_model_as_valid_json():
    from agentq.config import Settings
    from agentq.tools.manifest import ToolContext
    ctx = ToolContext(tool_use_id="t", job_id="j", user_id="u", conversation_id="c",
                      permission_level="user")
    result = _code_tool()({"code": textwrap.dedent("""
        import sys
        print("\\n".join("line %d \\"quoted\\"" % i for i in range(100000)))
        print("\\x01" * 5000, file=sys.stderr)
    """)}, ctx)
    assert result["truncated"] is True
    text = render_tool_result({"ok": True, "result": result}, Settings.tool_result_max_chars)
    seen = json.loads(text)
    assert seen == result                       # cut once, by the sandbox, and not again
    assert len(text) <= Settings.tool_result_max_chars
    assert seen["exit_code"] == 0 and seen["truncated"] is True
    assert seen["stdout"].startswith('line 0 "quoted"\nline 1')
    assert seen["stdout"].count("[truncated ") == seen["stderr"].count("[truncated ") == 1


def test_the_sandbox_is_available_here():
    # CI installs bubblewrap; without it every test above would be refused
    assert subprocess.run(["bwrap", "--version"], capture_output=True).returncode == 0
    assert sandbox.problem() is None


# --- the second line (issue 30): seccomp, the supervisor out of reach, whole-run limits ---

def _cgroups_used() -> bool:
    return os.environ.get(sandbox.CGROUP_ENV, "required") != "off"


def test_the_supervisor_cannot_be_reached_nor_its_report_forged():
    # the attack of issue 30: copy the supervisor's descriptors (pidfd_getfd, or its
    # /proc/<pid>/fd), write a report of our own on its status channel, ptrace it
    assert os.pidfd_open(os.getpid()) >= 0        # the calls exist here
    result = run(SUPERVISOR_ATTACK)
    outcome = dict(line.split(" ", 1) for line in result["stdout"].splitlines())
    assert outcome == SUPERVISOR_ATTACK_REFUSED, result
    assert result["exit_code"] == 3                # the code's own exit, not a forged one


@pytest.mark.parametrize("name, args", [
    ("io_uring_setup", (1, 0)), ("keyctl", (0, -3)),             # KEYCTL_GET_KEYRING_ID
    ("add_key", (b"user", b"agentq", b"secret", 6, -3)),          # the session keyring
    ("bpf", (0, 0, 0)), ("perf_event_open", (0, 0, -1, -1, 0)), ("userfaultfd", (0,)),
    ("unshare", (0,)), ("mount", (b"none", b"/tmp", b"tmpfs", 0, 0)),
])
def test_the_kernels_risky_calls_fail_with_eperm(name, args):
    result = run(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        value = libc.syscall({SYSCALLS[name]}, *{args!r})
        print(value, os.strerror(ctypes.get_errno()) if value < 0 else "")
    """)
    assert result["stdout"] == "-1 Operation not permitted\n", result


def test_keyrings_are_not_shared_across_runs():
    # with keyctl open, a key added to the uid's keyring by one run was read by the next
    writer = run("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.syscall(%d, b"user", b"agentq", b"secret", 6, -4),    # the user keyring
              os.strerror(ctypes.get_errno()))
    """ % SYSCALLS["add_key"])
    assert writer["stdout"] == "-1 Operation not permitted\n"


def test_proc_cmdline_of_the_host_is_not_readable():
    with open("/proc/cmdline") as f:
        assert f.read().strip()                     # the host's has something to hide
    result = run("""
        try:
            print(repr(open("/proc/cmdline").read()))
        except OSError as exc:
            print(exc.strerror)
    """)
    assert result["stdout"] in ("''\n", "Permission denied\n"), result


def test_dev_is_minimal_read_only_and_has_no_ptys():
    result = run("""
        import errno, os
        print(sorted(os.listdir("/dev")))
        for attempt in (lambda: open("/dev/new", "w"), os.openpty,
                        lambda: os.open("/dev/ptmx", os.O_RDWR)):
            try:
                attempt()
                print("ok")
            except OSError as exc:
                print(errno.errorcode[exc.errno])
        with open("/dev/null", "w") as null, open("/dev/urandom", "rb") as rnd:
            null.write("x")
            print(len(rnd.read(8)))
    """)
    lines = result["stdout"].splitlines()
    assert lines[0] == str(["fd", "full", "null", "random", "shm", "stderr", "stdin",
                            "stdout", "urandom", "zero"]), result
    assert lines[1] == "EROFS"                      # no writable /dev (it was an unsized tmpfs)
    assert lines[2:4] == ["ENOENT", "ENOENT"]       # no pty: the host's stay the host's
    assert lines[4] == "8"


def test_memory_outside_rlimit_as_is_held_to_the_runs_limit():
    # issue 30: 640 MiB held against a 256 MiB limit through memfd and /dev's tmpfs (the
    # attack's docstring says how)
    result = run(HOLD_640_MIB, memory_mb=256)
    limit_mib = sandbox._run_memory_bytes(256) // 2 ** 20
    assert held_mib(result["stdout"]) <= limit_mib, result
    if _cgroups_used():          # memfd is counted by memory.max: the run is killed there
        assert result["memory_limited"] is True, result
    else:                        # nothing would count it: memfd_create is denied
        assert result["stdout"].splitlines()[0] == "stopped EPERM", result
        assert "survived" in result["stdout"], result        # the tmpfs sizes held
    assert result["exit_code"] in (0, -9), result


def test_processes_each_under_rlimit_as_are_held_to_the_runs_memory_together():
    # RLIMIT_AS is per process: four processes of 200 MiB each fit it one by one
    result = run(FOUR_TIMES_200_MIB, memory_mb=256, wall_s=60)
    assert result["memory_limited"] is True and result["timed_out"] is False, result
    assert result["exit_signal"] == "SIGKILL"


def test_spinning_processes_stop_at_the_runs_cpu_budget(scratch_dir, monkeypatch):
    # RLIMIT_CPU is per process: a 2 CPU-s run used 4.75 CPU-s with 8 spinners. Each
    # spinner writes its own CPU time (the kernel's count, CLOCK_PROCESS_CPUTIME_ID) to a
    # file of its own every 20 ms: their sum is what the run used, measured by the code
    # itself, not by the meter that stops it. The meter's readings (the kernel's count of
    # the whole run: its processes' /proc times, or its cgroup's cpu.stat) are recorded
    readings: list[float] = []
    for meter in (sandbox_meter.ProcMeter, sandbox_meter.CgroupMeter):
        def sample(self, real=meter.sample):
            cpu_s, over_memory = real(self)
            readings.append(cpu_s)
            return cpu_s, over_memory
        monkeypatch.setattr(meter, "sample", sample)
    result = run(SPIN, cpu_s=2, wall_s=60, scratch_dir=str(scratch_dir))
    used = sum(float(p.read_text().split()[0]) for p in scratch_dir.glob("cpu-*")
               if p.read_text().strip())
    assert result["cpu_limited"] is True and result["timed_out"] is False, result
    budget = 2 + sandbox.RUN_CPU_SLACK_S
    # the meter stopped the run at its first reading at or past the whole run's budget
    # (per-process limits alone let nine processes use up to 9 x 2 CPU-s)
    assert readings and max(readings[:-1], default=0.0) < budget <= readings[-1], readings
    # and that reading was the whole run's: the spinners' own count is no more than it, but
    # for /proc's granularity (utime and stime each cut to a clock tick, per process). How
    # late the reading came (the machine's load) moves both counts alike
    granularity_s = SPINNERS * 2 / os.sysconf("SC_CLK_TCK")
    assert used <= readings[-1] + granularity_s, (used, readings[-1])
    assert used >= 1.5, used


def _rss_peak_during(action) -> tuple[int, object]:
    """How much this process's resident memory grew at most while `action` ran."""
    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("VmRSS:"))
    base, peak, done = rss(), [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.01)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outcome = action()
    finally:
        done.set()
        watcher.join()
    return max(peak[0], rss()) - base, outcome


@pytest.mark.parametrize("chunk", [
    """b'{"exit_code": 0}' * 4096""",
    # forged reports, each a line of its own: a run's answer that believed them said it was
    # CPU- and memory-limited, and one without cpu_s failed the worker with a KeyError
    """b'{"exit_code": 0, "cpu_s": 999, "memory_error": true}\\n' * 1024""",
    """b'{"exit_code": 0}\\n' * 4096""",
], ids=["one_line", "forged_reports", "forged_reports_without_cpu_s"])
def test_a_flooded_status_channel_kills_the_run_and_costs_the_worker_nothing(monkeypatch,
                                                                             chunk):
    # issue 30: 300 MiB pushed on the status pipe grew a tools-slow process by 890 MiB. The
    # code cannot reach the pipe any more (above); a supervisor that floods it stands for
    # one that could
    flooding = sandbox.SUPERVISOR.replace(
        "report(started=True)\n",
        "report(started=True)\n"
        f"chunk = {chunk}\n"
        "for _ in range(300 * 2 ** 20 // len(chunk)):\n"
        "    os.write(status, chunk)\n", 1)
    assert flooding != sandbox.SUPERVISOR
    monkeypatch.setattr(sandbox, "SUPERVISOR", flooding)
    grew, result = _rss_peak_during(lambda: run("print('never')"))
    assert result["exit_signal"] == "SIGKILL" and result["stdout"] == "", result
    # nothing that came on the flooded channel is believed
    assert not (result["cpu_limited"] or result["memory_limited"]), result
    assert grew < 32 * 2 ** 20, grew


def test_a_flooded_stdout_is_bounded_and_the_run_killed():
    grew, result = _rss_peak_during(lambda: run(FLOOD_STDOUT, wall_s=120))
    assert result["truncated"] is True and result["exit_signal"] == "SIGKILL", result
    assert "all written" not in result["stdout"]
    assert grew < 32 * 2 ** 20, grew


def test_an_unprivileged_worker_runs_the_code_as_itself_out_of_its_reach():
    # a worker that is not root cannot switch uids: the code runs as the worker's own uid,
    # and the namespaces, the filter and the non-dumpable supervisor must hold all the same
    if os.getuid() != 0:
        pytest.skip("this suite runs unprivileged: every test here is that case")
    import pyseccomp

    import agentq
    home = Path(tempfile.mkdtemp(prefix="agentq-unprivileged-"))
    try:
        shutil.copytree(os.path.dirname(agentq.__file__), home / "agentq",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(pyseccomp.__file__, home)
        for path in [home, *home.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        worker = textwrap.dedent(r'''
            import json, os
            from agentq.tools import sandbox
            result = sandbox.run_python("""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            sup = os.getppid()
            print(os.getuid())
            print("ptrace", libc.ptrace(16, sup, 0, 0), os.strerror(ctypes.get_errno()))
            try:
                os.open(f"/proc/{sup}/fd/0", os.O_RDONLY)
                print("proc_fd ok")
            except OSError as exc:
                print("proc_fd", exc.strerror)
            """, cpu_s=5, memory_mb=256, wall_s=60, max_output_chars=2000)
            print(json.dumps({"worker_uid": os.getuid(), **result}))
        ''')
        done = subprocess.run(
            ["/usr/bin/python3", "-c", worker], capture_output=True, text=True, timeout=120,
            cwd=home, user=65534, group=65534, extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(home),
                 sandbox.CGROUP_ENV: "off"})
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.splitlines()[-1])
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert result["worker_uid"] == 65534
    assert result["stdout"].splitlines() == ["65534", "ptrace -1 Operation not permitted",
                                             "proc_fd Permission denied"], result


def test_forks_sharing_their_parents_memory_count_it_once():
    # 200 MiB, then three forks that only read it: the pages are shared (copy on write), the
    # run holds 200 MiB, not 800
    result = run("""
        import os, time
        b = bytearray(200 * 2 ** 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        children = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                time.sleep(1.5)
                os._exit(sum(b[::4096]) // (50 * 1024))   # reads it all: 1
            children.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        print("done", codes)
    """, memory_mb=256, wall_s=60)
    assert result["stdout"] == "done [1, 1, 1]\n", result
    assert result["memory_limited"] is False


def test_the_code_inherits_no_descriptor_but_its_own():
    # stdin, stdout, stderr, and the wrapper's one-byte MemoryError pipe to the supervisor;
    # not the status channel, the seccomp program, bwrap's info and block pipes
    result = run("""
        import os
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
        print(sorted(n for n in fds if os.path.exists(f"/proc/self/fd/{n}")))
    """)
    assert result["stdout"] == "[0, 1, 2, 4]\n", result
