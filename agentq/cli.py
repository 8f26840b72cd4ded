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
    from agentq.errors import ClientError
    from agentq.tenants import create_tenant, tenant_object
    try:
        with session_scope() as session:
            body = tenant_object(create_tenant(session, name))
    except ClientError as exc:
        raise click.ClickException(exc.message) from None
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
    from agentq.errors import ClientError
    from agentq.keys import create_key
    from agentq.tenants import find_tenant
    try:
        with session_scope() as session:
            tenant = find_tenant(session, tenant_ref)
            _row, key = create_key(session, name, admin, tenant.id)
    except ClientError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(key)


@main.group()
def users() -> None:
    """Users and their budgets."""


@users.command("set")
@click.argument("platform")
@click.argument("platform_user_id")
@click.option("--level", type=click.Choice(["guest", "user", "admin", "owner"]))
@click.option("--budget", help="Monthly tokens, or 'unlimited'.")
@click.option("--tenant", "tenant_ref", default=None,
              help="The user's tenant, by id or name (default: the default tenant).")
def users_set(platform: str, platform_user_id: str, level: str | None,
              budget: str | None, tenant_ref: str | None) -> None:
    """Set a user's permission level or monthly budget (the user is made if new)."""
    from agentq.db import session_scope
    from agentq.errors import ClientError
    from agentq.loop.identity import Incoming, resolve_user
    from agentq.tenants import find_tenant
    with session_scope() as session:
        try:
            tenant_id = find_tenant(session, tenant_ref).id
        except ClientError as exc:
            raise click.ClickException(exc.message) from None
        user = resolve_user(session, tenant_id, Incoming(platform, platform_user_id, "-"),
                            get_settings())
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
LOCAL_MODEL_DEFAULTS = {
    "AGENTQ_LLM_TIMEOUT_S": "120",  # a small CPU model may think for a while
    "AGENTQ_LLM_RETRIES": "1",  # a slow local server is not made faster by asking again
    "AGENTQ_MAX_TOKENS_PER_REQUEST": "256",  # tiny models ramble
    "AGENTQ_MAX_ITERATIONS": "5",  # ...and loop
    "AGENTQ_GUEST_MONTHLY_TOKENS": "100000",  # local tokens cost nothing; 5000 is ~2 runs
}
"""Set for the local model unless the environment already sets them."""


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
    click.echo(f"agentq: OPENAI_BASE_URL and OPENAI_API_KEY are unset and the local model "
               f"is not installed ({reason}); trying OpenAI. For a model on this machine: "
               f"{local_model.INSTALL_HINT}", err=True)
    return False


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
    click.echo(f"agentq: local model {server.alias} ready on {server.base_url} in "
               f"{time.monotonic() - started:.1f} s", err=True)
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
@click.option("--local-model", is_flag=True,
              help="Run llama.cpp's server with the packaged small model (the `local` extra) "
                   "as a child process and use it as the model server.")
def dev(port: int | None, local_model: bool) -> None:
    """Serve the API with an in-process broker, worker and sweeper, on SQLite by default."""
    settings, worker, server = _embedded(local_model)
    key = _dev_key(settings)
    port = port or settings.port
    click.echo(f"agentq on http://127.0.0.1:{port}  (database {settings.database_url})")
    click.echo(f"admin key (also in {settings.home / 'dev-key'}): {key}")
    from api import create_app
    try:
        create_app(settings).run(host="127.0.0.1", port=port, threaded=True)
    finally:
        worker.stop()
        if server is not None:
            server.stop()


@main.command("run")
@click.argument("content")
@click.option("--user", "user_id", default="local-user", show_default=True)
@click.option("--channel", default="cli", show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=300, show_default=True)
@click.option("--local-model/--no-local-model", default=None,
              help="Use llama.cpp's server with the packaged small model (the `local` extra). "
                   "Default: yes when OPENAI_BASE_URL and OPENAI_API_KEY are both unset and "
                   "the extra is installed.")
def run(content: str, user_id: str, channel: str, timeout_s: float,
        local_model: bool | None) -> None:
    """Run one message through the whole loop in this process and print what happens."""
    settings, worker, server = _embedded(_wants_local_model(local_model))
    try:
        code = _run_one(settings, content, user_id, channel, timeout_s)
    finally:
        worker.stop()
        if server is not None:
            server.stop()
    sys.exit(code)


def _run_one(settings, content: str, user_id: str, channel: str, timeout_s: float) -> int:
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
    return _follow(session_factory(settings), job_id, timeout_s)


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
              "steering_injected": "the model is thinking"}

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
        self.line(_describe(kind, data))

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
        click.echo(f"\nstopped following; job {job_id} goes on "
                   f"(agentq jobs show {job_id})", err=True)
        return 130
    if not ended:
        click.echo(f"job {job_id} still running after {timeout_s:g} s "
                   f"(agentq jobs show {job_id})", err=True)
        return 2
    job = _api_call(client, "GET", f"/v1/jobs/{job_id}")
    response = job.get("response") or {}
    if job["status"] != "completed" and response.get("error"):
        click.echo(f"job {job['status']}: {json.dumps(response['error'])}", err=True)
    click.echo(response.get("content") or "")
    for f in response.get("files") or []:
        click.echo(f"  file: {f['filename']} {f['url']}")
    return 0 if job["status"] == "completed" else 1


@main.command("submit")
@click.argument("content")
@click.option("--wait", is_flag=True,
              help="Follow the job: its events on stderr as they happen, then the answer on "
                   "stdout. Without it, print the job's id.")
@click.option("--user", "user_id", default="local-user", show_default=True)
@click.option("--channel", default="cli", show_default=True)
@click.option("--platform", default="cli", show_default=True)
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
    """Jobs on a running API."""


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
        click.echo(f"  {event['seq']:>4}  {event['created_at']}  "
                   f"{_describe(event['type'], event.get('data') or {}).strip()}")


from agentq import cli_batches  # noqa: E402,F401  (registers `batch` and `replay`)

if __name__ == "__main__":  # pragma: no cover
    main()
