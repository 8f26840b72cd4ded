"""`agentq submit|jobs|…` against a running API, over HTTP, for people."""
from __future__ import annotations

import json
import os
import sys
import time

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

# --- a running API, over HTTP, for people ----------------------------------------------
ON_BUSY_CHOICES = ("queue", "steer", "interrupt", "reject")
SSE_READ_TIMEOUT_S = 45.0  # the API sends a keep-alive every 15 s
SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def _api_options(command):
    setattr(command, REMOTE_MARK, True)  # its log goes to the user's state directory
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


def _down(client) -> list[str]:
    """What GET /health/ready says is away (`broker`, `database`); [] when all answer, or
    when it cannot be asked."""
    import httpx
    try:
        response = client.get("/health/ready", timeout=5)
        return list(response.json().get("down") or []) if response.status_code == 503 else []
    except (httpx.TransportError, ValueError, AttributeError):
        return []


class _Watch:
    """Says, while a job has not started, when the API's broker or database is unreachable
    (the job waits for it) and when it is back."""

    def __init__(self, client, progress: "_Progress"):
        self.client, self.progress = client, progress
        self.checked_at, self.told = -READY_CHECK_S, []

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


def _follow_http(client, job_id: str, timeout_s: float) -> int:
    """Print the job's events as they happen (stderr), then its answer and files (stdout);
    while the job waits for an API's broker or database that is away, say so."""
    import httpx
    started = time.monotonic()
    deadline, last, ended = started + timeout_s, 0, False
    try:
        with _Progress(started) as progress:
            watch = _Watch(client, progress)
            while not ended and time.monotonic() < deadline:
                watch.look()
                try:
                    for event in _sse_events(client, job_id, last):
                        watch.look()
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
        status = _api_call(client, "GET", f"/v1/jobs/{job_id}").get("status")
        if status == JobStatus.QUEUED:
            down = _down(client)
            _error_line(f"job {job_id} did not start within {timeout_s:g} s"
                        + (f" (the API's {' and '.join(down)} is unreachable)" if down else "")
                        + f" (agentq jobs show {job_id})")
        else:
            _error_line(f"job {job_id} still {status} after {timeout_s:g} s "
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
    """Jobs: `show` asks a running API, `list` reads the database, `cancel` either."""


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


@jobs.command("cancel")
@click.argument("job_id", type=click.UUID)
@_api_options
def jobs_cancel(job_id, url: str | None, key: str | None) -> None:
    """Cancel a job. With --url (or AGENTQ_URL): through that API. Otherwise in the database
    (AGENTQ_DATABASE_URL; the embedded SQLite of `agentq run` and `agentq dev` by default):
    a job that never started, or whose step no process is running (an `agentq run` that
    timed out), ends at once; a running one at its next step boundary."""
    if url or os.environ.get("AGENTQ_URL"):
        with _api_client(url, key) as client:
            job = _api_call(client, "POST", f"/v1/jobs/{job_id}/cancel")
        click.echo(f"job {job_id}: {job['status']}")
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
