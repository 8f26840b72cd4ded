"""The `agentq` command: operate a deployment (db, keys, users, processes) and run the whole
loop on one machine with no servers (`agentq dev`, `agentq run`)."""
from __future__ import annotations

import json
import os
import sys
import time
import uuid

import click

from agentq import logs
from agentq.config import get_settings

PROCESS_KINDS = ("orchestrator", "tools", "tools-slow", "webhooks")


@click.group()
def main() -> None:
    """agentq: durable LLM agent loops on Celery."""


# --- database ---------------------------------------------------------------------------
@main.group()
def db() -> None:
    """The database schema (Alembic)."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Migrate the database to REVISION (default: the newest)."""
    from agentq import migrate
    migrate.upgrade(revision=revision)
    click.echo(f"database at {revision}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Migrate the database back to REVISION."""
    from agentq import migrate
    migrate.downgrade(revision=revision)
    click.echo(f"database at {revision}")


# --- keys and users ---------------------------------------------------------------------
@main.group()
def keys() -> None:
    """API keys."""


@keys.command("create")
@click.argument("name")
@click.option("--admin", is_flag=True, help="The key may use admin routes and see all jobs.")
def keys_create(name: str, admin: bool) -> None:
    """Make a key; it is printed once on stdout, only its hash is stored."""
    from agentq.db import session_scope
    from agentq.keys import create_key
    with session_scope() as session:
        _row, key = create_key(session, name, admin)
    click.echo(key)


@main.group()
def users() -> None:
    """Users and their budgets."""


@users.command("set")
@click.argument("platform")
@click.argument("platform_user_id")
@click.option("--level", type=click.Choice(["guest", "user", "admin", "owner"]))
@click.option("--budget", help="Monthly tokens, or 'unlimited'.")
def users_set(platform: str, platform_user_id: str, level: str | None,
              budget: str | None) -> None:
    """Set a user's permission level or monthly budget (the user is made if new)."""
    from agentq.db import session_scope
    from agentq.loop.identity import Incoming, resolve_user
    with session_scope() as session:
        user = resolve_user(session, Incoming(platform, platform_user_id, "-"), get_settings())
        if level:
            user.permission_level = level
        if budget is not None:
            user.token_budget_monthly = None if budget == "unlimited" else int(budget)
        click.echo(json.dumps({"user_id": str(user.id), "permission_level":
                               user.permission_level,
                               "token_budget_monthly": user.token_budget_monthly}))


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
        queues, pool, conc = registry.queues(slow=False), "threads", settings.tools_concurrency
    elif kind == "tools-slow":
        queues, pool, conc = (registry.queues(slow=True), "prefork",
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
    """Run the periodic scheduler (the sweeper) with a worker on the maintenance queue."""
    settings = get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "-B",
            "-s", str(settings.home / "celerybeat-schedule"), "-Q", "maintenance",
            "-P", "threads", "-c", "2", "-n", "beat@%h", "--without-gossip",
            "--without-mingle", "-l", settings.log_level]
    os.execvp(args[0], args)


# --- one machine, no servers ------------------------------------------------------------
def _embedded():
    settings = get_settings()
    if not settings.embedded_broker:
        raise click.ClickException("`agentq dev` and `agentq run` use the embedded broker; "
                                   "unset AGENTQ_BROKER_URL or run the Procfile's processes.")
    logs.configure(settings.log_level)
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


@main.command("dev")
@click.option("--port", type=int, default=None, help="Default: $PORT or 5000.")
def dev(port: int | None) -> None:
    """Serve the API with an in-process broker, worker and sweeper, on SQLite by default."""
    settings, worker = _embedded()
    key = _dev_key(settings)
    port = port or settings.port
    click.echo(f"agentq on http://127.0.0.1:{port}  (database {settings.database_url})")
    click.echo(f"admin key (also in {settings.home / 'dev-key'}): {key}")
    from api import create_app
    try:
        create_app(settings).run(host="127.0.0.1", port=port, threaded=True)
    finally:
        worker.stop()


@main.command("run")
@click.argument("content")
@click.option("--user", "user_id", default="local-user", show_default=True)
@click.option("--channel", default="cli", show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=300, show_default=True)
def run(content: str, user_id: str, channel: str, timeout_s: float) -> None:
    """Run one message through the whole loop in this process and print what happens."""
    settings, worker = _embedded()
    from agentq.db import session_factory, session_scope
    from agentq.loop.identity import Incoming
    from agentq.loop.step import NextStep
    from agentq.loop.submit import Submission, create_job
    from tasks.dispatch import dispatch
    with session_scope(settings) as session:
        job = create_job(session, settings, Submission(Incoming("cli", user_id, channel),
                                                       content))
        job_id = job.id
    dispatch([NextStep(str(job_id), 0, "start")])
    code = _follow(session_factory(settings), job_id, timeout_s)
    worker.stop()
    sys.exit(code)


def _follow(sessions, job_id: uuid.UUID, timeout_s: float) -> int:
    """Print a job's events as they happen, then its answer."""
    from sqlalchemy import select

    from agentq.models import TERMINAL_STATUSES, Job, JobEvent
    seen, deadline = 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with sessions() as session:
            events = session.execute(select(JobEvent).where(
                JobEvent.job_id == job_id, JobEvent.seq > seen).order_by(JobEvent.seq)
            ).scalars().all()
            job = session.get(Job, job_id)
        for event in events:
            seen = event.seq
            click.echo(_describe(event.type, event.data), err=True)
        if job.status in TERMINAL_STATUSES:
            response = job.response or {}
            click.echo(response.get("content") or "")
            for f in response.get("files") or []:
                click.echo(f"  file: {f['filename']} {f['url']}")
            return 0 if job.status == "completed" else 1
        time.sleep(0.1)
    click.echo(f"job {job_id} still running after {timeout_s:g} s", err=True)
    return 2


def _describe(kind: str, data: dict) -> str:
    match kind:
        case "turn_start":
            return f"· turn {data.get('turn')}"
        case "message_end":
            calls = data.get("tool_calls") or []
            return f"  model {data.get('model')}: " + (f"calls {', '.join(calls)}" if calls
                                                       else "answers")
        case "tool_execution_start":
            return f"  → {data.get('name')} {json.dumps(data.get('arguments'))}"
        case "tool_execution_end":
            return f"  ← {data.get('name')} {'ok' if data.get('ok') else data.get('error')}"
        case "job_end":
            return f"· {data.get('status')} ({data.get('finish_reason')})"
        case _:
            return f"· {kind}"


if __name__ == "__main__":  # pragma: no cover
    main()
