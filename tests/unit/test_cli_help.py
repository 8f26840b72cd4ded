"""Every command and option of `agentq` says what it does; `--version`; `jobs list` on an
embedded database."""
from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from agentq import cli


def walk(command: click.Command, path: tuple[str, ...] = ("agentq",)):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from walk(sub, (*path, name))


COMMANDS = list(walk(cli.main))


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_and_option_has_help(path, command):
    assert (command.help or "").strip(), f"{' '.join(path)} has no help"
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert (param.help or "").strip(), f"{' '.join(path)} {param.opts[0]} has no help"


def test_version():
    result = CliRunner().invoke(cli.main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("agentq 0.")


def test_jobs_list_reads_the_database(tmp_path, monkeypatch):
    from agentq import migrate
    from agentq.config import Settings, set_settings
    from agentq.db import dispose_engines, session_factory
    from agentq.loop.identity import Incoming
    from agentq.loop.submit import Submission, create_job
    from agentq.uow import UnitOfWork
    settings = Settings.from_env({"AGENTQ_HOME": str(tmp_path)})
    monkeypatch.setenv("AGENTQ_HOME", str(tmp_path))
    set_settings(settings)
    try:
        migrate.upgrade(settings)
        with UnitOfWork(session_factory(settings)) as uow:
            for text in ("first question", "second question " + "x" * 80):
                create_job(uow, settings, Submission(Incoming("cli", "me", "c"), text))
        result = CliRunner().invoke(cli.main, ["jobs", "list", "--limit", "5"])
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert len(lines) == 2
        assert "second question" in lines[0] and lines[0].endswith("…")
        assert "queued" in lines[1] and "first question" in lines[1]
        none = CliRunner().invoke(cli.main, ["jobs", "list", "--status", "failed"])
        assert none.exit_code == 0 and none.stdout == ""
    finally:
        set_settings(None)
        dispose_engines()
