"""What a deployment's processes count, and the scrape: the wiring around `agentq.metrics`
(which holds the counters and imports nothing of ours).

`install()` is called by the composition roots, once a process: the workers' `tasks.app` and
the web's `create_app`. It counts

  * the job events each transaction announces after it commits (`observe_events`, an
    `agentq.loop.store.on_events` hook): jobs ended by status and finish reason, tool
    executions by tool and outcome, tokens and cost by model, re-drives;
  * every Celery task's run time by task name (`task_seconds`, from Celery's
    task_prerun/task_postrun signals: `orchestrator.step` is a step, `tools.execute` a tool
    call).

Each model call (`model_call`) is counted by the router itself. `render` answers
`GET /metrics`: every process's samples, plus what is read at scrape time from the source of
truth: jobs by status (Postgres) and the depth of each queue (the Redis broker).
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any, Iterable

from agentq import metrics  # first: it points prometheus_client at the shared directory

# isort: split
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

from agentq.config import Settings, get_settings
from agentq.llm.pricing import estimate_cost, model_label
from agentq.tools.registry import current_registry
from tasks.names import MAINTENANCE_QUEUE, ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE

log = logging.getLogger(__name__)


def tool_label(name: str | None) -> str:
    """`name` when it is a tool registered in this process's view (in-process modules and
    the HTTP/MCP modules offered now), else `other` (and in a process that runs no tools:
    the web's events are never tool results)."""
    registry = current_registry()  # the process's own: never one built for this
    if registry is None or not name:
        return metrics.OTHER
    return name if name in registry.known_tool_names() else metrics.OTHER


def observe_events(_job_id: str, events: list[dict[str, Any]]) -> None:
    """Count what a committed transaction's events say happened (an `on_events` hook: called
    once per job after the commit; a failure is logged there and never fails the job)."""
    for event in events:
        _observe(event["type"], event.get("data") or {})


def _observe(kind: str, data: dict[str, Any]) -> None:
    if kind == "job_end":
        metrics.JOBS_ENDED.labels(data.get("status") or "unknown",
                                  data.get("finish_reason") or "none").inc()
    elif kind == "tool_execution_end":
        metrics.TOOL_EXECUTIONS.labels(tool_label(data.get("name")),
                                       "ok" if data.get("ok") else "error").inc()
    elif kind == "message_end" and data.get("role") == "assistant" and data.get("model"):
        model = data["model"]
        label = model_label(model, get_settings())
        inputs, outputs = int(data.get("input_tokens") or 0), int(data.get("output_tokens") or 0)
        metrics.TOKENS.labels(label, "input").inc(inputs)
        metrics.TOKENS.labels(label, "output").inc(outputs)
        metrics.COST.labels(label).inc(estimate_cost(model, inputs, outputs))
    elif kind == "job_redriven":
        metrics.REDRIVES.inc()


_installed = False


def install() -> None:
    """Record in this process: job events, and Celery's task run times. Idempotent."""
    global _installed
    if not metrics.ENABLED or _installed:
        return
    _installed = True
    from agentq.loop.store import on_events
    on_events(observe_events)
    connect_celery()
    atexit.register(metrics.mark_process_dead, os.getpid())


# --- Celery: task run times; a pool process that ends leaves no live gauge behind --------
_started: dict[str, float] = {}
_started_lock = threading.Lock()


def connect_celery() -> None:
    if not metrics.ENABLED:
        return
    from celery import signals

    @signals.task_prerun.connect(weak=False)
    def _prerun(task_id: str | None = None, **_kw: Any) -> None:
        if task_id is None:
            return
        with _started_lock:
            _started[task_id] = time.perf_counter()

    @signals.task_postrun.connect(weak=False)
    def _postrun(task_id: str | None = None, task: Any = None, state: str | None = None,
                 **_kw: Any) -> None:
        with _started_lock:
            started = _started.pop(task_id, None) if task_id is not None else None
        if started is not None and task is not None:
            metrics.TASKS.labels(task.name, state or "unknown").observe(
                time.perf_counter() - started)

    @signals.worker_process_shutdown.connect(weak=False)
    def _process_gone(pid: int | None = None, **_kw: Any) -> None:
        metrics.mark_process_dead(pid or os.getpid())


# --- the scrape ----------------------------------------------------------------------------
class _SourceOfTruth:
    """Read at scrape time: jobs by status from the database, queue depths from Redis."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterable[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("agentq_jobs", "Jobs by status now (from the database).",
                                 labels=["status"])
        try:
            for status, count in self._job_counts():
                jobs.add_metric([status], count)
        except Exception:  # noqa: BLE001 - a scrape answers with what it can read
            log.warning("metrics.jobs_unreadable", exc_info=True)
        yield jobs
        depth = GaugeMetricFamily("agentq_queue_depth",
                                  "Messages waiting in each broker queue (Redis broker).",
                                  labels=["queue"])
        try:
            for queue, count in self._queue_depths():
                depth.add_metric([queue], count)
        except Exception:  # noqa: BLE001
            log.warning("metrics.queues_unreadable", exc_info=True)
        yield depth
        unclaimed = GaugeMetricFamily(
            "agentq_jobs_unclaimed",
            "Live jobs re-driven by the sweeper that no worker has taken yet (nothing is "
            "consuming; they wait and are re-driven with backoff, never failed for it).")
        try:
            unclaimed.add_metric([], self._backlog())
        except Exception:  # noqa: BLE001
            log.warning("metrics.backlog_unreadable", exc_info=True)
        yield unclaimed

    def _backlog(self) -> int:
        from agentq.db import session_factory
        from agentq.loop.sweeper import backlog
        with session_factory(self.settings)() as session:
            return backlog(session)

    def _job_counts(self) -> list[tuple[str, int]]:
        from sqlalchemy import func, select

        from agentq.db import session_factory
        from agentq.loop.states import COUNTED_STATUSES
        from agentq.models import Job
        with session_factory(self.settings)() as session:
            rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
        counts = {status: 0 for status in COUNTED_STATUSES}
        counts.update({str(status): int(n) for status, n in rows})
        return sorted(counts.items())

    def _queue_depths(self) -> list[tuple[str, int]]:
        if not self.settings.broker_url.startswith(("redis://", "rediss://")):
            return []
        import redis

        from agentq.tools.registry import get_registry
        registry = get_registry(self.settings)
        queues = [ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE, MAINTENANCE_QUEUE,
                  *registry.queues(slow=False), *registry.queues(slow=True)]
        client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=2)
        try:
            with client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.llen(queue)
                depths = [int(n) for n in pipe.execute()]
            return list(zip(queues, depths, strict=True))
        finally:
            client.close()


def render(settings: Settings) -> tuple[bytes, str]:
    """The exposition for `GET /metrics`: every process's samples, plus the live reads."""
    registry = CollectorRegistry()
    if metrics.ENABLED:
        multiprocess.MultiProcessCollector(registry)
    registry.register(_SourceOfTruth(settings))
    return generate_latest(registry), CONTENT_TYPE_LATEST
