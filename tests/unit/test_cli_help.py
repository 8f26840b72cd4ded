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
    from agentq.loop.uow import UnitOfWork
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


@pytest.mark.parametrize("argv, remote", [
    (["submit", "hi", "--url", "http://api.example"], True),
    (["jobs", "show", "some-id"], True),
    (["batch", "submit", "lines.jsonl"], True),
    (["jobs", "list"], False),
    (["run", "hi"], False),
    (["db", "upgrade"], False),
    (["keys", "list"], False),
])
def test_which_commands_talk_to_a_remote_api(argv, remote):
    """Resolved as `agentq` does before configuring its log (issue 31): a command that
    talks to a remote API keeps no log in ./.agentq."""
    from agentq.cli.core import _runs_remote
    ctx = click.Context(cli.main)
    _name, command, rest = click.Group.resolve_command(cli.main, ctx, argv)
    assert _runs_remote(ctx, command, rest) is remote


def test_the_log_is_in_the_state_directory_unless_a_local_database_is_used(tmp_path,
                                                                          monkeypatch):
    from agentq.cli.core import log_path
    from agentq.config import Settings
    monkeypatch.delenv("AGENTQ_HOME", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    state_log = tmp_path / "state" / "agentq" / "agentq.log"
    embedded = Settings.from_env({})
    server = Settings.from_env({"AGENTQ_DATABASE_URL": "postgresql://db.example/agentq"})
    assert log_path(embedded) == tmp_path / ".agentq" / "agentq.log"
    assert log_path(embedded, remote=True) == state_log
    assert log_path(server) == state_log
    monkeypatch.setenv("AGENTQ_HOME", str(tmp_path / "home"))  # said where: kept there
    assert log_path(Settings.from_env({"AGENTQ_HOME": str(tmp_path / "home")}),
                   remote=True) == tmp_path / "home" / "agentq.log"
