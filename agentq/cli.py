"""The `agentq` command: operate a deployment (db, keys, users, processes) and run the whole
loop on one machine with no servers (`agentq dev`, `agentq run`)."""
from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import click

from agentq import logs
from agentq.config import get_settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

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
EXIT_CODES_HELP = ("Exit status: 0 answered; 3 stopped without an answer at a limit "
                   "(max_iterations, max_tokens, max_time) or by a hook; 4 budget used up; 5 failed; 6 cancelled; 7 still running "
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
    if status == "cancelled":
        return EXIT_CANCELLED
    if status == "completed":
        return EXIT_ANSWERED if finish_reason in (None, "end_turn") else EXIT_MAX_ITERATIONS
    if finish_reason == "budget_exceeded":
        return EXIT_BUDGET
    return EXIT_FAILED


def _print_ending(job_id, status: str, finish_reason: str | None, response: dict) -> int:
    """The answer on stdout (and its files); a job that ended without one: one line on
    stderr saying why. Returns the exit status."""
    code = exit_code_for(status, finish_reason)
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
Every other command is for a person: its JSON logs go to $AGENTQ_HOME/agentq.log (and to
stderr too with -v)."""


class _Main(click.Group):
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
    try:
        where = _safe_url(get_settings().database_url)
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
                   "$AGENTQ_HOME/agentq.log).")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """agentq: durable LLM agent loops on Celery."""
    ctx.obj = {"verbose": verbose}
    if ctx.invoked_subcommand not in SERVICE_COMMANDS:
        _person_logging(verbose)


def _person_logging(verbose: bool) -> None:
    settings = get_settings()
    logs.configure(settings.log_level, path=log_path(settings), to_stderr=verbose)


def log_path(settings):
    return settings.home / "agentq.log"


# --- database ---------------------------------------------------------------------------
@main.group()
def db() -> None:
    """The database schema (Alembic)."""


@db.command("upgrade")
@click.argument("revision", default="head")
@click.option("--create/--no-create", default=True, show_default=True,
              help="Create the Postgres database first when it does not exist.")
def db_upgrade(revision: str, create: bool) -> None:
    """Migrate the database to REVISION (default: the newest)."""
    from sqlalchemy.exc import OperationalError

    from agentq import migrate
    settings = get_settings()
    try:
        if create and (made := migrate.create_database_if_missing(settings)):
            click.echo(f"created database {made}")
        migrate.upgrade(settings, revision=revision)
    except OperationalError as exc:
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise click.ClickException(f"cannot reach the database "
                                   f"{_safe_url(settings.database_url)}: {first}") from None
    click.echo(f"database at {revision}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Migrate the database back to REVISION."""
    from agentq import migrate
    migrate.downgrade(revision=revision)
    click.echo(f"database at {revision}")


# --- tenants, keys and users ------------------------------------------------------------
@main.group()
def tenants() -> None:
    """Tenants: every key, and every row a key makes, belongs to one."""


@tenants.command("create")
@click.argument("name")
def tenants_create(name: str) -> None:
    """Make a tenant; prints it as JSON (its id is what `keys create --tenant` takes, as is
    its name)."""
    from agentq.db import session_scope
    from agentq.tenants import create_tenant, tenant_object
    with _client_errors(), session_scope() as session:
        body = tenant_object(create_tenant(session, name))
    click.echo(json.dumps(body))


@tenants.command("list")
def tenants_list() -> None:
    """Every tenant, one JSON object a line."""
    from agentq.db import session_scope
    from agentq.tenants import list_tenants, tenant_object
    with session_scope() as session:
        for tenant in list_tenants(session):
            click.echo(json.dumps(tenant_object(tenant)))


@main.group()
def keys() -> None:
    """API keys."""


@keys.command("create")
@click.argument("name")
@click.option("--tenant", "tenant_ref", default=None,
              help="The key's tenant, by id or name (default: the default tenant).")
@click.option("--admin", is_flag=True,
              help="The key may use the admin routes (tenants, keys) and sees every key's "
                   "rows in its tenant.")
def keys_create(name: str, tenant_ref: str | None, admin: bool) -> None:
    """Make a key; it is printed once on stdout, only its hash is stored."""
    from agentq.db import session_scope
    from agentq.keys import create_key
    from agentq.tenants import find_tenant
    with _client_errors(), session_scope() as session:
        _row, key = create_key(session, name, admin, find_tenant(session, tenant_ref).id)
    click.echo(key)


@main.group()
def modules() -> None:
    """External tool modules: HTTP modules (GET /manifest, POST /execute) and MCP servers."""


def _module_call(fn, *args):
    from agentq.db import session_scope
    from agentq.tools.registry import get_registry
    with _client_errors(), session_scope() as session:
        return fn(session, get_registry(get_settings()), *args)


@modules.command("add")
@click.argument("name")
@click.argument("url", required=False)
@click.option("--slow", is_flag=True, help="Run its tools on tools.slow.<name>.")
@click.option("--secret", default=None, envvar="AGENTQ_NEW_MODULE_SECRET",
              help="`whsec_…`: requests to the module are signed with it (Standard "
                   "Webhooks). Also read from AGENTQ_NEW_MODULE_SECRET.")
@click.option("--mcp", "mcp_kind", is_flag=True, help="The module is an MCP server (URL: "
              "streamable HTTP; or --command).")
@click.option("--command", "command", default=None,
              help="An MCP server started over stdio, e.g. 'python -m examples.mcp_server'.")
@click.option("--permission", default=None,
              type=click.Choice(["guest", "user", "admin", "owner"]),
              help="The level a caller needs for its tools (default guest; an HTTP "
                   "manifest's own permission wins).")
@click.option("--approval", "approval", multiple=True, metavar="TOOL|all",
              help="Calls of this tool wait for a person's approval; `all` for every tool. "
                   "Repeatable.")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Each call's time limit in seconds (an HTTP manifest's own wins).")
def modules_add(name: str, url: str | None, slow: bool, secret: str | None, mcp_kind: bool,
                command: str | None, permission: str | None, approval: tuple[str, ...],
                timeout_s: float | None) -> None:
    """Register a module by URL; its manifest is fetched and checked first. Prints it."""
    import shlex

    from agentq.modules import add_module
    from agentq.tools.remote import ModuleSpec
    requires_approval = True if "all" in approval else (tuple(approval) or False)
    spec = ModuleSpec(name=name, kind="mcp" if (mcp_kind or command) else "http", url=url,
                      command=tuple(shlex.split(command)) if command else None, slow=slow,
                      secret=secret, permission=permission,
                      requires_approval=requires_approval, timeout_s=timeout_s)
    click.echo(json.dumps(_module_call(add_module, spec)))


@modules.command("list")
def modules_list() -> None:
    """Every module (python, http, mcp) with its health and tools, one JSON object a line."""
    from agentq.modules import list_modules
    from agentq.tools.registry import get_registry
    for module in list_modules(get_registry(get_settings())):
        click.echo(json.dumps(module))


@modules.command("refresh")
@click.argument("name")
def modules_refresh(name: str) -> None:
    """Fetch a module's manifest now (and cache it for an hour)."""
    from agentq.modules import refresh_module
    click.echo(json.dumps(_module_call(refresh_module, name)))


@modules.command("remove")
@click.argument("name")
def modules_remove(name: str) -> None:
    """Unregister a module: its tools are no longer offered."""
    from agentq.modules import remove_module
    _module_call(remove_module, name)
    click.echo(json.dumps({"removed": name}))


UNLIMITED = "unlimited"
MAX_BUDGET = 10**15
"""As the API takes it (PATCH /v1/users/<id> token_budget_monthly)."""


class _Budget(click.ParamType):
    """A monthly token budget: a whole number 0..MAX_BUDGET, or 'unlimited'."""
    name = "TOKENS|unlimited"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == UNLIMITED:
            return value
        text = str(value).strip()
        if text.lower() == UNLIMITED:
            return UNLIMITED
        try:
            number = int(text)
        except ValueError:
            self.fail(f"{value!r} is not a whole number of tokens or 'unlimited'.", param, ctx)
        if not 0 <= number <= MAX_BUDGET:
            self.fail(f"{number} is not in the range 0<=x<={MAX_BUDGET}.", param, ctx)
        return number


BUDGET = _Budget()


@main.group()
def users() -> None:
    """Users and their budgets."""


@users.command("set")
@click.argument("platform")
@click.argument("platform_user_id")
@click.option("--level", type=click.Choice(["guest", "user", "admin", "owner"]),
              help="The user's permission level (which tools it may use).")
@click.option("--budget", type=BUDGET, help="Monthly tokens (a whole number >= 0), or "
                                             "'unlimited'.")
@click.option("--tenant", "tenant_ref", default=None,
              help="The user's tenant, by id or name (default: the default tenant).")
def users_set(platform: str, platform_user_id: str, level: str | None,
              budget: str | None, tenant_ref: str | None) -> None:
    """Set a user's permission level or monthly budget (the user is made if new)."""
    from agentq.db import session_scope
    from agentq.loop.identity import Incoming, resolve_user
    from agentq.tenants import find_tenant
    with _client_errors(), session_scope() as session:
        tenant_id = find_tenant(session, tenant_ref).id
        user = resolve_user(session, tenant_id, Incoming(platform, platform_user_id, "-"),
                            get_settings())
        if level:
            user.permission_level = level
        if budget is not None:
            user.token_budget_monthly = None if budget == UNLIMITED else budget
        click.echo(json.dumps({"user_id": str(user.id), "permission_level":
                               user.permission_level,
                               "token_budget_monthly": user.token_budget_monthly}))


@users.command("list")
@click.option("--tenant", "tenant_ref", default=None, help="By id or name (default tenant).")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="How many users to list, oldest first.")
def users_list(tenant_ref: str | None, limit: int) -> None:
    """The tenant's users with their identities, one JSON object a line."""
    from agentq import admin
    with _admin_session(tenant_ref) as (session, tenant_id):
        found = admin.list_users(session, tenant_id, limit)
        links = admin.identities(session, [u.id for u in found])
        for user in found:
            click.echo(json.dumps(admin.user_object(user, links[user.id])))


@users.command("show")
@click.argument("user_id")
@click.option("--tenant", "tenant_ref", default=None, help="By id or name (default tenant).")
def users_show(user_id: str, tenant_ref: str | None) -> None:
    """A user (by id, or PLATFORM:PLATFORM_USER_ID), usage this period and token logs."""
    from agentq import admin
    with _admin_session(tenant_ref) as (session, tenant_id):
        user = _find_user(session, tenant_id, user_id)
        click.echo(json.dumps(admin.user_detail(session, get_settings(), user), indent=2))


@users.command("link")
@click.argument("user_id")
@click.argument("platform")
@click.argument("platform_user_id")
@click.option("--username", default=None, help="The name shown on that platform.")
@click.option("--tenant", "tenant_ref", default=None, help="By id or name (default tenant).")
def users_link(user_id: str, platform: str, platform_user_id: str, username: str | None,
               tenant_ref: str | None) -> None:
    """Link another platform identity to a user (by id, or PLATFORM:PLATFORM_USER_ID)."""
    from agentq import admin
    with _admin_session(tenant_ref) as (session, tenant_id):
        user = _find_user(session, tenant_id, user_id)
        admin.link_identity(session, user, platform, platform_user_id, username)
        click.echo(json.dumps(admin.user_object(
            user, admin.identities(session, [user.id])[user.id])))


def _find_user(session, tenant_id, ref: str):
    from agentq import admin
    platform, sep, platform_user_id = ref.partition(":")
    if sep and platform and platform_user_id:
        return admin.find_user_by_identity(session, tenant_id, platform, platform_user_id)
    return admin.find_user(session, tenant_id, ref)


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


@contextmanager
def _admin_session(tenant_ref: str | None) -> Iterator[tuple[Session, uuid.UUID]]:
    """A transaction in a tenant for the admin subcommands; ClientErrors become clean
    messages (exit 1), like the API's 4xx."""
    from agentq.db import session_scope
    from agentq.tenants import find_tenant
    with _client_errors(), session_scope() as session:
        yield session, find_tenant(session, tenant_ref).id


@keys.command("list")
def keys_list() -> None:
    """Every key (never the key itself), one JSON object a line."""
    from agentq.keys import key_object, list_keys
    with _admin_session(None) as (session, _tenant):
        for row in list_keys(session):
            click.echo(json.dumps(key_object(row)))


@keys.command("revoke")
@click.argument("key_id", type=click.UUID)
def keys_revoke(key_id) -> None:
    """Revoke a key: it answers 401 from now on."""
    from agentq.errors import NotFound
    from agentq.keys import key_object, revoke_key
    with _admin_session(None) as (session, _tenant):
        row = revoke_key(session, key_id)
        if row is None:
            raise NotFound("key", str(key_id))
        click.echo(json.dumps(key_object(row)))


@keys.command("rotate")
@click.argument("key_id", type=click.UUID)
def keys_rotate(key_id) -> None:
    """Revoke a key and print its successor (same name, tenant, scope) once."""
    from agentq import admin
    with _admin_session(None) as (session, _tenant):
        _row, key = admin.rotate_key(session, key_id)
    click.echo(key)


@main.group()
def personas() -> None:
    """Personas: who the agent answers as (system prompt, tool modules, model)."""


def _persona_options(command, create: bool):
    options = [
        click.option("--tenant", "tenant_ref", default=None,
                     help="By id or name (default tenant)."),
        click.option("--system-prompt", default=None,
                     help="The system prompt its jobs start with."),
        click.option("--platform", default=None,
                     help="Only for messages from this platform."),
        click.option("--server", "platform_server_id", default=None,
                     help="Only for messages from this server (platform_server_id)."),
        click.option("--modules", default=None,
                     help="Comma-separated tool modules; 'default' for the configured ones."),
        click.option("--model", "default_model", default=None,
                     help="The model its jobs use (default: AGENTQ_MODEL)."),
        click.option("--max-tokens", "max_tokens_per_request", type=click.IntRange(1),
                     default=None, help="The most output tokens one model call may ask for."),
        click.option("--default/--not-default", "is_default", default=None,
                     help="Make it the tenant's default (the first persona is)."),
        click.option("--stream/--no-stream", "stream", default=None,
                     help="Stream the replies of its jobs (message_delta events)."),
        click.option("--requires-approval", "requires_approval", default=None,
                     help="Comma-separated tool names whose calls wait for a person's "
                          "approval; 'none' for no tool."),
        click.option("--max-iterations", type=click.IntRange(1, 200), default=None,
                     help="Limit: model calls per job."),
        click.option("--max-job-tokens", "max_tokens", type=click.IntRange(1, 10**12),
                     default=None, help="Limit: tokens per job (input + output)."),
        click.option("--max-seconds", type=click.FloatRange(0.1, 7 * 86400), default=None,
                     help="Limit: seconds per job."),
    ]
    if not create:
        options.append(click.option("--name", default=None, help="A new name."))
    for option in reversed(options):
        command = option(command)
    return command


PERSONA_LIMITS = ("max_iterations", "max_tokens", "max_seconds")


def _persona_data(values: dict, limits: dict | None = None) -> dict:
    """The options given, as the fields of POST|PATCH /v1/personas. Limits given join
    `limits` (the persona's current ones, on update)."""
    from agentq import admin
    from agentq.tools.registry import get_registry
    skip = {"tenant_ref", "modules", "requires_approval", *PERSONA_LIMITS}
    data = {k: v for k, v in values.items() if v is not None and k not in skip}
    registry = None
    modules = values.get("modules")
    if modules is not None:
        registry = get_registry(get_settings())
        data["allowed_modules"] = (None if modules == "default" else
                                   [m.strip() for m in modules.split(",") if m.strip()])
        admin.check_modules(data["allowed_modules"], registry.modules)
    tools = values.get("requires_approval")
    if tools is not None:
        registry = registry or get_registry(get_settings())
        data["requires_approval"] = (None if tools.strip().lower() == "none" else
                                     [t.strip() for t in tools.split(",") if t.strip()])
        admin.check_tools(data["requires_approval"], registry.tools)
    given = {k: values[k] for k in PERSONA_LIMITS if values.get(k) is not None}
    if given:
        data["limits"] = {**(limits or {}), **given}
    return data


@personas.command("create")
@click.argument("name")
def personas_create(name: str, **values) -> None:
    """Make a persona; prints it as JSON."""
    from agentq import admin
    with _admin_session(values["tenant_ref"]) as (session, tenant_id):
        data = {**_persona_data(values), "name": name}
        click.echo(json.dumps(admin.persona_object(admin.create_persona(session, tenant_id,
                                                                        data))))


personas_create = _persona_options(personas_create, create=True)


@personas.command("update")
@click.argument("persona_id")
def personas_update(persona_id: str, **values) -> None:
    """Change the options given; prints the persona as JSON."""
    from agentq import admin
    with _admin_session(values["tenant_ref"]) as (session, tenant_id):
        persona = admin.find_persona(session, tenant_id, persona_id)
        persona = admin.update_persona(session, persona,
                                       _persona_data(values, persona.limits))
        click.echo(json.dumps(admin.persona_object(persona)))


personas_update = _persona_options(personas_update, create=False)


@personas.command("list")
@click.option("--tenant", "tenant_ref", default=None, help="By id or name (default tenant).")
def personas_list(tenant_ref: str | None) -> None:
    """The tenant's personas, one JSON object a line."""
    from agentq import admin
    with _admin_session(tenant_ref) as (session, tenant_id):
        for persona in admin.list_personas(session, tenant_id):
            click.echo(json.dumps(admin.persona_object(persona)))


@personas.command("show")
@click.argument("persona_id")
@click.option("--tenant", "tenant_ref", default=None, help="By id or name (default tenant).")
def personas_show(persona_id: str, tenant_ref: str | None) -> None:
    """One persona as JSON."""
    from agentq import admin
    with _admin_session(tenant_ref) as (session, tenant_id):
        click.echo(json.dumps(admin.persona_object(admin.find_persona(session, tenant_id,
                                                                      persona_id))))


@personas.command("delete")
@click.argument("persona_id")
@click.option("--tenant", "tenant_ref", default=None, help="By id or name (default tenant).")
def personas_delete(persona_id: str, tenant_ref: str | None) -> None:
    """Delete a persona (the oldest other one becomes the default if it was)."""
    from agentq import admin
    with _admin_session(tenant_ref) as (session, tenant_id):
        persona = admin.find_persona(session, tenant_id, persona_id)
        ident = str(persona.id)
        admin.delete_persona(session, persona)
    click.echo(json.dumps({"id": ident, "deleted": True}))


@main.command("usage")
@click.option("--by", "group_by", type=click.Choice(["user", "persona", "model"]),
              default="user", show_default=True, help="One row per user, persona or model.")
@click.option("--since", type=click.DateTime(), default=None,
              help="UTC; default: --until less the budget period.")
@click.option("--until", type=click.DateTime(), default=None, help="UTC; default: now.")
@click.option("--tenant", "tenant_ref", default=None, help="By id or name (default tenant).")
def usage(group_by: str, since, until, tenant_ref: str | None) -> None:
    """Tokens and cost per user, persona or model, one JSON object a line."""
    from datetime import timedelta, timezone

    from agentq import admin
    from agentq.db import utcnow
    until = until.replace(tzinfo=timezone.utc) if until else utcnow()
    since = (since.replace(tzinfo=timezone.utc) if since
             else until - timedelta(days=get_settings().budget_period_days))
    if since > until:
        raise click.BadParameter("must not be after --until", param_hint="--since")
    with _admin_session(tenant_ref) as (session, tenant_id):
        for row in admin.usage_report(session, tenant_id, group_by, since, until):
            click.echo(json.dumps(row))


# --- processes --------------------------------------------------------------------------
@main.command("worker", context_settings={"ignore_unknown_options": True})
@click.argument("kind", type=click.Choice(PROCESS_KINDS))
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(kind: str, celery_args: tuple[str, ...]) -> None:
    """Run a Celery worker for one kind of queue, sized for it."""
    from agentq.tools.registry import get_registry
    settings = get_settings()
    registry = get_registry(settings)
    if kind == "orchestrator":
        queues, pool, conc = ["orchestrator"], "threads", settings.orchestrator_concurrency
    elif kind == "tools":
        queues, pool, conc = (registry.all_queues(slow=False), "threads",
                              settings.tools_concurrency)
    elif kind == "tools-slow":
        queues, pool, conc = (registry.all_queues(slow=True), "prefork",
                              settings.slow_tools_concurrency)
    else:
        queues, pool, conc = [kind], "threads", 4
    if not queues:
        raise click.ClickException(f"no queues for {kind}")
    args = [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "-Q", ",".join(queues),
            "-P", pool, "-c", str(conc), "-n", f"{kind}@%h", "--without-gossip",
            "--without-mingle", "-l", settings.log_level, *celery_args]
    os.execvp(args[0], args)


@main.command("beat")
def beat() -> None:
    """Run the periodic scheduler (the sweepers, due schedules) with a worker on the
    maintenance queue. Two may run at once: each schedule tick fires once either way."""
    settings = get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "-B",
            "-s", str(settings.home / "celerybeat-schedule"), "-Q", "maintenance",
            "-P", "threads", "-c", "2", "-n", f"beat-{os.getpid()}@%h", "--without-gossip",
            "--without-mingle", "-l", settings.log_level]
    os.execvp(args[0], args)


# --- the local model as a server ---------------------------------------------------------
@main.group("model")
def model() -> None:
    """The local model (the `local` extra) as an OpenAI-compatible server."""


@model.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on (0.0.0.0 for other machines).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True,
              help="The port to listen on.")
def model_serve(host: str, port: int) -> None:
    """Run llama.cpp's OpenAI-compatible server with the packaged small model until stopped
    (Ctrl-C, SIGTERM). It prints the variables that point agentq's processes at it."""
    from agentq import local_model
    try:
        server = local_model.LocalModelServer(
            host=host, port=port, log_path=get_settings().home / "local-model.log")
    except local_model.LocalModelError as exc:
        raise click.ClickException(str(exc)) from None
    _status_line(f"agentq: starting llama.cpp ({server.model_path.name}) on {host}:{port}, "
                 f"log in {server.log_path} ...")
    try:
        server.start()
    except local_model.LocalModelError as exc:
        raise click.ClickException(str(exc).splitlines()[0]) from None
    local_model.stop_on_signals(server)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    click.echo(f"model {server.alias} ready on http://{shown}:{port}/v1; agentq's processes "
               f"need:")
    env = {"OPENAI_BASE_URL": f"http://{shown}:{port}/v1", "OPENAI_API_KEY": "local",
           "AGENTQ_MODEL": server.alias, **LOCAL_MODEL_SERVER_ENV,
           **local_model.embedding_env(server.embedding_model)}
    for name, value in env.items():
        click.echo(f"{name}={value}")
    try:
        # alive, not healthy: a busy llama.cpp server answers GET /v1/models late
        while server.process is not None and server.process.poll() is None:
            time.sleep(1)
        raise click.ClickException(f"the model server stopped:\n{server.log_tail()[-500:]}")
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


# --- one machine, no servers ------------------------------------------------------------
LOCAL_MODEL_SERVER_ENV = {
    "AGENTQ_LLM_TIMEOUT_S": "120",  # a small CPU model may think for a while
    "AGENTQ_MAX_TOKENS_PER_REQUEST": "256",  # tiny models ramble
    "AGENTQ_MAX_ITERATIONS": "5",  # ...and loop
    # what makes a 135M model use a tool's result (README, "Offline"):
    "AGENTQ_TOOL_RESULTS_AS": "user",  # its chat template drops role-`tool` messages
    "AGENTQ_ANSWER_AFTER_TOOLS": "1",  # answer from the results instead of calling again
    "AGENTQ_TEMPERATURE": "0",  # greedy: the same question gets the same answer
    "AGENTQ_DEFAULT_MODULES": "math",  # one tool to choose from, not four modules' worth
}
"""What agentq's processes need to use the local model well (`agentq model serve` prints
them for a deployment's environment)."""
LOCAL_MODEL_DEFAULTS = {
    **LOCAL_MODEL_SERVER_ENV,
    "AGENTQ_LLM_RETRIES": "1",  # a slow local server is not made faster by asking again
    "AGENTQ_GUEST_MONTHLY_TOKENS": "100000",  # local tokens cost nothing; 5000 is ~2 runs
}
"""Set for the local model by `agentq run`/`dev` unless the environment already sets them."""


def _wants_local_model(flag: bool | None) -> bool:
    """--local-model / --no-local-model; unset: the local model when no server is configured
    (OPENAI_BASE_URL and OPENAI_API_KEY both unset) and the `local` extra is installed."""
    if flag is not None:
        return flag
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return False
    from agentq import local_model
    reason = local_model.missing()
    if reason is None:
        click.echo("agentq: OPENAI_BASE_URL and OPENAI_API_KEY are unset: using the local "
                   "model (the `local` extra; --no-local-model to skip it)", err=True)
        return True
    raise click.ClickException(
        f"no model: OPENAI_BASE_URL and OPENAI_API_KEY are unset and the local model is not "
        f"installed ({reason}). For a model on this machine: {local_model.INSTALL_HINT}; "
        f"or set OPENAI_BASE_URL (any OpenAI-compatible server) or OPENAI_API_KEY.")


def _start_local_model():
    """llama.cpp's server with the packaged model, as a child process; the router pointed at
    it through OPENAI_BASE_URL. Stopped by the caller, at exit, or on SIGTERM/SIGHUP."""
    from agentq import local_model
    from agentq.config import Settings, set_settings
    try:
        server = local_model.LocalModelServer(
            log_path=Settings.from_env().home / "local-model.log")
    except local_model.LocalModelError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"agentq: starting llama.cpp ({server.model_path.name}) on {server.host}, "
               f"log in {server.log_path} ...", err=True)
    started = time.monotonic()
    try:
        server.start()
    except local_model.LocalModelError as exc:
        raise click.ClickException(str(exc)) from None
    local_model.stop_on_signals(server)
    os.environ.update(server.client_env())
    os.environ.setdefault("AGENTQ_TOKENIZER", str(server.model_path))
    for name, value in LOCAL_MODEL_DEFAULTS.items():
        os.environ.setdefault(name, value)
    set_settings(None)  # read again, with the variables above
    memory = (f", embeddings {server.embedding_model}" if server.embedding_model else
              ", no embedding model (memory off)")
    click.echo(f"agentq: local model {server.alias} ready on {server.base_url} in "
               f"{time.monotonic() - started:.1f} s{memory}", err=True)
    return server


def _embedded(local_model: bool = False):
    """Settings, the in-process worker, and the local model server (or None)."""
    server = _start_local_model() if local_model else None
    try:
        return (*_embedded_worker(), server)
    except BaseException:
        if server is not None:
            server.stop()
        raise


def _embedded_worker():
    settings = get_settings()
    if not settings.embedded_broker:
        raise click.ClickException("`agentq dev` and `agentq run` use the embedded broker; "
                                   "unset AGENTQ_BROKER_URL or run the Procfile's processes.")
    from agentq import migrate
    migrate.upgrade(settings)
    from tasks.embedded import EmbeddedWorker
    worker = EmbeddedWorker(settings)
    worker.start()
    return settings, worker


def _dev_key(settings) -> str:
    from agentq.db import session_scope
    from agentq.keys import create_key, lookup
    path = settings.home / "dev-key"
    if path.exists():
        key = path.read_text().strip()
        with session_scope(settings) as session:
            if lookup(session, key):
                return key
    with session_scope(settings) as session:
        _row, key = create_key(session, "dev", admin=True)
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


def _model_target(settings) -> str:
    """Where this process's jobs go, in words; refuses (ClickException) when that is OpenAI
    itself without a key that could be OpenAI's."""
    base = os.environ.get("OPENAI_BASE_URL")
    if base:
        return f"model {settings.model} at {base}"
    key = os.environ.get("OPENAI_API_KEY") or ""
    if not key:
        raise click.ClickException(
            "no model server: OPENAI_BASE_URL and OPENAI_API_KEY are unset. Set "
            "OPENAI_BASE_URL to an OpenAI-compatible server (`agentq model serve` starts the "
            "local model on a port), or OPENAI_API_KEY for OpenAI, or pass --local-model.")
    if not looks_like_openai_key(key):
        raise click.ClickException(
            "OPENAI_API_KEY does not look like an OpenAI key (they start with sk- and are "
            "long) and OPENAI_BASE_URL is unset, so jobs would go to OpenAI and fail. Set "
            "OPENAI_BASE_URL for another server, or a real key.")
    return f"model {settings.model} at OpenAI (api.openai.com)"


def looks_like_openai_key(key: str) -> bool:
    """OpenAI's keys: `sk-` then 40 or more characters (`sk-proj-…`, `sk-svcacct-…`, ...)."""
    return key.startswith("sk-") and len(key) >= 43 and " " not in key


@main.command("dev")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="The API's port. Default: $PORT or 5000.")
@click.option("--local-model", is_flag=True,
              help="Run llama.cpp's server with the packaged small model (the `local` extra) "
                   "as a child process and use it as the model server.")
def dev(port: int | None, local_model: bool) -> None:
    """Serve the API with an in-process broker, worker and sweeper, on SQLite by default."""
    from agentq.config import set_settings
    if port is not None:  # file URLs and the printed address use the real port
        os.environ["PORT"] = str(port)
        set_settings(None)
    if not local_model:
        target = _model_target(get_settings())
    settings, worker, server = _embedded(local_model)
    if local_model:
        target = f"the local model {server.alias} at {server.base_url}"
    key = _dev_key(settings)
    port = settings.port
    click.echo(f"agentq on http://127.0.0.1:{port}  (database {_safe_url(settings.database_url)})")
    click.echo(f"jobs go to {target}")
    click.echo(f"admin key (also in {settings.home / 'dev-key'}): {key}")
    click.echo(f"logs: {log_path(settings)}")
    logs.show_on_terminal("werkzeug")
    from api import create_app
    try:
        create_app(settings).run(host="127.0.0.1", port=port, threaded=True)
    finally:
        worker.stop()
        if server is not None:
            server.stop()


def _safe_url(url: str) -> str:
    """A database URL without its password."""
    from sqlalchemy.engine import make_url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for display
        return url.split("@")[-1]


@main.command("run", epilog=EXIT_CODES_HELP)
@click.argument("content")
@click.option("--user", "user_id", default="local-user", show_default=True,
              help="The platform user the message is from (its budget applies).")
@click.option("--channel", default="cli", show_default=True,
              help="The channel: one conversation per user and channel.")
@click.option("--timeout", "timeout_s", type=float, default=300, show_default=True,
              help="Stop waiting after this many seconds (exit status 7).")
@click.option("--local-model/--no-local-model", default=None,
              help="Use llama.cpp's server with the packaged small model (the `local` extra). "
                   "Default: yes when OPENAI_BASE_URL and OPENAI_API_KEY are both unset and "
                   "the extra is installed.")
def run(content: str, user_id: str, channel: str, timeout_s: float,
        local_model: bool | None) -> None:
    """Run one message through the whole loop in this process and print what happens."""
    use_local = _wants_local_model(local_model)
    if not use_local:
        _status_line(f"agentq: jobs go to {_model_target(get_settings())}")
    settings, worker, server = _embedded(use_local)
    code = EXIT_ERROR
    try:
        code = _run_one(settings, content, user_id, channel, timeout_s)
    finally:
        if server is not None:
            server.stop()
        if code in (EXIT_TIMEOUT, EXIT_INTERRUPTED):
            # the job is still live in this process's worker: stopping it would wait for
            # its model call; the job stays in the database, where the sweeper re-drives it
            # the next time this AGENTQ_HOME runs
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(code)
        worker.stop()
    sys.exit(code)


def _run_one(settings, content: str, user_id: str, channel: str, timeout_s: float) -> int:
    from agentq.db import session_factory
    from agentq.loop.identity import Incoming
    from agentq.loop.submit import Submission, create_job
    from agentq.uow import UnitOfWork
    import tasks.dispatch  # noqa: F401  (the job's first step goes out through it)
    with UnitOfWork(session_factory(settings)) as uow:
        job_id = create_job(uow, settings, Submission(Incoming("cli", user_id, channel),
                                                      content)).id
    return _follow(settings, job_id, timeout_s)


def _follow(settings, job_id: uuid.UUID, timeout_s: float) -> int:
    """Print a job's events as they happen, then its answer. Ctrl-C cancels the job (it ends
    `cancelled` at its next step boundary); a second Ctrl-C stops waiting for that."""
    from agentq.db import session_factory
    sessions = session_factory(settings)
    seen, deadline, cancelled = 0, time.monotonic() + timeout_s, False
    with _CtrlC.counting() as ctrl_c:
        while time.monotonic() < deadline:
            if ctrl_c.count and not cancelled:
                cancelled = True
                _cancel_local(settings, job_id)
                _status_line("· cancel requested (Ctrl-C again to stop waiting)")
                continue
            if ctrl_c.count >= 2:
                _error_line(f"stopped waiting; job {job_id} was asked to cancel")
                return EXIT_INTERRUPTED
            seen, job = _print_new_events(sessions, job_id, seen)
            if job.status in TERMINAL_STATUSES:
                return _print_ending(job_id, job.status, job.finish_reason, job.response or {})
            time.sleep(EMBEDDED_POLL_S)
    _error_line(f"job {job_id} still running after {timeout_s:g} s")
    return EXIT_TIMEOUT


class _CtrlC:
    """Ctrl-C while `agentq run` waits: the SIGINT handler only counts, and the wait loop
    acts between its polls. (A KeyboardInterrupt is raised wherever the main thread is,
    inside a database or connection-pool call too, where it can leave a lock taken that the
    cancel after it then waits on. A run in a loaded CI once never said "cancel requested"
    after its Ctrl-C; this is the likeliest cause, and it cannot happen with a handler that
    only counts.)"""

    def __init__(self) -> None:
        self.count = 0

    def _handler(self, _signum, _frame) -> None:
        self.count += 1

    @classmethod
    @contextmanager
    def counting(cls) -> Iterator["_CtrlC"]:
        import signal
        counter = cls()
        try:
            previous = signal.signal(signal.SIGINT, counter._handler)
        except ValueError:  # not the main thread: Ctrl-C is not ours to take
            previous = None
        try:
            yield counter
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
EMBEDDED_POLL_S = 0.05
"""How often `agentq run` reads its job's new events (a local SQLite read)."""


def _print_new_events(sessions, job_id: uuid.UUID, seen: int):
    from sqlalchemy import select

    from agentq.models import Job, JobEvent
    with sessions() as session:
        events = session.execute(select(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.seq > seen).order_by(JobEvent.seq)
        ).scalars().all()
        job = session.get(Job, job_id)
        session.expunge_all()
    for event in events:
        seen = event.seq
        line = _describe(event.type, event.data)
        if line is not None:
            _status_line(line)
    return seen, job


def _cancel_local(settings, job_id: uuid.UUID) -> None:
    """What POST /v1/jobs/<id>/cancel does, on this process's own database and broker."""
    from agentq.db import session_factory
    from agentq.loop.submit import cancel
    from agentq.models import Job
    from agentq.uow import UnitOfWork
    import tasks.dispatch  # noqa: F401  (the cancel's effects go out through it)
    with UnitOfWork(session_factory(settings)) as uow:
        job = uow.session.get(Job, job_id)
        if job is None or job.status in TERMINAL_STATUSES:
            return
        cancel(uow, job)


def _describe(kind: str, data: dict) -> str | None:
    match kind:
        case "turn_start":
            return f"· turn {data.get('turn')}"
        case "message_start":
            return None
        case "message_end" if data.get("role", "assistant") == "assistant":
            calls = data.get("tool_calls") or []
            return f"  model {data.get('model')}: " + (f"calls {', '.join(calls)}" if calls
                                                       else "answers")
        case "message_end":  # the user's question (they know it), steering, a limit's note
            return "· steering message taken" if data.get("kind") == "steering" else None
        case "tool_execution_start":
            return f"  → {data.get('name')} {json.dumps(data.get('arguments'))}"
        case "tool_execution_end":
            line = f"  ← {data.get('name')} {'ok' if data.get('ok') else data.get('error')}"
            if "arguments" in data:  # rejected before it ran: what the model sent
                line += f" {json.dumps(data.get('arguments'))}"
            return line
        case "waiting_provider":
            return (f"  provider unavailable ({data.get('error')}); "
                    f"next attempt at {data.get('next_attempt_at')}")
        case "job_end":
            return f"· {data.get('status')} ({data.get('finish_reason')})"
        case "turn_end":
            return None
        case _:
            return f"· {kind}"


# --- a running API, over HTTP, for people ----------------------------------------------
ON_BUSY_CHOICES = ("queue", "steer", "interrupt", "reject")
SSE_READ_TIMEOUT_S = 45.0  # the API sends a keep-alive every 15 s
SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def _api_options(command):
    command = click.option("--key", default=None,
                           help="API key. Default: $AGENTQ_API_KEY, else the key `agentq dev` "
                                "wrote to $AGENTQ_HOME/dev-key.")(command)
    return click.option("--url", default=None,
                        help="The API. Default: $AGENTQ_URL, else http://127.0.0.1:$PORT."
                        )(command)


def _api_client(url: str | None, key: str | None):
    import httpx
    settings = get_settings()
    base = (url or os.environ.get("AGENTQ_URL")
            or f"http://127.0.0.1:{settings.port}").rstrip("/")
    key = key or os.environ.get("AGENTQ_API_KEY")
    dev_key = settings.home / "dev-key"
    if not key and dev_key.exists():
        key = dev_key.read_text().strip()
    if not key:
        raise click.ClickException(f"no API key: pass --key, set AGENTQ_API_KEY, or run "
                                   f"`agentq dev` (it writes {dev_key})")
    return httpx.Client(base_url=base, timeout=httpx.Timeout(30.0, connect=5.0),
                        headers={"Authorization": f"Bearer {key}",
                                 "User-Agent": "agentq-cli"})


def _api_error(response) -> click.ClickException:
    try:
        error = response.json()["error"]
        detail = f"{error['code']}: {error['message']}"
        if error.get("details"):
            detail += f" {json.dumps(error['details'])}"
    except (ValueError, KeyError, TypeError):
        detail = response.text[:500]
    return click.ClickException(f"{response.request.method} {response.request.url.path} → "
                                f"{response.status_code} {detail}")


def _api_call(client, method: str, path: str, **kw) -> dict:
    import httpx
    try:
        response = client.request(method, path, **kw)
    except httpx.TransportError as exc:
        raise click.ClickException(f"cannot reach {client.base_url} ({exc}); is the API "
                                   f"running (`agentq dev`)?") from None
    if response.status_code >= 400:
        raise _api_error(response)
    return response.json()


def _sse_events(client, job_id: str, after: int):
    """The job's events as server-sent events after `after`; None for each keep-alive."""
    import httpx
    headers = {"Accept": "text/event-stream"}
    if after:
        headers["Last-Event-ID"] = str(after)
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                       timeout=httpx.Timeout(10.0, read=SSE_READ_TIMEOUT_S)) as response:
        if response.status_code >= 400:
            response.read()
            raise _api_error(response)
        data: list[str] = []
        for line in response.iter_lines():
            if not line:
                if data:
                    yield json.loads("\n".join(data))
                    data = []
            elif line.startswith(":"):
                yield None
            else:
                name, _, value = line.partition(":")
                if name == "data":
                    data.append(value[1:] if value.startswith(" ") else value)


class _Progress:
    """Event lines on stderr, each after the time since the start; under them, while waiting
    and when stderr is a terminal, a spinner saying what the job is doing."""
    STATUS = {"job_start": "starting", "turn_start": "the model is thinking",
              "tool_execution_start": "running tools", "turn_end": "the model is thinking",
              "steering_injected": "the model is thinking",
              "waiting_provider": "waiting for the model provider"}

    def __init__(self, started: float):
        import threading
        self.started, self.status = started, "queued"
        self.stream = sys.stderr
        self.live = self.stream.isatty()
        self.lock, self.done = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def __enter__(self) -> "_Progress":
        if self.live:
            self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.done.set()
        if self.live:
            self.thread.join()
            with self.lock:
                self.stream.write("\r\033[K")
                self.stream.flush()

    def event(self, kind: str, data: dict) -> None:
        self.status = self.STATUS.get(kind, self.status)
        line = _describe(kind, data)
        if line is not None:
            self.line(line)

    def line(self, text: str) -> None:
        with self.lock:
            self.stream.write(("\r\033[K" if self.live else "")
                              + f"{time.monotonic() - self.started:6.1f}s {text}\n")
            self.stream.flush()

    def _spin(self) -> None:
        frame = 0
        while not self.done.wait(0.1):
            with self.lock:
                self.stream.write(f"\r\033[K{SPINNER_FRAMES[frame % len(SPINNER_FRAMES)]} "
                                  f"{self.status} ({time.monotonic() - self.started:.1f} s)")
                self.stream.flush()
            frame += 1


def _follow_http(client, job_id: str, timeout_s: float) -> int:
    """Print the job's events as they happen (stderr), then its answer and files (stdout)."""
    import httpx
    started = time.monotonic()
    deadline, last, ended = started + timeout_s, 0, False
    try:
        with _Progress(started) as progress:
            while not ended and time.monotonic() < deadline:
                try:
                    for event in _sse_events(client, job_id, last):
                        if event is not None and event.get("seq") is None:
                            continue  # a message_delta (streamed text), not a stored event
                        if event is not None:
                            last = event["seq"]
                            progress.event(event["type"], event.get("data") or {})
                            ended = event["type"] == "job_end"
                        if ended or time.monotonic() >= deadline:
                            break
                except httpx.TransportError as exc:  # dropped: resume after the last seq
                    progress.line(f"(event stream interrupted: {exc}; resuming)")
                    time.sleep(1)
    except KeyboardInterrupt:
        _error_line(f"stopped following; job {job_id} goes on (agentq jobs show {job_id})")
        return EXIT_INTERRUPTED
    if not ended:
        _error_line(f"job {job_id} still running after {timeout_s:g} s "
                    f"(agentq jobs show {job_id})")
        return EXIT_TIMEOUT
    job = _api_call(client, "GET", f"/v1/jobs/{job_id}")
    return _print_ending(job_id, job["status"], job.get("finish_reason"),
                         job.get("response") or {})


@main.command("submit", epilog="With --wait: " + EXIT_CODES_HELP)
@click.argument("content")
@click.option("--wait", is_flag=True,
              help="Follow the job: its events on stderr as they happen, then the answer on "
                   "stdout. Without it, print the job's id.")
@click.option("--user", "user_id", default="local-user", show_default=True,
              help="The platform user the message is from (its budget applies).")
@click.option("--channel", default="cli", show_default=True,
              help="The channel: one conversation per user, channel and thread.")
@click.option("--platform", default="cli", show_default=True,
              help="The platform the user and channel belong to.")
@click.option("--thread", default=None, help="A thread is its own conversation.")
@click.option("--on-busy", type=click.Choice(ON_BUSY_CHOICES), default=None,
              help="When the conversation already runs a job (the API's default: queue).")
@click.option("--timeout", "timeout_s", type=float, default=600, show_default=True,
              help="With --wait: stop following after this many seconds.")
@_api_options
def submit(content: str, wait: bool, user_id: str, channel: str, platform: str,
           thread: str | None, on_busy: str | None, timeout_s: float, url: str | None,
           key: str | None) -> None:
    """Send a message to a running API (`agentq dev`, or a deployment) as a job."""
    body = {"platform": platform, "platform_user_id": user_id,
            "platform_channel_id": channel, "platform_thread_id": thread, "content": content}
    if on_busy:
        body["on_busy"] = on_busy
    with _api_client(url, key) as client:
        job = _api_call(client, "POST", "/v1/messages", json=body)
        if not wait:
            click.echo(job["id"])
            return
        click.echo(f"job {job['id']} ({job['status']})", err=True)
        code = _follow_http(client, job["id"], timeout_s)
    sys.exit(code)


@main.group("jobs")
def jobs() -> None:
    """Jobs: `show` asks a running API, `list` reads the database."""


@jobs.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object {\"job\", \"events\"} instead.")
@_api_options
def jobs_show(job_id: str, as_json: bool, url: str | None, key: str | None) -> None:
    """Print a job object and its events."""
    with _api_client(url, key) as client:
        job = _api_call(client, "GET", f"/v1/jobs/{job_id}")
        events: list[dict] = []
        while True:
            page = _api_call(client, "GET", f"/v1/jobs/{job_id}/events",
                             params={"after": events[-1]["seq"] if events else 0})
            events += page["data"]
            if not page.get("has_more") or not page["data"]:
                break
    if as_json:
        click.echo(json.dumps({"job": job, "events": events}, indent=2))
        return
    click.echo(json.dumps(job, indent=2))
    click.echo(f"events ({len(events)}):")
    for event in events:
        line = _describe(event["type"], event.get("data") or {}) or f"· {event['type']}"
        click.echo(f"  {event['seq']:>4}  {event['created_at']}  {line.strip()}")


@jobs.command("list")
@click.option("--status", type=click.Choice(["queued", "running", "completed", "failed",
                                             "cancelled"]), default=None,
              help="Only jobs with this status.")
@click.option("--limit", type=click.IntRange(1, 10000), default=20, show_default=True,
              help="The newest this many jobs.")
@click.option("--tenant", "tenant_ref", default=None,
              help="Only this tenant's jobs, by id or name (default: every tenant's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON job object a line instead.")
def jobs_list(status: str | None, limit: int, tenant_ref: str | None, as_json: bool) -> None:
    """The newest jobs in the database (AGENTQ_DATABASE_URL; the embedded SQLite file by
    default), newest first: id, status, finish reason, created, the message's start."""
    from sqlalchemy import select

    from agentq.db import session_scope
    from agentq.models import Job
    from agentq.tenants import find_tenant
    from agentq.views import job_object
    with session_scope() as session:
        query = select(Job).order_by(Job.created_at.desc()).limit(limit)
        if status:
            query = query.where(Job.status == status)
        if tenant_ref:
            with _client_errors():
                query = query.where(Job.tenant_id == find_tenant(session, tenant_ref).id)
        rows = session.execute(query).scalars().all()
        for job in rows:
            if as_json:
                click.echo(json.dumps(job_object(job)))
                continue
            content = " ".join(job.content.split())
            click.echo(f"{job.id}  {job.status:<9}  {job.finish_reason or '-':<15}  "
                       f"{job.created_at:%Y-%m-%d %H:%M:%S}  "
                       f"{content[:50] + ('…' if len(content) > 50 else '')}")


from agentq import cli_batches  # noqa: E402,F401  (registers `batch` and `replay`)

if __name__ == "__main__":  # pragma: no cover
    main()
