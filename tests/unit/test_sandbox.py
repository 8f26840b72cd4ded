"""agentq.tools.sandbox: real child processes, real limits, real namespaces (no mocks).

These need Linux with user namespaces and bubblewrap (`.ci/run` installs it). The attacks
(sockets, files, fork bombs, escapes) are in tests/security/."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import textwrap
from pathlib import Path

import pytest

from agentq.errors import ToolError
from agentq.tools import sandbox, sandbox_bwrap
from agentq.tools.sandbox import SandboxUnavailable, run_python

LIMITS = dict(cpu_s=5, memory_mb=256, wall_s=120, max_output_chars=2000)
"""The wall clock is far above what any run here needs: a loaded machine never reaches it."""


def run(code: str, **overrides):
    return run_python(textwrap.dedent(code), **{**LIMITS, **overrides})


def test_captures_stdout_stderr_and_exit_code():
    result = run("""
        import sys
        print("hello")
        print("oops", file=sys.stderr)
        sys.exit(3)
    """)
    assert result["stdout"] == "hello\n"
    assert result["stderr"] == "oops\n"
    assert result["exit_code"] == 3
    assert result["timed_out"] is False and result["cpu_limited"] is False
    assert result["truncated"] is False
    assert result["duration_s"] > 0


def test_an_exception_is_a_normal_result():
    result = run("raise ValueError('bad input')")
    assert result["exit_code"] == 1
    assert "ValueError: bad input" in result["stderr"]


def test_environment_is_empty_of_our_variables(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-for-the-child")
    result = run("import json, os; print(json.dumps(dict(os.environ)))")
    env = json.loads(result["stdout"])
    assert "OPENAI_API_KEY" not in env
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PWD"}
    assert "sk-test" not in result["stdout"]


def test_stdin_is_empty():
    assert run("import sys; print(repr(sys.stdin.read()))")["stdout"] == "''\n"


def test_wall_timeout_kills_a_busy_loop():
    result = run("while True: pass", cpu_s=30, wall_s=1)
    assert result["timed_out"] is True
    assert result["cpu_limited"] is False
    assert result["exit_code"] < 0


def test_cpu_limit_kills_a_busy_loop():
    # the wall clock is far above the CPU limit: a loaded machine cannot reach it first
    result = run("while True: pass", cpu_s=1, wall_s=120)
    assert result["cpu_limited"] is True
    assert result["timed_out"] is False
    assert result["exit_signal"] == "SIGXCPU"


def test_cpu_limit_holds_when_sigxcpu_is_ignored():
    result = run("""
        import signal
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        while True: pass
    """, cpu_s=1, wall_s=120)
    assert result["cpu_limited"] is True and result["timed_out"] is False
    assert result["exit_signal"] == "SIGKILL"


def test_a_normal_kill_is_not_reported_as_a_limit():
    result = run("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", wall_s=120)
    assert result["exit_signal"] == "SIGTERM" and result["exit_code"] == -15
    assert result["cpu_limited"] is False and result["timed_out"] is False
    assert result["memory_limited"] is False


def test_wall_timeout_kills_a_sleeping_child_and_its_grandchild(scratch_dir):
    # given code that leaves a grandchild of its own session holding a lock on a file of the
    # scratch directory (a lock dies with its holder, and only then), then sleeps past its
    # wall limit
    result = run("""
        import fcntl, os, time
        if os.fork() == 0:
            os.setsid()                      # leave the process group
            f = open("held", "w")
            fcntl.flock(f, fcntl.LOCK_EX)
            open("locked", "w").close()
            while True:
                time.sleep(1)
        while not os.path.exists("locked"):
            time.sleep(0.01)
        print("parent sleeping", flush=True)
        time.sleep(600)
    """, wall_s=30, scratch_dir=str(scratch_dir))  # the sandbox's start-up fits on a loaded machine
    assert result["timed_out"] is True
    assert result["stdout"] == "parent sleeping\n"
    # then, the moment the run has answered, the grandchild is dead too: its lock is free
    # (a grandchild that outlived its parent and its own process group is what
    # test_what_the_code_left_running_is_gone_when_the_run_answers shows without a timeout)
    with open(scratch_dir / "held") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_memory_limit_gives_memory_error_in_the_child():
    result = run("x = bytearray(512 * 1024 * 1024)", memory_mb=128)
    assert result["exit_code"] != 0
    assert "MemoryError" in result["stderr"]
    assert result["memory_limited"] is True and result["cpu_limited"] is False


def test_a_caught_memory_error_is_not_a_limit():
    result = run("""
        try:
            x = bytearray(512 * 1024 * 1024)
        except MemoryError:
            print("coped")
    """, memory_mb=128)
    assert result["stdout"] == "coped\n" and result["exit_code"] == 0
    assert result["memory_limited"] is False


def test_output_is_truncated_with_a_marker():
    result = run("print('x' * 10000)", max_output_chars=100)
    assert result["truncated"] is True
    marker = "\n... [truncated 9929 bytes]"
    assert result["stdout"] == "x" * 72 + marker
    assert len(json.dumps(result["stdout"])) - 2 == 100  # the marker's newline takes 2


def test_output_is_cut_by_its_length_as_json():
    result = run("""
        import sys
        sys.stdout.write("\\x01" * 3000)
        sys.stderr.write("é\\"" * 3000)
    """, max_output_chars=1000)
    assert result["truncated"] is True
    for name, each in (("stdout", 6), ("stderr", 1.5)):
        text = result[name]
        assert len(json.dumps(text, ensure_ascii=False)) - 2 <= 1000
        kept = text[:text.index("\n... [truncated ")]
        assert 1000 - 40 <= len(json.dumps(kept, ensure_ascii=False)) - 2  # not cut short
        assert len(kept) == int(len(json.dumps(kept, ensure_ascii=False)) - 2) / each


def test_streams_share_a_total_one_taking_what_the_other_leaves():
    result = run("""
        import sys
        print("short")
        sys.stderr.write("e" * 5000)
    """, max_output_chars=1000, max_output_total_chars=1000)
    assert result["stdout"] == "short\n"
    assert (len(json.dumps(result["stdout"])) + len(json.dumps(result["stderr"])) - 4
            <= 1000)
    assert len(result["stderr"]) > 900
    both = run("import sys; print('o' * 5000); sys.stderr.write('e' * 5000)",
               max_output_chars=1000, max_output_total_chars=1000)
    assert 450 < len(both["stdout"]) <= 500 and 450 < len(both["stderr"]) <= 500


@pytest.mark.parametrize("stdout,stderr,cut", [
    ("print('ok')", "sys.stderr.write('\\x01' * 3000)", ["stderr"]),  # 18,000 as JSON
    ("print('ü€😀' * 4000)", "sys.stderr.write('\\x01\\x02' * 1500)", ["stdout", "stderr"]),
    ("print('\"\\\\' * 9000)", "sys.stderr.write('\\x1b[31m' * 3000)", ["stdout", "stderr"]),
    ("sys.stdout.buffer.write(bytes(range(256)) * 100)", "pass", ["stdout"]),
])
def test_the_code_tools_result_is_cut_once_and_fits_the_tool_result_budget(stdout, stderr,
                                                                           cut):
    """Issue 9: output cut by the sandbox and then again by the tool-result fitting gave the
    model two markers (the second one wrong). The code tool sizes the streams by their JSON
    length so that the result fits AGENTQ_TOOL_RESULT_MAX_CHARS as it is."""
    import re

    from agentq.config import Settings
    from agentq.loop.context import render_tool_result
    from agentq.tools.manifest import ToolContext
    from tool_workers.code import MODULE
    tool = next(t for t in MODULE.tools if t.name == "code.run_python").function
    settings = Settings.from_env({})
    ctx = ToolContext(tool_use_id="t", job_id="j", user_id="u", conversation_id="c",
                      permission_level="user", extra={"settings": settings})
    result = tool({"code": f"import sys\n{stdout}\n{stderr}\n"}, ctx)
    assert result["exit_code"] == 0 and result["truncated"] is True
    seen = render_tool_result({"ok": True, "result": result}, settings.tool_result_max_chars)
    assert len(seen) <= settings.tool_result_max_chars
    assert json.loads(seen) == result                   # the sandbox's result, not cut again
    assert "preview" not in json.loads(seen)
    marker = re.compile(r"\[truncated \d+ (?:bytes|chars)\]")
    assert len(marker.findall(seen)) == len(cut)       # one marker for each stream cut
    for name in ("stdout", "stderr"):
        assert len(marker.findall(result[name])) == (name in cut)
    assert "chars]" not in seen                        # none from the tool-result fitting


def test_huge_output_is_discarded_beyond_the_cap():
    result = run("""
        import sys
        chunk = "y" * 65536
        for _ in range(800):                 # 50 MiB
            sys.stdout.write(chunk)
        print("end", file=sys.stderr)
    """, max_output_chars=60)
    assert result["exit_code"] == 0
    assert result["stdout"] == "y" * 28 + f"\n... [truncated {50 * 2 ** 20 - 28} bytes]"
    assert len(json.dumps(result["stdout"])) - 2 == 60
    assert result["stderr"] == "end\n"


def test_file_size_limit():
    result = run("""
        try:
            with open("big", "wb") as f:
                f.write(b"0" * (32 * 1024 * 1024))
        except OSError as exc:
            print(exc.errno)
    """)
    assert result["stdout"] == f"{errno.EFBIG}\n"


def test_network_is_isolated():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # reachable from here
        result = run(f"""
            import socket
            print(sorted(name for _, name in socket.if_nameindex()))
            s = socket.socket()
            try:
                s.connect(("127.0.0.1", {port}))
                print("connected")
            except OSError as exc:
                print(exc.errno)
        """)
    lines = result["stdout"].splitlines()
    assert lines[0] == "['lo']"
    # only the sandbox's own loopback is up: nothing listens there
    assert lines[1] in (str(errno.ENETUNREACH), str(errno.ECONNREFUSED))


def test_cannot_see_or_signal_our_processes():
    result = run(f"""
        import os
        try:
            os.kill({os.getpid()}, 0)
            print("visible")
        except ProcessLookupError:
            print("invisible")
        print(os.path.exists("/proc/{os.getpid()}/environ"))
    """)
    assert result["stdout"] == "invisible\nFalse\n"


def test_file_system_is_read_only_outside_the_scratch_dir(scratch_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    result = run(f"""
        import errno, os
        for path in ({str(outside / "x")!r}, "/usr/x", "/x"):
            try:
                open(path, "w")
                print("written")
            except OSError as exc:
                print(errno.errorcode[exc.errno])
        open("inside.txt", "w").write("kept")
        open("/tmp/private.txt", "w").write("tmp")
        print(os.getcwd())
    """, scratch_dir=str(scratch_dir))
    lines = result["stdout"].splitlines()
    assert lines[0] == "ENOENT"                  # the host's other directories are not there
    assert lines[1] in ("EROFS", "EACCES") and lines[2] in ("EROFS", "EACCES")
    assert lines[3] == str(scratch_dir)
    assert not (outside / "x").exists()
    assert (scratch_dir / "inside.txt").read_text() == "kept"


def test_writing_past_the_scratch_or_tmp_size_fails_inside_the_code():
    result = run("""
        import errno, os
        for where in (".", "/tmp"):
            written = 0
            try:
                for i in range(100):     # files of 8 MiB, each under the file-size limit
                    with open(os.path.join(where, f"part{i}"), "wb") as out:
                        for _ in range(8):
                            out.write(b"0" * 2 ** 20)
                            written += 2 ** 20
            except OSError as exc:
                print(where, errno.errorcode[exc.errno], written // 2 ** 20)
            else:
                print(where, "all written")
    """)
    scratch_mb = sandbox_bwrap.SCRATCH_SIZE_BYTES // 2 ** 20
    tmp_mb = sandbox_bwrap.TMP_SIZE_BYTES // 2 ** 20
    assert result["exit_code"] == 0, result
    assert result["stdout"].splitlines() == [f". ENOSPC {scratch_mb}", f"/tmp ENOSPC {tmp_mb}"]


def test_the_code_tool_says_when_the_scratch_is_full():
    from agentq.config import Settings
    from agentq.tools.manifest import ToolContext
    from tool_workers.code import MODULE
    tool = next(t for t in MODULE.tools if t.name == "code.run_python").function
    ctx = ToolContext(tool_use_id="t", job_id="j", user_id="u", conversation_id="c",
                      permission_level="user", extra={"settings": Settings.from_env({})})
    result = tool({"code": textwrap.dedent("""
        for i in range(100):
            open(f"part{i}", "wb").write(b"0" * 2 ** 23)
    """)}, ctx)
    assert result["exit_code"] == 1
    assert "OSError: [Errno 28] No space left on device" in result["stderr"]


def test_input_files_are_in_the_scratch_read_only(scratch_dir):
    inputs = scratch_dir
    (inputs / "data.csv").write_text("a,b\n1,2\n")
    result = run("""
        import errno, os
        print(sorted(os.listdir(".")), open("data.csv").read().splitlines()[1])
        try:
            open("data.csv", "a").write("3,4")
        except OSError as exc:
            print(errno.errorcode[exc.errno])
        open("out.txt", "w").write("mine")
        print(open("out.txt").read())
    """, input_dir=str(inputs))
    lines = result["stdout"].splitlines()
    assert lines[0] == "['data.csv'] 1,2"
    assert lines[1] in ("EROFS", "EACCES")
    assert lines[2] == "mine"
    assert (inputs / "data.csv").read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in inputs.iterdir()) == ["data.csv"]


def test_temporary_scratch_dir_is_removed():
    result = run("import os; open('f', 'w').write('1'); print(os.getcwd())")
    workdir = result["stdout"].strip()
    assert os.path.basename(workdir).startswith("agentq-sandbox-")
    assert not os.path.exists(workdir)


def test_refuses_to_run_without_bubblewrap(monkeypatch, scratch_dir):
    monkeypatch.setenv(sandbox_bwrap.BWRAP_ENV, "/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="bubblewrap") as info:
        run("open('ran', 'w')", scratch_dir=str(scratch_dir))
    assert info.value.retryable is False
    assert not (scratch_dir / "ran").exists()


def test_refuses_when_bubblewrap_cannot_set_up(monkeypatch, scratch_dir):
    fake = scratch_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    scratch_dir.chmod(0o755)  # the sandbox's uid starts it
    monkeypatch.setenv(sandbox_bwrap.BWRAP_ENV, str(fake))
    with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace"):
        run("open('ran', 'w')", scratch_dir=str(scratch_dir / "run"))
    assert not (scratch_dir / "run" / "ran").exists()


def test_problem_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(sandbox, "_probe_cache", None)
    assert sandbox.problem() is None
    monkeypatch.setattr(sandbox, "_probe_cache", None)
    monkeypatch.setenv(sandbox_bwrap.PYTHON_ENV, "/opt/nowhere/python3")
    assert "not an executable under /usr" in sandbox.problem()


@pytest.mark.parametrize("code, message", [
    ("print('a\x00')", "NUL"),
    ("print('\ud800')", "surrogate"),
    ("#" * 200_000, "limit"),
])
def test_rejects_code_that_cannot_be_passed(code, message):
    with pytest.raises(ToolError, match=message) as info:
        run_python(code, **LIMITS)
    assert info.value.retryable is False


def test_rejects_nonsense_limits():
    with pytest.raises(ValueError, match="wall_s"):
        run_python("pass", **{**LIMITS, "wall_s": 0})


def test_runs_from_a_helper_thread_like_the_registry():
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run_python, f"print({i})", **LIMITS) for i in range(4)]
        assert [f.result()["stdout"] for f in futures] == [f"{i}\n" for i in range(4)]


def test_what_the_code_left_running_is_gone_when_the_run_answers(scratch_dir):
    # given code that leaves a grandchild holding a lock on a file of the scratch directory
    # (a lock dies with its holder, and only then)
    result = run("""
        import fcntl, os, time
        if os.fork() == 0:
            os.setsid()
            os.close(1); os.close(2)
            f = open("held", "w")
            fcntl.flock(f, fcntl.LOCK_EX)
            open("locked", "w").close()
            while True:
                time.sleep(1)
        while not os.path.exists("locked"):
            time.sleep(0.01)
    """, scratch_dir=str(scratch_dir))
    assert result["exit_code"] == 0 and result["timed_out"] is False
    # then, the moment the run has answered, its holder is dead: the lock is free at once
    with open(scratch_dir / "held") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


# --- per-run cgroups (agentq.tools.cgroups) on a cgroup v2 tree laid out as the kernel's ---

def _fake_cgroupfs(root, *, controllers="cpuset cpu io memory hugetlb pids rdma",
                   procs=(101, 102), name="svc"):
    """A directory shaped like a delegated cgroup v2 group (`/<name>`; "" for the top of the
    hierarchy, a container's own) at the start: the controllers offered, none enabled for
    children, the service's processes in it."""
    base = root / name
    base.mkdir(parents=True, exist_ok=True)
    (base / "cgroup.controllers").write_text(controllers + "\n")
    (base / "cgroup.subtree_control").write_text("")
    (base / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
    return base


@pytest.fixture
def kernel_writes(tmp_path, monkeypatch):
    """cgroups' writes, recorded ((path below tmp_path, value)) and answered as the kernel
    does: a pid written to a group's cgroup.procs leaves the base group's; controllers are
    not enabled for the children of a group that still holds processes (EBUSY, cgroup v2's
    no-internal-process rule)."""
    from agentq.tools import cgroups
    written: list[tuple[str, str]] = []
    real_write = cgroups._write

    def write(path, value):
        written.append((os.path.relpath(path, tmp_path), value))
        here = Path(path).parent
        if path.endswith("cgroup.procs") and (here.parent / "cgroup.procs").is_file():
            left = here.parent / "cgroup.procs"
            left.write_text("".join(f"{p}\n" for p in left.read_text().split()
                                    if p != value))
        if path.endswith("cgroup.subtree_control") and (here / "cgroup.procs").read_text():
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        real_write(path, value)
    monkeypatch.setattr(cgroups, "_write", write)
    return written


def test_cgroup_setup_moves_the_service_to_a_leaf_then_enables_the_controllers(
        tmp_path, kernel_writes):
    from agentq.tools import cgroups
    base = _fake_cgroupfs(tmp_path)
    found = cgroups.setup(mount=str(tmp_path), path="/svc")
    assert found == cgroups.Hierarchy(str(base))
    assert kernel_writes == [("svc/agentq-worker/cgroup.procs", "101"),
                             ("svc/agentq-worker/cgroup.procs", "102"),
                             ("svc/cgroup.subtree_control", "+memory +pids +cpu")]
    # a pool process started later, already in the leaf, finds it done
    (base / "cgroup.subtree_control").write_text("cpu memory pids\n")
    kernel_writes.clear()
    assert cgroups.setup(mount=str(tmp_path), path="/svc/agentq-worker") == found
    assert kernel_writes == []


def test_cgroup_setup_at_the_top_of_the_hierarchy_moves_only_this_process(tmp_path,
                                                                          kernel_writes):
    # a container's own cgroup: its other processes are not ours to move
    from agentq.tools import cgroups
    me = str(os.getpid())
    base = _fake_cgroupfs(tmp_path, procs=(int(me),), name="")
    assert cgroups.setup(mount=str(tmp_path), path="/") == cgroups.Hierarchy(str(base))
    assert kernel_writes == [("agentq-worker/cgroup.procs", me),
                             ("cgroup.subtree_control", "+memory +pids +cpu")]
    # another process there: the controllers cannot be enabled, and it says so
    (base / "cgroup.procs").write_text(f"{me}\n4242\n")
    (base / "cgroup.subtree_control").write_text("")
    with pytest.raises(cgroups.CgroupUnavailable, match="keeps processes of its own"):
        cgroups.setup(mount=str(tmp_path), path="/")
    assert (base / "cgroup.procs").read_text() == "4242\n"


def test_a_runs_group_gets_its_limits_and_reports_cpu_and_oom(tmp_path):
    from agentq.tools import cgroups
    base = _fake_cgroupfs(tmp_path)
    group = cgroups.RunGroup(cgroups.Hierarchy(str(base)),
                             memory_bytes=320 * 2 ** 20, max_pids=64)
    path = Path(group.path)
    assert path.parent == base and path.name.startswith("agentq-run-")
    assert {f.name: f.read_text() for f in path.iterdir()} == {
        "memory.max": str(320 * 2 ** 20), "memory.swap.max": "0", "memory.oom.group": "1",
        "pids.max": "64", "cpu.max": "100000 100000"}
    (path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2400000\n")
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert group.cpu_s() == 2.5 and group.oom_killed() is True
    group.add(4242)
    assert (path / "cgroup.procs").read_text() == "4242"


def _as_our_cgroups(monkeypatch, root, path="/svc"):
    """The sandbox takes the tree under `root` for this process's cgroup v2 delegation."""
    from agentq.tools import cgroups
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: str(root))
    monkeypatch.setattr(cgroups, "own_path", lambda: path)
    monkeypatch.setattr(cgroups, "_ready", {})
    monkeypatch.setenv(sandbox.CGROUP_ENV, "required")


def test_a_run_goes_into_a_group_of_its_own_before_its_code_runs(
        tmp_path, monkeypatch, kernel_writes, scratch_dir):
    # this machine's cgroups may not be delegable: a v2 tree of files stands for them
    from agentq.tools import cgroups
    _fake_cgroupfs(tmp_path)
    _as_our_cgroups(monkeypatch, tmp_path)
    ran_when_moved: list[bool] = []
    recorded = cgroups._write

    def write(path, value):
        if path.endswith("cgroup.procs"):
            ran_when_moved.append((scratch_dir / "ran").exists())
        recorded(path, value)
    monkeypatch.setattr(cgroups, "_write", write)
    result = run("import os; os.memfd_create('x'); open('ran', 'w'); print('ran')",
                 memory_mb=128, scratch_dir=str(scratch_dir))
    assert result["stdout"] == "ran\n", result   # memfd is allowed: memory.max counts it
    assert not (result["cpu_limited"] or result["memory_limited"]), result
    runs = [(path, value) for path, value in kernel_writes
            if path.startswith("svc/agentq-run-")]
    group = runs[0][0].split("/")[1]
    assert [(path.split("/")[2], value) for path, value in runs[:5]] == [
        ("memory.max", str(sandbox._run_memory_bytes(128))), ("memory.swap.max", "0"),
        ("memory.oom.group", "1"), ("pids.max", str(sandbox.MAX_PROCESSES)),
        ("cpu.max", f"{cgroups.RUN_CPUS * cgroups.CPU_PERIOD_US} {cgroups.CPU_PERIOD_US}")]
    # bwrap and its sandbox's pid 1, each moved in before the code ran (after the service's
    # two processes went to the leaf at set-up)
    moved = runs[5:]
    assert [path for path, _ in moved] == [f"svc/{group}/cgroup.procs"] * 2, runs
    assert len({int(pid) for _, pid in moved}) == 2, moved
    assert ran_when_moved == [False] * 4 and (scratch_dir / "ran").exists()


def test_a_worker_prepares_the_sandbox_at_start(tmp_path, monkeypatch, kernel_writes,
                                                caplog):
    # tasks.app's worker_init hook, in the tools-slow worker before its pool forks
    from agentq.tools import cgroups
    base = _fake_cgroupfs(tmp_path)
    (base / "agentq-run-dead").mkdir()                  # a run of a worker that died
    _as_our_cgroups(monkeypatch, tmp_path)
    with caplog.at_level("INFO", logger=sandbox.__name__):
        sandbox.prepare()
    assert ("svc/cgroup.subtree_control", "+memory +pids +cpu") in kernel_writes
    assert not (base / "agentq-run-dead").exists()
    assert [(r.getMessage(), r.cgroup) for r in caplog.records] == [("sandbox ready",
                                                                     str(base))]
    # where the delegation is impossible it says why, and does not raise (the worker runs
    # its other tools; each code run refuses, saying so too)
    caplog.clear()
    monkeypatch.setattr(cgroups, "_ready", {})
    (base / "cgroup.controllers").write_text("hugetlb\n")
    with caplog.at_level("INFO", logger=sandbox.__name__):
        sandbox.prepare()
    assert [r.getMessage() for r in caplog.records] == ["sandbox unavailable at start"]
    assert "no memory/pids/cpu controller" in caplog.records[0].problem


@pytest.mark.parametrize("counter, content, limited", [
    ("cpu.stat", "usage_usec 999000000\n", "cpu_limited"),
    ("memory.events", "oom 1\noom_kill 1\n", "memory_limited"),
])
def test_a_runs_group_says_when_it_spent_its_cpu_or_was_oom_killed(
        tmp_path, monkeypatch, kernel_writes, scratch_dir, counter, content, limited):
    # the kernel's counts in the run's group: past its CPU budget the meter kills the run;
    # an OOM kill in it is memory_limited
    from agentq.tools import cgroups
    _fake_cgroupfs(tmp_path)
    _as_our_cgroups(monkeypatch, tmp_path)
    made = cgroups.RunGroup.__init__

    def with_counts(self, *args, **kwargs):
        made(self, *args, **kwargs)
        Path(self.path, counter).write_text(content)
    monkeypatch.setattr(cgroups.RunGroup, "__init__", with_counts)
    # (a run that would outlast its wall clock: only the meter's kill ends it in time; when
    # the meter reads first, against when the code starts, depends on the machine's load)
    result = run("import time; time.sleep(3600); open('ran', 'w')"
                 if limited == "cpu_limited" else "print('ran')",
                 scratch_dir=str(scratch_dir), wall_s=60)
    assert result[limited] is True and result["timed_out"] is False, result
    if limited == "cpu_limited":                 # killed by the meter, not the wall clock
        assert result["exit_signal"] == "SIGKILL", result
        assert not (scratch_dir / "ran").exists()
    else:
        assert result["stdout"] == "ran\n", result


@pytest.mark.parametrize("controllers, reason", [
    ("hugetlb", "no memory/pids/cpu controller (it offers hugetlb): on a hybrid host"),
    ("cpu memory", "no pids controller"),
])
def test_the_sandbox_refuses_to_run_without_its_cgroups(tmp_path, monkeypatch, scratch_dir,
                                                        controllers, reason):
    from agentq.tools import cgroups
    _fake_cgroupfs(tmp_path, controllers=controllers)
    _as_our_cgroups(monkeypatch, tmp_path)
    with pytest.raises(SandboxUnavailable, match=re.escape(reason)) as info:
        run("open('ran', 'w')", scratch_dir=str(scratch_dir))
    assert "The code was not run" in str(info.value)
    assert not (scratch_dir / "ran").exists()
    assert cgroups.check() is not None


def test_this_machines_cgroups_are_used_where_it_has_them():
    # the suite runs with AGENTQ_SANDBOX_CGROUP=off only where cgroup v2 cannot be delegated
    # (tests/conftest.py); there the default refuses, and says why
    from agentq.tools import cgroups
    problem = cgroups.check()
    assert (os.environ.get(sandbox.CGROUP_ENV) == "off") == (problem is not None)


def test_an_unknown_cgroup_mode_is_refused(monkeypatch):
    monkeypatch.setenv(sandbox.CGROUP_ENV, "sometimes")
    with pytest.raises(SandboxUnavailable, match="`required` or `off`"):
        run("print(1)")


def test_the_seccomp_filter_is_required(monkeypatch, scratch_dir):
    from agentq.tools import seccomp

    def missing(deny_memfd):
        raise seccomp.SeccompUnavailable("libseccomp's Python binding cannot be loaded")
    monkeypatch.setattr(seccomp, "program", missing)
    with pytest.raises(SandboxUnavailable, match="seccomp filter cannot be loaded"):
        run("open('ran', 'w')", scratch_dir=str(scratch_dir))
    assert not (scratch_dir / "ran").exists()


def test_the_seccomp_program_is_a_bpf_program_denying_the_list():
    from agentq.tools import seccomp
    for deny_memfd in (False, True):
        program = seccomp.program(deny_memfd)
        assert len(program) % 8 == 0 and len(program) > 8 * len(seccomp.DENIED)
    assert "memfd_create" in seccomp.denied(True)
    assert "memfd_create" not in seccomp.denied(False)


def test_the_process_that_starts_the_sandbox_is_not_dumpable():
    # no process of the sandbox's uid (or of ours, when we are not root) may ptrace it or
    # open its descriptors through /proc/<pid>/fd
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 1, 0, 0, 0)                         # PR_SET_DUMPABLE 1, as a fresh process
    try:
        run("print(1)")
        assert libc.prctl(3, 0, 0, 0, 0) == 0         # PR_GET_DUMPABLE
    finally:
        libc.prctl(4, 1, 0, 0, 0)


def test_a_dead_workers_empty_run_groups_are_removed_at_start(tmp_path):
    from agentq.tools import cgroups
    base = _fake_cgroupfs(tmp_path)
    (base / "agentq-run-dead").mkdir()                  # empty: its run died with its worker
    busy = base / "agentq-run-busy"
    busy.mkdir()
    (busy / "cgroup.procs").write_text("4242\n")        # a directory rmdir cannot remove
    (base / "agentq-worker").mkdir()
    assert cgroups.remove_stale(cgroups.Hierarchy(str(base))) == 1
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == ["agentq-run-busy",
                                                                     "agentq-worker"]


def test_the_readiness_probe_checks_the_cgroups_without_rearranging_them(monkeypatch,
                                                                          tmp_path):
    # the probe runs in the API's process: its cgroup is not the worker's to set up
    from agentq.tools import cgroups
    monkeypatch.setattr(sandbox, "_probe_cache", None)
    monkeypatch.setenv(sandbox.CGROUP_ENV, "required")
    calls = []
    monkeypatch.setattr(cgroups, "setup", lambda *a, **k: calls.append("setup"))
    monkeypatch.setattr(cgroups, "check", lambda *a, **k: "no memory controller (test)")
    assert "no memory controller (test)" in sandbox.problem()
    assert calls == []
