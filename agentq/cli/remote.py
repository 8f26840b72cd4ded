"""`agentq submit|jobs|…` against a running API, over HTTP, for people."""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import click

from agentq.cli.core import (
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_TIMEOUT,
    REMOTE_MARK,
    _client_errors,
    _error_line,
    _print_ending,
    main,
)
from agentq.cli.local import _describe
from agentq.config import get_settings
from agentq.loop.states import COUNTED_STATUSES, JobStatus

if TYPE_CHECKING:  # agentq.client (httpx) is imported when a command talks to an API
    from agentq.client import AgentQ, ApiError, Event

# --- a running API, over HTTP, for people ----------------------------------------------
ON_BUSY_CHOICES = ("queue", "steer", "interrupt", "reject")
SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def _api_options(command):
    setattr(command, REMOTE_MARK, True)  # its log goes to the user's state directory
    command = click.option("--key", default=None,
                           help="API key. Default: $AGENTQ_API_KEY, else the key `agentq dev` "
                                "wrote to $AGENTQ_HOME/dev-key.")(command)
    return click.option("--url", default=None,
                        help="The API. Default: $AGENTQ_URL, else http://127.0.0.1:$PORT."
                        )(command)


def _api_client(url: str | None, key: str | None) -> AgentQ:
    """The API's client (agentq.client), as the CLI uses it: one attempt a request (a
    person is watching: an error is shown at once) and the CLI's User-Agent."""
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
    from agentq.client import AgentQ
    client = AgentQ(base, api_key=key, timeout_s=30.0, attempts=1)
    client.http.headers["User-Agent"] = "agentq-cli"
    return client


def _api_error(exc: ApiError) -> click.ClickException:
    """`METHOD /path → status code: message {details}` (the body's start when it was not
    API.md's error shape)."""
    from agentq.client._core import NOT_THE_ERROR_SHAPE
    if exc.code == NOT_THE_ERROR_SHAPE:
        detail = exc.message
    else:
        detail = f"{exc.code}: {exc.message}"
        if exc.details:
            detail += f" {json.dumps(exc.details)}"
    return click.ClickException(f"{exc.method} {exc.path} → {exc.status} {detail}")


@contextmanager
def _api_errors(client: AgentQ) -> Iterator[None]:
    """The client's errors as the CLI's one line each (exit status 1)."""
    from agentq.client import ApiError, TransportError
    try:
        yield
    except ApiError as exc:
        raise _api_error(exc) from None
    except TransportError as exc:
        raise click.ClickException(f"cannot reach {client.http.base_url} "
                                   f"({exc.__cause__ or exc}); is the API running "
                                   f"(`agentq dev`)?") from None


class _Progress:
    """Event lines on stderr, each after the time since the start; under them, while waiting
    and when stderr is a terminal, a spinner saying what the job is doing."""
    STATUS = {"job_start": "starting", "turn_start": "the model is thinking",
              "tool_execution_start": "running tools", "turn_end": "the model is thinking",
              "steering_injected": "the model is thinking",
              "waiting_provider": "waiting for the model provider"}

    def __init__(self, started: float):
        import threading
        self.started, self.status = started, JobStatus.QUEUED.value
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


READY_CHECK_S = 10.0
"""While a followed job has not started, how often `submit --wait` asks GET /health/ready
whether the API's broker or database is away (it says so once, and once when it is back)."""


def _down(client: AgentQ) -> list[str]:
    """What GET /health/ready says is away (`broker`, `database`); [] when all answer, or
    when it cannot be asked."""
    from agentq.client import AgentQError
    try:
        return client.down()
    except AgentQError:
        return []


class _Watch:
    """Says, while a job has not started, when the API's broker or database is unreachable
    (the job waits for it) and when it is back."""

    def __init__(self, client: AgentQ, progress: "_Progress"):
        self.client, self.progress = client, progress
        self.checked_at = -READY_CHECK_S
        self.told: list[str] = []

    def look(self) -> None:
        if self.progress.status != JobStatus.QUEUED and not self.told:
            return
        if time.monotonic() - self.checked_at < READY_CHECK_S:
            return
        self.checked_at = time.monotonic()
        down = _down(self.client)
        if down and down != self.told:
            self.progress.line(f"the API's {' and '.join(down)} is unreachable "
                               f"(GET /health/ready): the job starts once it is back")
        elif self.told and not down:
            self.progress.line(f"the API's {' and '.join(self.told)} answers again")
        self.told = down


def _follow_http(client: AgentQ, job_id: str, timeout_s: float) -> int:
    """Print the job's events as they happen (stderr), then its answer and files (stdout);
    while the job waits for an API's broker or database that is away, say so."""
    started = time.monotonic()
    deadline, last, ended = started + timeout_s, 0, False
    try:
        with _Progress(started) as progress:
            watch = _Watch(client, progress)
            while not ended and time.monotonic() < deadline:
                watch.look()
                try:
                    with _api_errors(client):
                        for event in _watched(client, job_id, last):
                            watch.look()
                            if event is not None:
                                last = event.seq
                                progress.event(event.type, event.data)
                                ended = event.type == "job_end"
                            if ended or time.monotonic() >= deadline:
                                break
                except _Dropped as exc:  # resume after the last seq
                    progress.line(f"(event stream interrupted: {exc.cause}; resuming)")
                    time.sleep(1)
    except KeyboardInterrupt:
        _error_line(f"stopped following; job {job_id} goes on (agentq jobs show {job_id})")
        return EXIT_INTERRUPTED
    with _api_errors(client):
        job = client.job(job_id)
    if not ended:
        if job.status == JobStatus.QUEUED:
            down = _down(client)
            _error_line(f"job {job_id} did not start within {timeout_s:g} s"
                        + (f" (the API's {' and '.join(down)} is unreachable)" if down else "")
                        + f" (agentq jobs show {job_id})")
        else:
            _error_line(f"job {job_id} still {job.status} after {timeout_s:g} s "
                        f"(agentq jobs show {job_id})")
        return EXIT_TIMEOUT
    return _print_ending(job_id, job.status, job.finish_reason, job.raw.get("response") or {})


class _Dropped(Exception):
    """The event stream's connection broke (`cause`: the transport's error)."""

    def __init__(self, cause: BaseException | None):
        super().__init__(str(cause))
        self.cause = cause


def _watched(client: AgentQ, job_id: str, after: int) -> Iterator[Event | None]:
    """`client.watch`, its broken connection a `_Dropped` (the follower resumes; any other
    error ends the command)."""
    from agentq.client import TransportError
    try:
        yield from client.watch(job_id, after)
    except TransportError as exc:
        raise _Dropped(exc.__cause__ or exc) from None


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
    with _api_client(url, key) as client:
        with _api_errors(client):
            job = client.submit(content, user=user_id, channel=channel, platform=platform,
                                thread=thread, on_busy=on_busy)
        if not wait:
            click.echo(job.id)
            return
        click.echo(f"job {job.id} ({job.status})", err=True)
        code = _follow_http(client, job.id, timeout_s)
    sys.exit(code)


@main.group("jobs")
def jobs() -> None:
    """Jobs: `show` asks a running API, `list` reads the database, `cancel` either."""


@jobs.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object {\"job\", \"events\"} instead.")
@_api_options
def jobs_show(job_id: str, as_json: bool, url: str | None, key: str | None) -> None:
    """Print a job object and its events."""
    with _api_client(url, key) as client, _api_errors(client):
        job = client.job(job_id).raw
        events = [event.raw for event in client.events(job_id)]
    if as_json:
        click.echo(json.dumps({"job": job, "events": events}, indent=2))
        return
    click.echo(json.dumps(job, indent=2))
    click.echo(f"events ({len(events)}):")
    for event in events:
        line = _describe(event["type"], event.get("data") or {}) or f"· {event['type']}"
        click.echo(f"  {event['seq']:>4}  {event['created_at']}  {line.strip()}")


@jobs.command("cancel")
@click.argument("job_id", type=click.UUID)
@_api_options
def jobs_cancel(job_id, url: str | None, key: str | None) -> None:
    """Cancel a job. With --url (or AGENTQ_URL): through that API. Otherwise in the database
    (AGENTQ_DATABASE_URL; the embedded SQLite of `agentq run` and `agentq dev` by default):
    a job that never started, or whose step no process is running (an `agentq run` that
    timed out), ends at once; a running one at its next step boundary."""
    if url or os.environ.get("AGENTQ_URL"):
        with _api_client(url, key) as client, _api_errors(client):
            job = client.cancel(str(job_id))
        click.echo(f"job {job_id}: {job.status}")
        return
    from agentq.cli.local import cancel_in_database
    click.echo(cancel_in_database(get_settings(), job_id))


@jobs.command("list")
@click.option("--status", type=click.Choice(COUNTED_STATUSES), default=None,
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
