"""A pooled connection is checked for life without a round trip, on real Postgres.

`pool_pre_ping` sent `SELECT 1` on every checkout: about nine round trips of a one-tool job.
The pool's checkout now polls the connection's socket instead (agentq.db): a connection
the server closed is still replaced before it is used, a silent one is used as it is, and
one the server spoke to while idle (a notification, a notice) is pinged as before."""
from __future__ import annotations

import select
import threading
import time

import psycopg2
import pytest
from sqlalchemy import event, text

from agentq.config import Settings
from agentq.db import make_engine
from tests.support.stack import PG_ADMIN_URL

GONE_WITHIN_S = 60.0
"""How long a terminated backend may take to leave pg_stat_activity: a bound on a wait
for an event, not a margin anything depends on."""


@pytest.fixture
def engine(tmp_path, pg_url):
    engine = make_engine(Settings.from_env({"AGENTQ_DATABASE_URL": pg_url,
                                            "AGENTQ_HOME": str(tmp_path)}))
    yield engine
    engine.dispose()


@pytest.fixture
def admin():
    conn = psycopg2.connect(PG_ADMIN_URL)
    conn.autocommit = True
    yield conn.cursor()
    conn.close()


def backend_of(engine) -> int:
    """The backend pid of the connection the pool hands out next, checked in again after
    a COMMIT: its last statement."""
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.commit()
    return pid


def last_statement(admin, pid: int) -> str:
    admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,))
    return admin.fetchone()[0]


def test_a_connection_the_server_closed_is_replaced_before_it_is_used(engine, admin):
    # given the pool's one connection, idle in the pool, ended by the server
    engine.pool.dispose()
    pid = backend_of(engine)
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + GONE_WITHIN_S
    while True:
        admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        if admin.fetchone()[0] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # when it is checked out and used
    with engine.connect() as conn:
        now_pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    # then the statement ran, on a new connection
    assert now_pid != pid


def test_a_silent_connection_is_handed_out_without_a_statement(engine, admin):
    # given a connection whose last statement is known
    engine.pool.dispose()
    pid = backend_of(engine)
    # when it is checked out again (nothing run on it)
    with engine.connect() as conn:
        # then the server saw no statement between (a ping would show here as SELECT 1)
        assert last_statement(admin, pid) == "COMMIT"
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid


def test_a_connection_the_server_spoke_to_while_idle_is_kept(engine, admin, pg_url):
    # given a pooled connection that listens, and a notification sent to it while idle
    engine.pool.dispose()
    checked_in = []
    event.listen(engine, "checkin", lambda dbapi_conn, _record: checked_in.append(dbapi_conn))
    with engine.connect() as conn:
        conn.execute(text("LISTEN agentq_liveness"))
        conn.commit()
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.commit()
    notifier = psycopg2.connect(pg_url)  # a notification stays in its database
    notifier.autocommit = True
    notifier.cursor().execute("NOTIFY agentq_liveness, 'hello'")
    notifier.close()
    readable, _, _ = select.select([checked_in[-1]], [], [], GONE_WITHIN_S)  # delivered
    assert readable
    # when it is checked out: its socket has something to read, so it is pinged
    with engine.connect() as conn:
        assert last_statement(admin, pid) == "SELECT 1"
        # then, alive, it is the one used
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid


def test_connections_opened_in_a_burst_are_kept_for_the_next(tmp_path, pg_url):
    # given a process allowed 6 connections
    engine = make_engine(Settings.from_env({"AGENTQ_DATABASE_URL": pg_url,
                                            "AGENTQ_HOME": str(tmp_path),
                                            "AGENTQ_DB_POOL_SIZE": "6"}))
    most = engine.pool.size() + max(0, engine.pool._max_overflow)

    def wave() -> set[int]:
        """As many threads as the pool allows, each holding a connection at the same time:
        their backends."""
        together, pids = threading.Barrier(most), set()

        def hold():
            with engine.connect() as conn:
                pids.add(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                # all of them are out of the pool at once (a failure bound, not a margin:
                # a thread that never got here breaks the barrier instead of hanging it)
                together.wait(60)
                conn.commit()
        threads = [threading.Thread(target=hold) for _ in range(most)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return pids

    try:
        # when a burst needs every connection at once, and then another does
        first, second = wave(), wave()
        # then the setting is the most the process holds, and the second burst runs on the
        # backends the first opened: none was closed when it was returned
        assert len(first) == most
        assert second == first and engine.pool.checkedin() == most
        assert most == 6
    finally:
        engine.dispose()
