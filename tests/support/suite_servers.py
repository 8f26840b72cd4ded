"""The test session's own Postgres and Redis, started by the repository's root conftest.py.

When that conftest is imported (before tests/conftest.py, which imports the stack helpers
that read the URLs), the session's first process starts a private Postgres
cluster and a private Redis server on free loopback ports, in a scratch directory under
/tmp, and hands their URLs to every process of the run (pytest-xdist's workers, the stacks
and benchmarks the tests start) through `AGENTQ_TEST_PG` and `AGENTQ_TEST_REDIS`. So the
suite never opens a connection to the machine's Postgres or Redis: it does not depend on
how many connections a shared server has free, and it flushes and creates databases only
in servers of its own. Both are stopped and their directory deleted when the session ends;
both also stop by themselves if the process that started them dies (SIGKILL included).

To run the suite against servers of your own instead, set `AGENTQ_TEST_PG` (an admin URL,
`postgresql://postgres@127.0.0.1:5432/postgres`) and/or `AGENTQ_TEST_REDIS` (a Redis
database the suite may flush; pytest-xdist's second process takes the database two below
it). A server that cannot be started (no Postgres binaries, see AGENTQ_PG_BIN) is named by
the tests that need it (`servers_up`), which fail under CI=true and skip otherwise.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

STARTED_ERROR = "AGENTQ_TEST_SERVERS_ERROR"
"""Set (to one line) in the environment when a private server could not be started."""
PRIVATE = "AGENTQ_TEST_SERVERS_PRIVATE"
"""Set in the environment to the servers this session started (`postgres redis`)."""

PREFIX = "agentq-suite-"
_started: list = []
_scratch: Path | None = None


def start() -> None:
    """Start what is not given. pytest-xdist's workers inherit the URLs (and start
    nothing)."""
    global _scratch
    if os.environ.get(STARTED_ERROR) or (os.environ.get("AGENTQ_TEST_PG")
                                         and os.environ.get("AGENTQ_TEST_REDIS")):
        return  # given, or this is a worker of a session whose first process tried
    from tests.support.services import PrivateRedis, SuitePostgres
    _remove_left_behind()
    _scratch = Path(tempfile.mkdtemp(prefix=PREFIX))
    (_scratch / "owner.pid").write_text(str(os.getpid()))
    errors, private = [], []
    if not os.environ.get("AGENTQ_TEST_REDIS"):
        try:
            redis = PrivateRedis(_scratch, databases=32).start()
            _started.append(redis)
            private.append("redis")
            os.environ["AGENTQ_TEST_REDIS"] = f"redis://127.0.0.1:{redis.port}/9"
        except Exception as exc:  # noqa: BLE001 - said by the tests that need it
            errors.append(f"the suite's private Redis did not start: {_one_line(exc)}")
    if not os.environ.get("AGENTQ_TEST_PG"):
        try:
            postgres = SuitePostgres(_scratch).start()
            _started.append(postgres)
            private.append("postgres")
            os.environ["AGENTQ_TEST_PG"] = postgres.admin_url
        except Exception as exc:  # noqa: BLE001 - said by the tests that need it
            errors.append(f"the suite's private PostgreSQL did not start: {_one_line(exc)}")
    if errors:
        os.environ[STARTED_ERROR] = "; ".join(errors)
    os.environ[PRIVATE] = " ".join(private)
    if not _started:
        shutil.rmtree(_scratch, ignore_errors=True)
        _scratch = None


def stop() -> None:
    """Stop what start() started; its directory deleted."""
    global _scratch
    while _started:
        _started.pop().stop()
    if _scratch is not None:
        shutil.rmtree(_scratch, ignore_errors=True)
        _scratch = None


def _remove_left_behind() -> None:
    """The directories of sessions that were killed (their servers died with them, the
    directory stayed): each names the process that made it."""
    from tests.support.stack import _pid_alive
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((path / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # no pid file yet: a session starting now
        if not _pid_alive(owner):
            shutil.rmtree(path, ignore_errors=True)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("…" if len(text) > 300 else "")
