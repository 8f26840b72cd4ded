"""AGENTQ_ORCHESTRATOR_POOL picks the orchestrator's Celery pool: threads (the default) or
gevent; only the orchestrator's. The pool itself runs in
tests/integration/test_orchestrator_gevent.py."""
from __future__ import annotations

import os
import resource

import pytest
from click.testing import CliRunner

from agentq import cli
from agentq.config import Settings, pool, set_settings
from agentq.errors import ConfigError
from tasks import pools


def test_threads_stay_the_default_and_gevent_is_the_other_choice():
    assert Settings.from_env({}).orchestrator_pool == "threads"
    assert Settings.from_env({"AGENTQ_ORCHESTRATOR_POOL": "gevent"}).orchestrator_pool == "gevent"
    with pytest.raises(ConfigError, match="AGENTQ_ORCHESTRATOR_POOL"):
        Settings.from_env({"AGENTQ_ORCHESTRATOR_POOL": "eventlet"})


def test_gevent_takes_more_slots_than_threads():
    # given 10,000 loops to keep waiting on models in one process
    many = {"AGENTQ_ORCHESTRATOR_CONCURRENCY": "10000"}
    # then greenlets may have them, threads may not (a stack each)
    assert Settings.from_env({**many, "AGENTQ_ORCHESTRATOR_POOL": "gevent"}) \
        .orchestrator_concurrency == 10000
    with pytest.raises(ConfigError, match="from 1 to 5000"):
        Settings.from_env({**many, "AGENTQ_ORCHESTRATOR_POOL": "threads"})
    with pytest.raises(ConfigError, match="from 1 to 20000"):
        Settings.from_env({"AGENTQ_ORCHESTRATOR_CONCURRENCY": "20001",
                           "AGENTQ_ORCHESTRATOR_POOL": "gevent"})


def _worker_command(monkeypatch, kind: str, pool: str) -> list[str]:
    started: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda _file, args: started.append(list(args)))
    set_settings(Settings.from_env({"AGENTQ_ORCHESTRATOR_POOL": pool,
                                    "AGENTQ_ORCHESTRATOR_CONCURRENCY": "700"}))
    try:
        result = CliRunner().invoke(cli.main, ["worker", kind])
    finally:
        set_settings(None)
    assert result.exit_code == 0, result.output
    return started[0]


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_the_orchestrator_worker_runs_on_the_chosen_pool(monkeypatch, pool):
    args = _worker_command(monkeypatch, "orchestrator", pool)
    assert args[args.index("-P") + 1] == pool and args[args.index("-c") + 1] == "700"


def test_the_orchestrator_waits_for_a_pooled_connection_for_half_a_step_deadline(monkeypatch):
    # given more slots than database connections, and no wait set (empty: unset, and put
    # back as it was after the test)
    monkeypatch.setenv("AGENTQ_DB_POOL_TIMEOUT_S", "")
    # when the orchestrator starts, then its steps queue on the pool for up to 150 s of a
    # 300 s deadline, not the default 30 s
    _worker_command(monkeypatch, "orchestrator", "gevent")
    assert os.environ["AGENTQ_DB_POOL_TIMEOUT_S"] == "150.0"
    assert Settings.from_env({"AGENTQ_DB_POOL_TIMEOUT_S": "150.0"}).db_pool_timeout_s == 150.0
    # a wait the operator set is kept; other workers keep the default
    monkeypatch.setenv("AGENTQ_DB_POOL_TIMEOUT_S", "12")
    _worker_command(monkeypatch, "orchestrator", "gevent")
    assert os.environ["AGENTQ_DB_POOL_TIMEOUT_S"] == "12"
    monkeypatch.setenv("AGENTQ_DB_POOL_TIMEOUT_S", "")
    _worker_command(monkeypatch, "tools", "gevent")
    assert os.environ["AGENTQ_DB_POOL_TIMEOUT_S"] == ""
    assert pool.connection_wait_s(20.0) == 30.0  # never below the default


def test_the_tools_worker_keeps_its_threads(monkeypatch):
    args = _worker_command(monkeypatch, "tools", "gevent")
    assert args[args.index("-P") + 1] == "threads"


def test_gevent_without_its_packages_is_refused_with_what_to_install(monkeypatch):
    monkeypatch.setattr(pool, "missing_for", lambda name: ["psycogreen"])
    set_settings(Settings.from_env({"AGENTQ_ORCHESTRATOR_POOL": "gevent"}))
    try:
        result = CliRunner().invoke(cli.main, ["worker", "orchestrator"])
    finally:
        set_settings(None)
    assert result.exit_code != 0
    assert "psycogreen" in result.output and "agentq[prod]" in result.output


def test_only_the_gevent_pool_is_taken_for_gevent():
    assert pools.is_gevent("gevent")
    assert not pools.is_gevent("threads") and not pools.is_gevent("prefork")
    assert pool.missing_for("threads") == []


class _Limits:
    """RLIMIT_NOFILE as a test sets it: what the worker raised it to is kept."""

    def __init__(self, monkeypatch, soft: int, hard: int):
        self.soft, self.hard = soft, hard
        monkeypatch.setattr(resource, "getrlimit", lambda _which: (self.soft, self.hard))
        monkeypatch.setattr(resource, "setrlimit", self._set)

    def _set(self, _which, limits) -> None:
        self.soft, self.hard = limits


def test_an_orchestrator_raises_its_open_files_to_what_its_slots_need(monkeypatch):
    # given a service manager's soft limit of 1,024 under a hard limit of 65,536
    limits = _Limits(monkeypatch, 1024, 65536)
    # when an orchestrator with 10,000 slots is ready, then it has a socket for each
    assert pools.open_files_warning(10000) is None
    assert (limits.soft, limits.hard) == (10000 + pools.FILES_BESIDES_SLOTS, 65536)


def test_an_orchestrator_says_when_the_hard_limit_leaves_slots_without_a_socket(monkeypatch):
    limits = _Limits(monkeypatch, 1024, 4096)
    line = pools.open_files_warning(10000)
    assert limits.soft == 4096
    assert line is not None and line.startswith("open files limited to 4096: 10000 slots "
                                                "need 10256")
