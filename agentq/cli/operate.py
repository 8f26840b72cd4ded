"""`agentq db|tenants|keys|modules|users|personas|usage`: operate a deployment, on its
database directly."""
from __future__ import annotations

import json
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import click

from agentq.cli.core import _client_errors, main
from agentq.config import get_settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


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
        from agentq.config.environment import typed_database_url
        raise click.ClickException(f"cannot reach the database at {typed_database_url()}: "
                                   f"{first}") from None
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
              help="An admin key: with --tenant, that tenant's admin (its keys, personas, "
                   "users, usage, modules, schedules; every key's rows there); without "
                   "--tenant, an operator (every tenant: the tenants' routes, keys of any "
                   "tenant). Operators are made only here, never through the API.")
def keys_create(name: str, tenant_ref: str | None, admin: bool) -> None:
    """Make a key; it is printed once on stdout, only its hash is stored."""
    from agentq.db import session_scope
    from agentq.keys import create_key
    from agentq.tenants import find_tenant
    with _client_errors(), session_scope() as session:
        _row, key = create_key(session, name, admin, find_tenant(session, tenant_ref).id,
                               operator=admin and tenant_ref is None)
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
              budget: int | str | None, tenant_ref: str | None) -> None:
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
            # BUDGET gives a whole number or UNLIMITED
            user.token_budget_monthly = None if budget == UNLIMITED else int(budget)
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
    from agentq.keys import key_object, revoke_key
    with _admin_session(None) as (session, _tenant):
        row = revoke_key(session, key_id)
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
