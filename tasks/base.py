"""One task base class sets our defaults once: late acks, reject on worker lost, the task
id bound into the log context, one read of the tool modules' version per run, and the
per-process services (sessions, router, registry)."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Literal, TypedDict, TypeVar

from billiard.einfo import ExceptionInfo
from celery import Task
from sqlalchemy.orm import Session, sessionmaker

from agentq import logs
from agentq.config import Settings, get_settings
from agentq.db import DATABASE_UNREACHABLE, riding_out, session_factory
from agentq.tools.registry import ToolRegistry, get_registry
from agentq.tools.remote import one_version_read

if TYPE_CHECKING:
    from agentq.llm.router import LLMRouter
    from agentq.loop.step import Stepper

@dataclass(frozen=True)
class Services:
    """What this process's tasks work with, built once per process (after a fork too:
    reset_services)."""
    settings: Settings
    sessions: sessionmaker[Session]
    registry: ToolRegistry
    router: "LLMRouter"
    stepper: "Stepper"


log = logging.getLogger(__name__)
_services_lock = threading.Lock()
_services: Services | None = None


def services() -> Services:
    """Settings, sessions, registry, router and stepper of this process, built once."""
    global _services
    with _services_lock:
        if _services is None:
            from agentq.llm.gate import gate_for
            from agentq.llm.router import LLMRouter
            from agentq.loop.step import Stepper
            from agentq.loop.store import on_events
            from agentq.notify import hub_for
            settings = get_settings()
            on_events(hub_for(settings).publish)  # committed events reach waiting clients
            sessions = session_factory(settings)
            registry = get_registry(settings)
            router = LLMRouter(settings, gates=partial(gate_for, settings))  # per provider
            _services = Services(settings, sessions, registry, router,
                                 Stepper(settings, router, registry, sessions))
        return _services


def reset_services() -> None:
    global _services
    with _services_lock:
        _services = None


class Retries(TypedDict):
    """Celery's retry options of a task (`app.task`'s keywords of the same names)."""
    autoretry_for: tuple[type[BaseException], ...]
    max_retries: int
    retry_backoff: int
    retry_backoff_max: int
    retry_jitter: bool


DATABASE_RETRIES: Retries = {
    "autoretry_for": DATABASE_UNREACHABLE, "max_retries": 5, "retry_backoff": 1,
    "retry_backoff_max": 30, "retry_jitter": True}
"""Celery's own retries of a step or tool task that could not reach the database: again
within about a second, then 2, 4, 8, 16 s (each a random share of that, so a burst of them
spreads out); after five, what follows a failed task (the sweeper's re-drive of the job; a
tool call's error callback) stands.

A step that failed before its claim was written claims its job on a retry, and the job goes
on within seconds of a blip rather than at the sweeper's next re-drive (the step deadline,
300 s by default); one that failed after its claim finds the step taken until its lease runs
out, and the sweeper re-drives the job then. A tool task that failed before its call
started runs the call on a retry, where it used to fail the call as lost
(`tool_task_failed`, its error callback) without ever running it; one that failed after the
call ran (its result not stored) finds the call started, and answers as for any delivery of
a started call (agentq.loop.execute)."""


MAINTENANCE_RIDE_OUT_S = 10.0
_Done = TypeVar("_Done")


def maintenance_run(task: str, work: Callable[[], _Done]) -> _Done | Literal[0]:
    """A beat task's work, `work()`, through a database blip: tried again while the database
    is away (`agentq.db.riding_out`, for MAINTENANCE_RIDE_OUT_S), and, past that, left to the task's
    next tick. Its waits and its end are logged in lines, never a traceback: a restart of
    Postgres is an event of the deployment, not an error of the task. Returns what `work`
    returned, 0 when it did not run."""
    try:
        for attempt in riding_out(MAINTENANCE_RIDE_OUT_S, f"work of {task}", task=task):
            with attempt:
                done = work()
    except DATABASE_UNREACHABLE as exc:
        log.warning("maintenance task not run: the database is unreachable; its next tick "
                    "does the work", extra={"task": task, "error": type(exc).__name__})
        return 0
    return done


class AgentqTask(Task[..., Any]):
    """Our defaults for every task. Whether a result is stored is said by each sender
    (`ignore_result`, tasks/names.py), not here."""
    abstract = True
    acks_late = True
    reject_on_worker_lost = True

    def on_retry(self, exc: Exception, task_id: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any], einfo: ExceptionInfo) -> None:
        """Celery tells a retry at INFO on a logger heard only from WARNING up
        (agentq.logs.PER_TASK): told here instead, with the task bound as in its own lines."""
        log.warning("task will be tried again", extra={
            "task": self.name, "task_id": task_id, "error": type(exc).__name__,
            "retries": self.request.retries})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        token = logs.bind(task=self.name, task_id=self.request.id)
        try:
            with one_version_read():
                return super().__call__(*args, **kwargs)
        finally:
            logs.unbind(token)
