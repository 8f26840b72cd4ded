"""The `agentq` command group, its exit codes and the output helpers every command shares."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click

from agentq import logs
from agentq.config import get_settings
from agentq.loop.states import JobStatus, StopReason

PROCESS_KINDS = ("orchestrator", "tools", "tools-slow", "webhooks")

# How `agentq run` and `agentq submit --wait` exit: how the job ended, so a script can tell
# an answer from a job that stopped without one. 1 is an error before or around the job
# (configuration, the API refused, unreachable); 2 is click's usage error.
EXIT_ANSWERED = 0
EXIT_ERROR = 1
EXIT_MAX_ITERATIONS = 3
EXIT_BUDGET = 4
EXIT_FAILED = 5
EXIT_CANCELLED = 6
EXIT_TIMEOUT = 7
EXIT_INTERRUPTED = 130
EXIT_CODES_HELP = ("Exit status: 0 answered; 3 stopped without a whole answer: at a limit "
                   "(max_iterations, max_tokens, max_time), by a hook, or the reply cut at "
                   "the model's output limit (length); 4 budget used up; 5 failed; "
                   "6 cancelled; 7 still running (or not started) "
                   "after --timeout; 1 an error before the job ended (configuration, the API).")


def _status_line(text: str) -> None:
    """One line of progress on stderr."""
    click.echo(text, err=True)


def _error_line(text: str) -> None:
    """One line saying what went wrong, on stderr (red on a terminal only: click.echo drops
    the colour when stderr is not a TTY)."""
    click.secho(f"agentq: {text}", err=True, fg="red")


def exit_code_for(status: str, finish_reason: str | None) -> int:
    """The exit status of a command that followed a job to its end."""
    if status == JobStatus.CANCELLED:
        return EXIT_CANCELLED
    if status == JobStatus.COMPLETED:
        return (EXIT_ANSWERED if finish_reason in (None, StopReason.END_TURN)
                else EXIT_MAX_ITERATIONS)
    if finish_reason == StopReason.BUDGET_EXCEEDED:
        return EXIT_BUDGET
    return EXIT_FAILED


def _print_ending(job_id, status: str, finish_reason: str | None, response: dict) -> int:
    """The answer on stdout (and its files); a job that ended without one: one line on
    stderr saying why. Returns the exit status."""
    code = exit_code_for(status, finish_reason)
    if finish_reason == "length" and response.get("content"):
        click.echo(response["content"])  # what there is of the answer, said to be cut below
    if code == EXIT_ANSWERED:
        click.echo(response.get("content") or "")
        for f in response.get("files") or []:
            click.echo(f"  file: {f['filename']} {f['url']}")
        return code
    error = response.get("error") or {}
    why = error.get("message") or response.get("content") or ""
    _error_line(f"job {job_id} {status} ({finish_reason or error.get('code') or 'no reason'})"
                + (f": {why}" if why else ""))
    return code


SERVICE_COMMANDS = ("worker", "beat")
"""The Procfile's processes: their JSON logs go to stderr, where a process manager reads them.
Every other command is for a person: its JSON logs go to a file, `log_path` (and to stderr
too with -v)."""

REMOTE_MARK = "agentq_remote"
"""Set on the function of a command that talks to a running API over HTTP (`--url`,
AGENTQ_URL): it uses no local database, so it leaves no ./.agentq behind (`log_path`)."""


def _runs_remote(ctx: click.Context, command: click.Command | None,
                 args: list[str]) -> bool:
    """Whether the command line resolves to a command that talks to a remote API: the
    subcommand, or within a group (`jobs show`) the first word of the rest that is not an
    option (no group of ours takes an option with a value)."""
    while isinstance(command, click.Group):
        name = next((a for a in args if not a.startswith("-")), None)
        if name is None:
            return False
        args = args[args.index(name) + 1:]
        command = command.get_command(ctx, name)
    return command is not None and bool(getattr(command.callback, REMOTE_MARK, False))


class _Main(click.Group):
    def resolve_command(self, ctx: click.Context, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[REMOTE_MARK] = _runs_remote(ctx, command, list(rest))
        return name, command, rest

    def invoke(self, ctx: click.Context):
        from sqlalchemy.exc import OperationalError, ProgrammingError

        from agentq.errors import ConfigError
        try:
            return super().invoke(ctx)
        except ConfigError as exc:  # a setting out of range: one line, not a traceback
            raise click.ClickException(f"configuration: {exc.message}") from None
        except (OperationalError, ProgrammingError) as exc:  # the database: one line too
            raise _database_error(exc, getattr(exc, "orig", None)) from None
        except Exception as exc:
            if _is_driver_error(exc):  # psycopg2's own, unwrapped by SQLAlchemy
                raise _database_error(exc, exc) from None
            raise


def _is_driver_error(exc: BaseException) -> bool:
    try:
        import psycopg2
    except ImportError:  # pragma: no cover - psycopg2 is a dependency
        return False
    return isinstance(exc, (psycopg2.OperationalError, psycopg2.ProgrammingError))


def _database_error(exc: BaseException, orig: BaseException | None) -> click.ClickException:
    """One line for a database that is away, or not migrated (its tables missing): where
    (the URL without its password) and what to do."""
    from sqlalchemy.exc import ProgrammingError
    first = (str(orig or exc).strip().splitlines() or [type(exc).__name__])[0]
    if getattr(orig, "pgcode", None) in ("42P01", "42703") or "no such table" in first:
        return click.ClickException(f"the database is not migrated ({first}): run "
                                    f"`agentq db upgrade`")
    from agentq.config.environment import typed_database_url
    try:
        where = typed_database_url()  # as typed, not the driver's spelling
    except Exception:  # noqa: BLE001 - the settings themselves may be what is wrong
        where = "configured in AGENTQ_DATABASE_URL"
    if "does not exist" in first:
        return click.ClickException(f"no database at {where} ({first}): run "
                                    f"`agentq db upgrade` to create and migrate it")
    if isinstance(exc, ProgrammingError) or type(exc).__name__ == "ProgrammingError":
        return click.ClickException(f"the database at {where} refused a query: {first}")
    return click.ClickException(f"cannot reach the database at {where}: {first}")


@click.group(cls=_Main)
@click.version_option(package_name="agentq", prog_name="agentq",
                      message="%(prog)s %(version)s")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print the JSON logs on stderr (they always go to "
                   "agentq.log: in $AGENTQ_HOME, ./.agentq with the embedded database, "
                   "else in $XDG_STATE_HOME/agentq or ~/.local/state/agentq).")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """agentq: durable LLM agent loops on Celery."""
    ctx.obj = {"verbose": verbose}
    if ctx.invoked_subcommand not in SERVICE_COMMANDS:
        _person_logging(verbose, remote=ctx.meta.get(REMOTE_MARK, False))


def _person_logging(verbose: bool, remote: bool = False) -> None:
    settings = get_settings()
    logs.configure(settings.log_level, path=log_path(settings, remote), to_stderr=verbose)


def log_path(settings, remote: bool = False) -> Path:
    """Where a person's command writes its log. In AGENTQ_HOME when that is set, or when
    the command uses the embedded database (SQLite: ./.agentq/agentq.log by default, beside
    the database); else — a command talking to a remote API (`--url`, AGENTQ_URL), or a
    server's database — in the user's state directory ($XDG_STATE_HOME/agentq, by default
    ~/.local/state/agentq: platformdirs), so that no ./.agentq is left wherever it ran."""
    import os
    if os.environ.get("AGENTQ_HOME") or (
            not remote and settings.database_url.startswith("sqlite")):
        return settings.home / "agentq.log"
    from platformdirs import user_state_dir
    return Path(user_state_dir("agentq", appauthor=False)) / "agentq.log"


@contextmanager
def _client_errors() -> Iterator[None]:
    """A ClientError (what the API answers with a 4xx) becomes one clean line, exit 1."""
    from agentq.errors import ClientError
    try:
        yield
    except ClientError as exc:
        detail = exc.message
        fields = exc.details.get("fields")
        if fields:
            detail += " " + json.dumps(fields)
        raise click.ClickException(detail) from None
