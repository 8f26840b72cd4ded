"""Prometheus metrics (prometheus-client), shared by every process of a deployment.

The web process serves them at `GET /metrics` (API.md 1.1; docs/metrics.md names each).
Workers and gunicorn's workers are separate processes, so the client runs in multiprocess
mode: each process writes its samples to files in one directory, and the scrape sums them.
The directory is PROMETHEUS_MULTIPROC_DIR when set, else AGENTQ_METRICS_DIR, else
$AGENTQ_HOME/metrics; it must be the same for every process on a machine, and emptied
before a deployment starts (counters of ended processes are kept and summed, so totals
survive restarts until it is emptied; a process that ends drops its live gauges). It is set here,
before prometheus_client is imported, so importing this module first is enough.
`AGENTQ_METRICS=0` turns every recording into a no-op (the benchmark's "off").

What is counted where:
  * most counters come from the job events each transaction announces after it commits
    (`observe_events`, an `agentq.loop.store.on_events` hook that `install()` adds): jobs ended by status and finish
    reason, tool executions by tool and outcome, tokens and cost by model, re-drives;
  * latency: every Celery task's run time by task name (`task_seconds`, from Celery's
    task_prerun/task_postrun signals: `orchestrator.step` is a step, `tools.execute` a tool
    call) and each model call by model (`model_call`), with the calls in flight;
  * at scrape time, from the source of truth: jobs by status (Postgres) and the depth of
    each queue (the Redis broker).
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

log = logging.getLogger(__name__)

ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"


def _enabled() -> bool:
    return os.environ.get("AGENTQ_METRICS", "1").strip().lower() not in ("0", "false", "no",
                                                                          "off")


def metrics_dir() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    if os.environ.get("AGENTQ_METRICS_DIR"):
        return Path(os.environ["AGENTQ_METRICS_DIR"])
    home = os.environ.get("AGENTQ_HOME") or str(Path.cwd() / ".agentq")
    return Path(home) / "metrics"


ENABLED = _enabled()
if ENABLED:
    os.environ.setdefault(ENV_DIR, str(metrics_dir()))
    Path(os.environ[ENV_DIR]).mkdir(parents=True, exist_ok=True)

from prometheus_client import (  # noqa: E402
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily  # noqa: E402

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

JOBS_ENDED = Counter("agentq_jobs_ended_total", "Jobs that ended, by status and finish reason.",
                     ["status", "finish_reason"])
TOOL_EXECUTIONS = Counter("agentq_tool_executions_total",
                          "Tool calls that got a result, by tool and outcome (ok, error).",
                          ["tool", "outcome"])
TOKENS = Counter("agentq_tokens_total", "Model tokens billed, by model and direction.",
                 ["model", "direction"])
COST = Counter("agentq_cost_estimate_total", "Estimated model cost (currency units), by model.",
               ["model"])
MODEL_CALLS = Histogram("agentq_model_call_seconds",
                        "One request to a model provider (each retry is its own), by model "
                        "and outcome.", ["model", "outcome"], buckets=LATENCY_BUCKETS)
MODEL_IN_FLIGHT = Gauge("agentq_model_calls_in_flight", "Model requests being answered now.",
                        ["model"], multiprocess_mode="livesum")
PROVIDER_ERRORS = Counter("agentq_provider_errors_total",
                          "Failed model requests, by model and HTTP status (or the error kind).",
                          ["model", "status"])
PROVIDER_RETRIES = Counter("agentq_provider_retries_total",
                           "Model requests retried after a failure, by model.", ["model"])
TASKS = Histogram("agentq_task_seconds",
                  "Run time of each Celery task by task name and state: orchestrator.step is "
                  "one step, tools.execute one tool call, webhooks.deliver one delivery.",
                  ["task", "state"], buckets=LATENCY_BUCKETS)
WEBHOOK_ATTEMPTS = Counter("agentq_webhook_attempts_total",
                           "Webhook delivery attempts, by outcome (delivered, retry, failed).",
                           ["outcome"])
REDRIVES = Counter("agentq_sweeper_redrives_total",
                   "Steps the sweeper sent again because their job made no progress.")


OTHER = "other"
"""The label of a tool or model that is not registered or configured: a name a model made
up, or one a request picked, never becomes a series of its own (each is kept in every
process's files and every scrape for good)."""


def tool_label(name: str | None) -> str:
    """`name` when it is a tool registered in this process's view (in-process modules and
    the HTTP/MCP modules offered now), else `other` (and in a process that runs no tools:
    the web's events are never tool results)."""
    from agentq.tools.registry import current_registry
    registry = current_registry()  # the process's own: never one built for this
    if registry is None or not name:
        return OTHER
    return name if name in registry.known_tool_names() else OTHER


def model_label(model: str | None) -> str:
    """`model` when it is configured (AGENTQ_MODEL, AGENTQ_FALLBACK_MODELS,
    AGENTQ_EMBEDDING_MODEL, the model catalogue) or a name of the price table, else
    `other`."""
    if not model:
        return OTHER
    from agentq.config import get_settings
    from agentq.llm.pricing import prices
    settings = get_settings()
    if model in (settings.model, settings.embedding_model) or \
            model in settings.fallback_models or model.lower() in prices() or \
            model in settings.models:
        return model
    return OTHER


def observe_events(_job_id: str, events: list[dict[str, Any]]) -> None:
    """Count what a committed transaction's events say happened (an `on_events` hook: called
    once per job after the commit; a failure is logged there and never fails the job)."""
    for event in events:
        _observe(event["type"], event.get("data") or {})


_installed = False


def install() -> None:
    """Record in this process: job events, and Celery's task run times. Idempotent."""
    global _installed
    if not ENABLED or _installed:
        return
    _installed = True
    from agentq.loop.store import on_events
    on_events(observe_events)
    connect_celery()
    atexit.register(mark_process_dead, os.getpid())


def _observe(kind: str, data: dict[str, Any]) -> None:
    if kind == "job_end":
        JOBS_ENDED.labels(data.get("status") or "unknown",
                          data.get("finish_reason") or "none").inc()
    elif kind == "tool_execution_end":
        TOOL_EXECUTIONS.labels(tool_label(data.get("name")),
                               "ok" if data.get("ok") else "error").inc()
    elif kind == "message_end" and data.get("role") == "assistant" and data.get("model"):
        from agentq.llm.pricing import estimate_cost
        model = data["model"]
        label = model_label(model)
        inputs, outputs = int(data.get("input_tokens") or 0), int(data.get("output_tokens") or 0)
        TOKENS.labels(label, "input").inc(inputs)
        TOKENS.labels(label, "output").inc(outputs)
        COST.labels(label).inc(estimate_cost(model, inputs, outputs))
    elif kind == "job_redriven":
        REDRIVES.inc()


@contextmanager
def model_call(model: str) -> Iterator[None]:
    """Around one request to a provider: in flight while it runs, then its latency."""
    if not ENABLED:
        yield
        return
    started, outcome = time.perf_counter(), "error"
    model = model_label(model)
    MODEL_IN_FLIGHT.labels(model).inc()
    try:
        yield
        outcome = "ok"
    finally:
        MODEL_IN_FLIGHT.labels(model).dec()
        MODEL_CALLS.labels(model, outcome).observe(time.perf_counter() - started)


def provider_error(model: str, status: Any) -> None:
    if ENABLED:
        PROVIDER_ERRORS.labels(model_label(model),
                               str(status if status is not None else "connection")).inc()


def provider_retry(model: str) -> None:
    if ENABLED:
        PROVIDER_RETRIES.labels(model_label(model)).inc()


def webhook_attempt(outcome: str) -> None:
    if ENABLED:
        WEBHOOK_ATTEMPTS.labels(outcome).inc()


# --- Celery: task run times; a pool process that ends leaves no live gauge behind --------
_started: dict[str, float] = {}
_started_lock = threading.Lock()


def connect_celery() -> None:
    if not ENABLED:
        return
    from celery import signals

    @signals.task_prerun.connect(weak=False)
    def _prerun(task_id=None, **_kw) -> None:
        with _started_lock:
            _started[task_id] = time.perf_counter()

    @signals.task_postrun.connect(weak=False)
    def _postrun(task_id=None, task=None, state=None, **_kw) -> None:
        with _started_lock:
            started = _started.pop(task_id, None)
        if started is not None and task is not None:
            TASKS.labels(task.name, state or "unknown").observe(time.perf_counter() - started)

    @signals.worker_process_shutdown.connect(weak=False)
    def _process_gone(pid=None, **_kw) -> None:
        mark_process_dead(pid or os.getpid())


def mark_process_dead(pid: int) -> None:
    """Drop a finished process's live gauges (gunicorn's child_exit, Celery's pool)."""
    if ENABLED:
        multiprocess.mark_process_dead(pid)


# --- the scrape ----------------------------------------------------------------------------
class _SourceOfTruth:
    """Read at scrape time: jobs by status from the database, queue depths from Redis."""

    def __init__(self, settings):
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
        from agentq.models import Job
        with session_factory(self.settings)() as session:
            rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
        counts = {"queued": 0, "running": 0, "completed": 0, "failed": 0, "cancelled": 0}
        counts.update({status: int(n) for status, n in rows})
        return sorted(counts.items())

    def _queue_depths(self) -> list[tuple[str, int]]:
        if not self.settings.broker_url.startswith(("redis://", "rediss://")):
            return []
        import redis

        from agentq.tools.registry import get_registry
        from tasks.app import MAINTENANCE_QUEUE, ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE
        registry = get_registry(self.settings)
        queues = [ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE, MAINTENANCE_QUEUE,
                  *registry.queues(slow=False), *registry.queues(slow=True)]
        client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=2)
        try:
            with client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.llen(queue)
                return list(zip(queues, (int(n) for n in pipe.execute())))
        finally:
            client.close()


def render(settings) -> tuple[bytes, str]:
    """The exposition for `GET /metrics`: every process's samples, plus the live reads."""
    registry = CollectorRegistry()
    if ENABLED:
        multiprocess.MultiProcessCollector(registry)
    registry.register(_SourceOfTruth(settings))
    return generate_latest(registry), CONTENT_TYPE_LATEST
