"""The CLI's commands that use the database say in one line, with no traceback, when it is
away or not migrated (`db upgrade` has its own message; this is every other command)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import ROOT, create_empty_database, drop_database, free_port, pg_admin_url

pytestmark = pytest.mark.integration

COMMANDS = [("keys", "create", "first"), ("users", "set", "api", "u-1", "--level", "admin"),
            ("jobs", "list"), ("tenants", "list")]


def agentq(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTQ_", "OPENAI_"))}
    env.update(AGENTQ_HOME=str(tmp_path / "home"), AGENTQ_DATABASE_URL=url)
    return subprocess.run([str(Path(sys.executable).with_name("agentq")), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    return line


@pytest.fixture(scope="module")
def empty_url(servers_up):
    name = f"agentq_cli_errors_{os.getpid()}"
    yield create_empty_database(name)
    drop_database(name)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_an_unreachable_database_is_one_line_naming_it_without_its_password(tmp_path, args):
    # given a URL whose port nothing listens on, with a password in it
    port = free_port()
    line = one_line(agentq(tmp_path, f"postgresql://postgres:s3cret-pw@127.0.0.1:{port}/agentq",
                           *args))
    assert line.startswith("Error: cannot reach the database at ")
    assert f"@127.0.0.1:{port}/agentq: " in line
    assert "s3cret-pw" not in line


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_an_unmigrated_database_says_to_run_db_upgrade(tmp_path, empty_url, args):
    line = one_line(agentq(tmp_path, empty_url, *args))
    assert line.startswith("Error: the database is not migrated")
    assert line.endswith("run `agentq db upgrade`")


def test_a_missing_database_says_db_upgrade_creates_it(tmp_path, servers_up):
    url = pg_admin_url().rsplit("/", 1)[0] + f"/agentq_absent_{os.getpid()}"
    line = one_line(agentq(tmp_path, url, "keys", "create", "first"))
    assert line.startswith(f"Error: no database at {url} ")  # as typed, not the driver's
    assert "agentq db upgrade" in line


@pytest.mark.parametrize("url", ["postgresq://agentq:s3cret-pw@db.example:5432/agentq",
                                 "mysql://root:s3cret-pw@127.0.0.1:3306/agentq", "garbage",
                                 "postgresql://agentq:s3cret-pw@127.0.0.1:54x2/agentq"])
@pytest.mark.parametrize("args", [("run", "hi", "--no-local-model"), ("db", "upgrade"),
                                  ("jobs", "list")], ids=lambda a: " ".join(a[:2]))
def test_a_mistyped_database_url_is_one_line_naming_it_as_typed(tmp_path, url, args):
    line = one_line(agentq(tmp_path, url, *args))
    shown = url.replace(":s3cret-pw@", ":***@")
    assert line.startswith(f"Error: configuration: AGENTQ_DATABASE_URL: '{shown}'"), line
    assert "s3cret-pw" not in line and "psycopg2" not in line
    # what to type instead: a port that is a number, or a URL of a database agentq runs on
    assert ("the port is not a number from 1 to 65535" if "54x2" in url
            else "postgresql://user:password@host:port/name") in line, line


def test_an_unreachable_database_is_named_as_typed(tmp_path):
    port = free_port()
    url = f"postgres://agentq:s3cret-pw@127.0.0.1:{port}/agentq"  # Heroku's spelling
    line = one_line(agentq(tmp_path, url, "db", "upgrade"))
    assert line.startswith(f"Error: cannot reach the database at postgres://agentq:***@"
                           f"127.0.0.1:{port}/agentq: "), line
