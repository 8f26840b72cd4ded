"""agentq.tools.sandbox: real child processes, real limits, real namespaces (no mocks).

These need Linux with network namespaces (root, or unprivileged user namespaces)."""
from __future__ import annotations

import errno
import json
import os
import socket
import textwrap
import time

import pytest

from agentq.errors import ToolError
from agentq.tools import sandbox
from agentq.tools.sandbox import SandboxUnavailable, run_python

LIMITS = dict(cpu_s=5, memory_mb=256, wall_s=5, max_output_chars=2000)


def run(code: str, **overrides):
    return run_python(textwrap.dedent(code), **{**LIMITS, **overrides})


def _heartbeats_stop(path) -> bool:
    """True if nothing appends to `path` any more (its writer is dead)."""
    size = path.stat().st_size
    time.sleep(0.3)
    return path.stat().st_size == size


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
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL"}
    assert "sk-test" not in result["stdout"]


def test_stdin_is_empty():
    assert run("import sys; print(repr(sys.stdin.read()))")["stdout"] == "''\n"


def test_wall_timeout_kills_a_busy_loop():
    result = run("while True: pass", cpu_s=30, wall_s=1)
    assert result["timed_out"] is True
    assert result["cpu_limited"] is False
    assert result["exit_code"] < 0


def test_cpu_limit_kills_a_busy_loop():
    result = run("while True: pass", cpu_s=1, wall_s=10)
    assert result["cpu_limited"] is True
    assert result["timed_out"] is False


def test_wall_timeout_kills_a_sleeping_child_and_its_grandchild(tmp_path):
    result = run("""
        import os, time
        if os.fork() == 0:
            os.setsid()                      # leave the process group
            while True:
                with open("beat", "a") as f:
                    f.write(".")
                time.sleep(0.02)
        print("parent sleeping", flush=True)
        time.sleep(60)
    """, wall_s=1, scratch_dir=str(tmp_path))
    assert result["timed_out"] is True
    assert result["stdout"] == "parent sleeping\n"
    assert (tmp_path / "beat").stat().st_size > 0
    assert _heartbeats_stop(tmp_path / "beat")


def test_a_grandchild_left_running_is_killed_when_the_child_exits(tmp_path):
    result = run("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            os.close(1); os.close(2)         # does not even hold our pipes
            while True:
                with open("beat", "a") as f:
                    f.write(".")
                time.sleep(0.02)
        time.sleep(0.2)
        print("bye")
    """, scratch_dir=str(tmp_path))
    assert result["exit_code"] == 0 and result["timed_out"] is False
    assert (tmp_path / "beat").stat().st_size > 0
    assert _heartbeats_stop(tmp_path / "beat")


def test_memory_limit_gives_memory_error_in_the_child():
    result = run("x = bytearray(512 * 1024 * 1024)", memory_mb=128)
    assert result["exit_code"] != 0
    assert "MemoryError" in result["stderr"]


def test_output_is_truncated_with_a_marker():
    result = run("print('x' * 10000)", max_output_chars=100)
    assert result["truncated"] is True
    assert result["stdout"] == "x" * 100 + "\n... [truncated 9901 bytes]"


def test_huge_output_is_discarded_beyond_the_cap():
    result = run("""
        import sys
        chunk = "y" * 65536
        for _ in range(800):                 # 50 MiB
            sys.stdout.write(chunk)
        print("end", file=sys.stderr)
    """, max_output_chars=50)
    assert result["exit_code"] == 0
    assert result["stdout"].startswith("y" * 50 + "\n... [truncated ")
    assert len(result["stdout"]) < 100
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
    assert lines[1] == str(errno.ENETUNREACH)


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


def test_file_system_is_read_only_outside_the_scratch_dir(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    scratch = tmp_path / "scratch"
    result = run(f"""
        import errno, os
        try:
            open({str(outside / "x")!r}, "w")
        except OSError as exc:
            print(errno.errorcode[exc.errno])
        open("inside.txt", "w").write("kept")
        print(os.getcwd())
    """, scratch_dir=str(scratch))
    assert result["stdout"].splitlines() == ["EROFS", str(scratch)]
    assert not (outside / "x").exists()
    assert (scratch / "inside.txt").read_text() == "kept"


def test_temporary_scratch_dir_is_removed():
    result = run("import os; open('f', 'w').write('1'); print(os.getcwd())")
    workdir = result["stdout"].strip()
    assert os.path.basename(workdir).startswith("agentq-sandbox-")
    assert not os.path.exists(workdir)


def test_refuses_to_run_without_network_isolation(monkeypatch, tmp_path):
    monkeypatch.delenv(sandbox.ALLOW_NETWORK_ENV, raising=False)
    monkeypatch.setattr(sandbox, "ISOLATION_MODES", (("impossible", 0x8000),))  # EINVAL
    with pytest.raises(SandboxUnavailable, match="cannot isolate the network") as info:
        run("open('ran', 'w')", scratch_dir=str(tmp_path))
    assert info.value.retryable is False
    assert not (tmp_path / "ran").exists()

    monkeypatch.setenv(sandbox.ALLOW_NETWORK_ENV, "1")
    result = run("open('ran', 'w'); print('ran')", scratch_dir=str(tmp_path))
    assert result["stdout"] == "ran\n"


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
