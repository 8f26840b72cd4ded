"""Prometheus metrics (prometheus-client): the counters every process of a deployment records.

A leaf: it imports nothing of agentq, so the router, the webhook sender and the workers record
here without this module knowing them. What records what, and the scrape, are wired by the
composition roots: `tasks.metrics.install()` (the workers' `tasks.app`, the web's
`create_app`) counts the job events and Celery's task run times, and `tasks.metrics.render`
answers `GET /metrics` (API.md 1.1; docs/metrics.md names each metric).

Workers and gunicorn's workers are separate processes, so the client runs in multiprocess
mode: each process writes its samples to files in one directory, and the scrape sums them.
The directory is PROMETHEUS_MULTIPROC_DIR when set, else AGENTQ_METRICS_DIR, else
$AGENTQ_HOME/metrics; it must be the same for every process on a machine, and emptied
before a deployment starts (counters of ended processes are kept and summed, so totals
survive restarts until it is emptied; a process that ends drops its live gauges). It is set here,
before prometheus_client is imported, so importing this module first is enough.
`AGENTQ_METRICS=0` turns every recording into a no-op (the benchmark's "off").

Labels are bounded: a tool or model name is recorded as the caller's label, which is the
name only when it is registered or configured (`tasks.metrics.tool_label`,
`agentq.llm.pricing.model_label`) and `other` otherwise.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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

from prometheus_client import Counter, Gauge, Histogram, multiprocess  # noqa: E402

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


@contextmanager
def model_call(model: str) -> Iterator[None]:
    """Around one request to a provider (`model`: its label): in flight while it runs, then
    its latency."""
    if not ENABLED:
        yield
        return
    started, outcome = time.perf_counter(), "error"
    MODEL_IN_FLIGHT.labels(model).inc()
    try:
        yield
        outcome = "ok"
    finally:
        MODEL_IN_FLIGHT.labels(model).dec()
        MODEL_CALLS.labels(model, outcome).observe(time.perf_counter() - started)


def provider_error(model: str, status: int | str | None) -> None:
    """A failed request to a provider (`model`: its label; `status`: the HTTP status, or
    None when no answer came)."""
    if ENABLED:
        PROVIDER_ERRORS.labels(model, str(status if status is not None else "connection")).inc()


def provider_retry(model: str) -> None:
    if ENABLED:
        PROVIDER_RETRIES.labels(model).inc()


def webhook_attempt(outcome: str) -> None:
    if ENABLED:
        WEBHOOK_ATTEMPTS.labels(outcome).inc()


def mark_process_dead(pid: int) -> None:
    """Drop a finished process's live gauges (gunicorn's child_exit, Celery's pool)."""
    if ENABLED:
        multiprocess.mark_process_dead(pid)
