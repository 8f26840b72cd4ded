"""`agentq worker|beat|model|dev|run`: the processes of a deployment, and the whole loop
on one machine with no servers (embedded mode)."""
from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import click

from agentq import logs
from agentq.cli.core import (
    EXIT_CODES_HELP,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TIMEOUT,
    PROCESS_KINDS,
    _error_line,
    _print_ending,
    _status_line,
    log_path,
    main,
)
from agentq.config import get_settings
from agentq.config.urls import shown_url
from agentq.loop.states import ENDED, JobStatus, WaitingFor


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
        queues, pool, conc = (["orchestrator"], settings.orchestrator_pool,
                              settings.orchestrator_concurrency)
        from agentq.config.pool import connection_wait_s, missing_for
        missing = missing_for(pool)
        if missing:
            raise click.ClickException(
                f"AGENTQ_ORCHESTRATOR_POOL={pool} needs {' and '.join(missing)} installed "
                f"(pip install 'agentq[prod]')")
        if not os.environ.get("AGENTQ_DB_POOL_TIMEOUT_S"):  # the worker it execs reads it
            os.environ["AGENTQ_DB_POOL_TIMEOUT_S"] = str(connection_wait_s(
                settings.step_deadline_s, settings.db_pool_timeout_s))
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
        _row, key = create_key(session, "dev", admin=True, operator=True)
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
    click.echo(f"agentq on http://127.0.0.1:{port}  (database {shown_url(settings.database_url)})")
    click.echo(f"jobs go to {target}")
    click.echo(f"admin key (also in {settings.home / 'dev-key'}): {key}")
    click.echo(f"dashboard: http://127.0.0.1:{port}/ui (sign in with the admin key)")
    click.echo(f"logs: {log_path(settings)}")
    logs.show_on_terminal("werkzeug")
    from api import create_app
    try:
        create_app(settings).run(host="127.0.0.1", port=port, threaded=True)
    finally:
        worker.stop()
        if server is not None:
            server.stop()


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
    code, job_id = EXIT_ERROR, None
    try:
        job_id = _submit_one(settings, content, user_id, channel)
        code = _follow(settings, job_id, timeout_s)
    finally:
        if server is not None:
            server.stop()
        if code in (EXIT_TIMEOUT, EXIT_INTERRUPTED):
            # the job is still live in this process's worker: stopping it would wait for
            # its model call; the job stays in the database, where the sweeper re-drives it
            # the next time this AGENTQ_HOME runs. Its step's lease goes with this process,
            # so `agentq jobs cancel` ends it at once.
            _release_lease(settings, job_id)
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(code)
        worker.stop()
    sys.exit(code)


def _submit_one(settings, content: str, user_id: str, channel: str) -> uuid.UUID:
    import tasks.dispatch  # noqa: F401  (the job's first step goes out through it)
    from agentq.db import session_factory
    from agentq.loop.identity import Incoming
    from agentq.loop.submit import Submission, create_job
    from agentq.loop.uow import UnitOfWork
    with UnitOfWork(session_factory(settings)) as uow:
        job_id = create_job(uow, settings, Submission(Incoming("cli", user_id, channel),
                                                      content)).id
    return job_id


def _follow(settings, job_id: uuid.UUID, timeout_s: float) -> int:
    """Print a job's events as they happen, then its answer. Ctrl-C cancels the job (it ends
    `cancelled` at its next step boundary); a second Ctrl-C stops waiting for that."""
    from agentq.db import session_factory
    sessions = session_factory(settings)
    seen, deadline, cancelled = 0, time.monotonic() + timeout_s, False
    told_behind = None
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
            if job.status in ENDED:
                return _print_ending(job_id, job.status, job.finish_reason, job.response or {})
            behind = waits_behind(sessions, job)
            if behind is not None and behind.id != told_behind:
                told_behind = behind.id
                _status_line(f"· {behind_line(behind)}")
            time.sleep(EMBEDDED_POLL_S)
    behind = waits_behind(sessions, job)
    if behind is not None:
        _error_line(f"job {job_id} did not start within {timeout_s:g} s: it "
                    f"{behind_line(behind)}")
    elif job.status == JobStatus.QUEUED:
        _error_line(f"job {job_id} did not start within {timeout_s:g} s (still queued; "
                    f"`agentq jobs cancel {job_id}` cancels it)")
    else:
        _error_line(f"job {job_id} still running after {timeout_s:g} s "
                    f"(`agentq jobs cancel {job_id}` cancels it)")
    return EXIT_TIMEOUT


def waits_behind(sessions, job):
    """The job that `job` waits for (its conversation's running job), or None."""
    from agentq.models import Conversation, Job
    if job.status != JobStatus.QUEUED or job.waiting_for != WaitingFor.CONVERSATION:
        return None
    with sessions() as session:
        conversation = session.get(Conversation, job.conversation_id)
        owner = (session.get(Job, conversation.active_job_id)
                 if conversation is not None and conversation.active_job_id else None)
        if owner is None or owner.status in ENDED or owner.id == job.id:
            return None
        session.expunge_all()
    return owner


def behind_line(owner) -> str:
    """What a job waiting behind `owner` says of it: the job, since when, its question's
    start, and the command that cancels it."""
    since = owner.started_at or owner.created_at
    content = " ".join((owner.content or "").split())
    return (f"waits behind job {owner.id} ({owner.status} since {since:%Y-%m-%d %H:%M:%S} "
            f"UTC: \"{content[:40]}{'…' if len(content) > 40 else ''}\") in the same "
            f"conversation; `agentq jobs cancel {owner.id}` cancels it (or use another "
            f"--channel)")


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


def _release_lease(settings, job_id: uuid.UUID | None) -> None:
    """This process is about to end without stopping its worker: its job's step is taken
    for dead now (its lease ends), not a step deadline later."""
    if job_id is None:
        return
    from sqlalchemy import update

    from agentq.db import session_factory
    from agentq.models import Job
    try:
        with session_factory(settings)() as session, session.begin():
            session.execute(update(Job).where(Job.id == job_id)
                            .values(step_lease_until=None)
                            .execution_options(synchronize_session=False))
    except Exception:  # noqa: BLE001 - the lease then runs out as usual
        logging.getLogger(__name__).exception("the job's lease not released")


def cancel_in_database(settings, job_id: uuid.UUID) -> str:
    """`agentq jobs cancel` without an API: the cancel, on the database and broker this
    process is configured with (the embedded SQLite by default). A running job whose step
    no process holds (an `agentq run` that timed out or was killed: its lease gone or run
    out) is ended at once, handing its conversation to the next job; otherwise as
    POST /v1/jobs/<id>/cancel: one that never started ends at once, a running one at its
    next step boundary. Returns what happened, in one line."""
    import tasks.dispatch  # noqa: F401  (the cancel's effects go out through it)
    from agentq.db import session_factory, utcnow
    from agentq.loop.busy import lock_job, request_cancel
    from agentq.loop.effects import NextStep
    from agentq.loop.lifecycle import StopReason, end_job
    from agentq.loop.submit import cancel
    from agentq.loop.uow import UnitOfWork
    sessions = session_factory(settings)
    with UnitOfWork(sessions) as uow:
        job = lock_job(uow.session, job_id)
        if job is None:
            raise click.ClickException(f"no job {job_id} in {shown_url(settings.database_url)}")
        if job.status in ENDED:
            return f"job {job_id} already {job.status}"
        lease = job.step_lease_until  # UTC-aware on SQLite too (column_types.UTCDateTime)
        unheld = job.status == JobStatus.RUNNING and (lease is None or lease <= utcnow())
        if unheld:
            request_cancel(uow, job)
            end_job(uow, job, StopReason.CANCELLED, "The job was cancelled.",
                    {"code": "cancelled",
                     "message": "Cancelled by request (no process was running its step)."})
        else:
            cancel(uow, job)
    if settings.embedded_broker:
        # no worker in this process to take the next job's step: due for the next
        # process's sweeper (`agentq run`/`dev` sweep when they start)
        from agentq.loop.uow import due_now
        started = [e.job_id for e in uow.sent if isinstance(e, NextStep)]
        if started:
            due_now(sessions, started)
    with sessions() as session:
        from agentq.models import Job
        status = session.get_one(Job, job_id).status
    if status == JobStatus.CANCELLED:
        return f"job {job_id} cancelled"
    return (f"job {job_id} ({status}) asked to cancel: a process is running its step, "
            f"which ends it at its next step boundary")


def _cancel_local(settings, job_id: uuid.UUID) -> None:
    """What POST /v1/jobs/<id>/cancel does, on this process's own database and broker."""
    import tasks.dispatch  # noqa: F401  (the cancel's effects go out through it)
    from agentq.db import session_factory
    from agentq.loop.submit import cancel
    from agentq.loop.uow import UnitOfWork
    from agentq.models import Job
    with UnitOfWork(session_factory(settings)) as uow:
        job = uow.session.get(Job, job_id)
        if job is None or job.status in ENDED:
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
