"""The suite keeps to its own servers: in a test session that was not pointed at servers
of the user's (AGENTQ_TEST_PG, AGENTQ_TEST_REDIS), every test process's Postgres and Redis
are the ones the session started, on ports of their own, never the machine's."""
from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from tests.support.stack import answers, pg_admin_url, worker_redis_url
from tests.support.suite_servers import PRIVATE


@pytest.mark.parametrize("kind, url, shared_port", [
    ("postgres", pg_admin_url, 5432), ("redis", worker_redis_url, 6379)])
def test_the_session_runs_on_servers_of_its_own(kind, url, shared_port):
    if kind not in os.environ.get(PRIVATE, "").split():
        pytest.skip(f"this session was given a {kind} server of the user's")
    where = urlsplit(url())
    assert where.hostname == "127.0.0.1" and where.port != shared_port
    assert answers(where.hostname, where.port)


def test_a_killed_sessions_directory_is_removed_by_the_next_session():
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from tests.support import suite_servers
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = Path(tempfile.mkdtemp(prefix=suite_servers.PREFIX))
    (left / "owner.pid").write_text(str(gone.pid))
    alive = Path(tempfile.mkdtemp(prefix=suite_servers.PREFIX))
    (alive / "owner.pid").write_text(str(os.getpid()))
    try:
        suite_servers._remove_left_behind()
        assert not left.exists() and alive.exists()
    finally:
        import shutil
        shutil.rmtree(alive, ignore_errors=True)
