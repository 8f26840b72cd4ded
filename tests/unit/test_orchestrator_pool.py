"""AGENTQ_ORCHESTRATOR_POOL picks the orchestrator's Celery pool: threads (the default) or
gevent; only the orchestrator's. The pool itself runs in
tests/integration/test_orchestrator_gevent.py."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from agentq import cli
from agentq.config import Settings, set_settings
from agentq.errors import ConfigError
from tasks import pools


def test_threads_stay_the_default_and_gevent_is_the_other_choice():
    assert Settings.from_env({}).orchestrator_pool == "threads"
    assert Settings.from_env({"AGENTQ_ORCHESTRATOR_POOL": "gevent"}).orchestrator_pool == "gevent"
    with pytest.raises(ConfigError, match="AGENTQ_ORCHESTRATOR_POOL"):
        Settings.from_env({"AGENTQ_ORCHESTRATOR_POOL": "eventlet"})


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


def test_the_tools_worker_keeps_its_threads(monkeypatch):
    args = _worker_command(monkeypatch, "tools", "gevent")
    assert args[args.index("-P") + 1] == "threads"


def test_gevent_without_its_packages_is_refused_with_what_to_install(monkeypatch):
    monkeypatch.setattr(pools, "missing_for", lambda pool: ["psycogreen"])
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
    assert pools.missing_for("threads") == []
