"""Issue 9 through the real stack: a job whose model calls `code.run_python` with code that
tries to write to the job's own database (as the reported attack did to mint an admin key),
over Postgres' Unix socket and over TCP. The model must read the refusal, and nothing may be
written: no table, no new API key."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit

from sqlalchemy import func, inspect, select

from agentq.models import ApiKey
from agentq.testing.scripted_llm import call, text, tool_calls
from agentq.tools import sandbox
from tests.support.api import uid
from tests.support.attacks import (
    FLOOD_STDOUT,
    HOLD_640_MIB,
    SUPERVISOR_ATTACK,
    SUPERVISOR_ATTACK_REFUSED,
    held_mib,
    pg_write,
)
from tool_workers.code import MEMORY_MB


def _tables(stack) -> set[str]:
    with stack.sessions()() as s:
        return set(inspect(s.get_bind()).get_table_names())


def _keys(stack) -> int:
    with stack.sessions()() as s:
        return s.execute(select(func.count()).select_from(ApiKey)).scalar_one()


def _server_of(stack) -> tuple[str, int]:
    """The Unix socket and TCP port of the server the stack's database lives on (the
    suite's own cluster since issue 32, or the machine's), as it says itself."""
    from sqlalchemy import text as sql
    with stack.sessions()() as s:
        directory = s.execute(sql("SHOW unix_socket_directories")).scalar_one()
        port = int(s.execute(sql("SHOW port")).scalar_one())
    return f"{directory.split(',')[0].strip()}/.s.PGSQL.{port}", port


def _tool_result(request) -> dict:
    return json.loads([m for m in request["messages"] if m["role"] == "tool"][-1]["content"])


def test_sandboxed_code_cannot_write_to_the_database(client, script, stack):
    database = urlsplit(stack.database_url).path.lstrip("/")
    tag = uuid.uuid4().hex[:8]
    socket_path, port = _server_of(stack)
    # the attack code works where nothing stops it: run on the host, it writes
    host = subprocess.run([sys.executable, "-c", pg_write(socket_path, None, database,
                                                          f"control_{tag}", port)],
                          capture_output=True, text=True)
    assert host.stdout.strip() == "written", host
    assert f"control_{tag}" in _tables(stack)
    keys_before = _keys(stack)
    user = uid("u")
    assert stack.agentq("users", "set", "api", user, "--level", "user").returncode == 0
    seen = {}
    attack = (pg_write(socket_path, None, database, f"escape_socket_{tag}", port) + "\n"
              + pg_write(None, "127.0.0.1", database, f"escape_tcp_{tag}", port))
    marker = script([tool_calls(call("code.run_python", {"code": attack})),
                     text("no luck", check=lambda r: seen.update(_tool_result(r)))])
    job = client.wait(client.submit(f"{marker} get in", user=user)["id"], timeout_s=120)
    assert job["status"] == "completed", job
    lines = seen["stdout"].splitlines()
    assert len(lines) == 2 and all(line.startswith("blocked:") for line in lines), seen
    assert not {f"escape_socket_{tag}", f"escape_tcp_{tag}"} & _tables(stack)
    assert _keys(stack) == keys_before


def test_the_code_cannot_reach_its_supervisor_through_the_stack(client, script, stack):
    # issue 30: the code copied the supervisor's descriptors and forged how the run ended
    user = uid("u")
    assert stack.agentq("users", "set", "api", user, "--level", "user").returncode == 0
    seen = {}
    marker = script([tool_calls(call("code.run_python", {"code": SUPERVISOR_ATTACK})),
                     text("no luck", check=lambda r: seen.update(_tool_result(r)))])
    job = client.wait(client.submit(f"{marker} take over", user=user)["id"],
                      timeout_s=120)
    assert job["status"] == "completed", job
    assert "stdout" in seen, seen
    outcome = dict(line.split(" ", 1) for line in seen["stdout"].splitlines())
    assert outcome == SUPERVISOR_ATTACK_REFUSED, seen
    assert seen["exit_code"] == 3, seen       # the code's own end, as the model reads it


def test_the_tools_worker_runs_no_code_without_its_cgroups(llm, script, tmp_path_factory):
    """With the default (`required`): on a host that cannot delegate cgroup v2 (this one, if
    a hybrid v1 host) the model reads `sandbox_unavailable` naming why and /health/ready
    says `sandbox` is down; on one that can, the run works and the tools-slow worker has
    moved itself into its leaf group, the runs' groups beside it."""
    from agentq.tools import cgroups
    from tests.support.api import TEST_ENV, Client
    from tests.support.stack import own_stack
    problem = cgroups.check()
    env = {**TEST_ENV, "AGENTQ_SANDBOX_CGROUP": "required"}
    with own_stack("cgroups", llm.base_url, tmp_path_factory.mktemp("cgroups"), env,
                   workers=("orchestrator", "tools-slow")) as stack:
        client = Client(stack, stack.create_key("cgroups", admin=True))
        user = uid("u")
        assert stack.agentq("users", "set", "api", user, "--level", "user").returncode == 0
        seen = {}
        marker = script([tool_calls(call("code.run_python",
                                         {"code": "open('ran', 'w'); print('ran')"})),
                         text("done", check=lambda r: seen.update(_tool_result(r)))])
        job = client.wait(client.submit(f"{marker} run it", user=user)["id"],
                          timeout_s=120)
        assert job["status"] == "completed", job
        ready = client.get("/health/ready")
        if problem is not None:
            assert seen["error"]["code"] == "sandbox_unavailable", seen
            assert "cgroup" in seen["error"]["message"], seen
            assert "The code was not run" in seen["error"]["message"], seen
            assert ready.status_code == 503, ready.text
            assert "sandbox" in ready.json()["down"]
            assert "cgroup" in ready.json()["error"]["details"]["sandbox"]
        else:
            assert seen["stdout"] == "ran\n", seen
            assert ready.status_code == 200, ready.text
            with open(f"/proc/{stack.procs['tools-slow'].pid}/cgroup") as f:
                assert f.read().rstrip().endswith(f"/{cgroups.LEAF}")


def test_floods_through_the_stack_grow_neither_the_worker_nor_the_hosts_memory(
        client, script, stack):
    # issue 30: 300 MiB on a pipe grew a tools-slow process by 890 MiB; 640 MiB held in
    # memfd and /dev's tmpfs against a 256 MiB limit. Watched from outside while the real
    # tools-slow worker runs them: its processes' memory, and the host's shared memory
    import psutil
    worker = psutil.Process(stack.procs["tools-slow"].pid)

    def worker_rss() -> dict[int, int]:
        """The worker's processes (its pool's, not the sandboxes'): pid -> resident bytes."""
        sizes = {}
        for p in [worker, *worker.children()]:
            try:
                if "bwrap" not in p.name():
                    sizes[p.pid] = p.memory_info().rss
            except psutil.Error:
                pass
        return sizes

    def shmem() -> int:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("Shmem:"))
    user = uid("u")
    assert stack.agentq("users", "set", "api", user, "--level", "user").returncode == 0
    seen: list[dict] = []
    marker = script([tool_calls(call("code.run_python", {"code": FLOOD_STDOUT})),
                     tool_calls(call("code.run_python", {"code": HOLD_640_MIB}),
                                check=lambda r: seen.append(_tool_result(r))),
                     text("done", check=lambda r: seen.append(_tool_result(r)))])
    base_rss, base_shmem = worker_rss(), shmem()
    peak_rss, peak = dict(base_rss), {"shmem": base_shmem}
    done = threading.Event()

    def watch():
        while not done.is_set():
            for pid, size in worker_rss().items():
                base_rss.setdefault(pid, size)   # a pool process started meanwhile
                peak_rss[pid] = max(peak_rss.get(pid, 0), size)
            peak["shmem"] = max(peak["shmem"], shmem())
            time.sleep(0.02)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        job = client.wait(client.submit(f"{marker} flood", user=user)["id"], timeout_s=180)
    finally:
        done.set()
        watcher.join()
    assert job["status"] == "completed", job
    flood, hold = seen
    assert flood["truncated"] is True and flood["exit_signal"] == "SIGKILL", flood
    assert "all written" not in flood["stdout"]
    # the code tool's 256 MiB and the run's overhead (its interpreters, bwrap, its tmpfs)
    assert held_mib(hold["stdout"]) <= sandbox._run_memory_bytes(MEMORY_MB) // 2 ** 20, hold
    # each pool process: a cold one's first task imports what it needs (tens of MiB), an
    # unbounded channel would have added the flood (300 MiB, 890 MiB seen in issue 30)
    grew = {pid: size - base_rss[pid] for pid, size in peak_rss.items()}
    assert max(grew.values()) < 128 * 2 ** 20, grew
    # what the run could hold in shared memory is its tmpfs sizes (96 MiB); other tests'
    # processes on this machine may add some meanwhile, never the 640 MiB tried
    assert peak["shmem"] - base_shmem < 320 * 2 ** 20, (peak, base_shmem)
