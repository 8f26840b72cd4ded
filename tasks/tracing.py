"""Tracing of the Celery side, set up by the composition roots (the workers' `tasks.app`, the
web's `create_app`); `agentq.tracing` holds the provider and our own spans and knows no Celery.

opentelemetry-instrumentation-celery makes a consumer span for each run
(`run/orchestrator.step`, `run/tools.execute`, ...), a child of the span that sent the task,
whose context is carried in the Celery message's headers. Its producer span for each task
sent (`apply_async/<task>`) is left out (`_publish_context_only`): 3 of a job's 10 spans, each
started, given attributes and exported, for the moment of a send (docs/benchmarks.md,
"Metrics and tracing: on vs off", has what they cost).
"""
from __future__ import annotations

import logging
from typing import Any

from agentq import tracing

log = logging.getLogger(__name__)


def configure(service: str) -> bool:
    """This process's tracer provider (`agentq.tracing.configure`) and Celery's
    instrumentation; True when tracing is on."""
    if not tracing.configure(service):
        return False
    _instrument_celery()
    return True


def after_fork() -> None:
    """A forked pool process: a provider of its own, and Celery still instrumented."""
    if tracing.after_fork():
        _instrument_celery()


def _instrument_celery() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    instrumentor = CeleryInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
        _publish_context_only(instrumentor)


def _publish_context_only(instrumentor: Any) -> None:
    """Replace the Celery instrumentation's producer spans with the context alone: a task
    sent carries the current span's context in its headers (as the instrumentation would
    inject its producer span's), and no span is made for the send."""
    from celery import signals
    before = getattr(instrumentor, "_trace_before_publish", None)
    after = getattr(instrumentor, "_trace_after_publish", None)
    if before is None or after is None:  # another version: keep its producer spans
        log.warning("tracing.producer_spans_kept: the celery instrumentation has no "
                    "_trace_before_publish/_trace_after_publish to replace")
        return
    signals.before_task_publish.disconnect(before)
    signals.after_task_publish.disconnect(after)
    signals.before_task_publish.connect(_inject_context, weak=False)


def _inject_context(headers: dict[str, Any] | None = None, **_kwargs: Any) -> None:
    if headers is not None:
        from opentelemetry.propagate import inject
        inject(headers)
