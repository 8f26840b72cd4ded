"""Issue 9 through the real stack: a job whose model calls `code.run_python` with code that
tries to write to the job's own database (as the reported attack did to mint an admin key),
over Postgres' Unix socket and over TCP. The model must read the refusal, and nothing may be
written: no table, no new API key."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from urllib.parse import urlsplit

from sqlalchemy import func, inspect, select

from agentq.models import ApiKey
from tests.integration.conftest import uid
from tests.security.attacks import pg_write
from tests.security.test_sandbox_attacks import PG_SOCKET
from tests.support.scripted_llm import call, text, tool_calls


def _tables(stack) -> set[str]:
    with stack.sessions()() as s:
        return set(inspect(s.get_bind()).get_table_names())


def _keys(stack) -> int:
    with stack.sessions()() as s:
        return s.execute(select(func.count()).select_from(ApiKey)).scalar_one()


def test_sandboxed_code_cannot_write_to_the_database(client, script, stack):
    database = urlsplit(stack.database_url).path.lstrip("/")
    tag = uuid.uuid4().hex[:8]
    # the attack code works where nothing stops it: run on the host, it writes
    host = subprocess.run([sys.executable, "-c", pg_write(PG_SOCKET, None, database,
                                                          f"control_{tag}")],
                          capture_output=True, text=True)
    assert host.stdout.strip() == "written", host
    assert f"control_{tag}" in _tables(stack)
    keys_before = _keys(stack)
    user = uid("u")
    assert stack.agentq("users", "set", "api", user, "--level", "user").returncode == 0
    seen = {}

    def reads_the_refusal(request):
        seen.update(json.loads([m for m in request["messages"] if m["role"] == "tool"][-1]
                               ["content"]))

    attack = (pg_write(PG_SOCKET, None, database, f"escape_socket_{tag}") + "\n"
              + pg_write(None, "127.0.0.1", database, f"escape_tcp_{tag}"))
    marker = script([tool_calls(call("code.run_python", {"code": attack})),
                     text("no luck", check=reads_the_refusal)])
    job = client.wait(client.submit(f"{marker} get in", user=user)["id"], timeout_s=120)
    assert job["status"] == "completed", job
    lines = seen["stdout"].splitlines()
    assert len(lines) == 2 and all(line.startswith("blocked:") for line in lines), seen
    assert not {f"escape_socket_{tag}", f"escape_tcp_{tag}"} & _tables(stack)
    assert _keys(stack) == keys_before
