"""OpenTelemetry traces: one trace a job, from the API's submit through each step, model
request and tool call to the job's end, exported over OTLP/HTTP when configured.

On when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, the SDK's own variables, as are `OTEL_SERVICE_NAME`,
`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_SCHEDULE_DELAY`...) and the `otel` extra is
installed; `AGENTQ_TRACING=0` turns it off. Otherwise nothing is set up, and the spans below
are the OpenTelemetry API's no-op spans (or none at all without the package): no cost.

What makes the spans (the maintained instrumentations, not ours, set up by the composition
roots on top of `configure`: `create_app` instruments Flask, `tasks.tracing` Celery):
  * opentelemetry-instrumentation-flask: a server span for each API request;
  * opentelemetry-instrumentation-celery: a consumer span for each run
    (`run/orchestrator.step`, `run/tools.execute`, ...), a child of the span that sent the
    task, whose context is carried in the Celery message's headers: a step sent by the API,
    a tool call sent by a step and the step after the tools all join the submit's trace.
    The instrumentation's producer span for each task sent (`apply_async/<task>`) is left
    out (`_publish_context_only`): 3 of a job's 10 spans, each started, given attributes
    and exported, for the moment of a send (docs/benchmarks.md, "Metrics and tracing:
    on vs off", has what they cost);
  * ours: `llm.request` around each request to a model provider (`span()` below), `job.end`
    once a job's end has committed (tasks/dispatch.py: status and finish reason, a child of
    the step that ended it), and the job id and iteration set on each step's span
    (`annotate()`).
A step re-driven by the sweeper starts a trace of its own (linked by the job id attribute).
Every trace is kept unless the SDK's head sampling is set (`OTEL_TRACES_SAMPLER=
parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`: the submit decides, the workers
follow the parent in the headers); what tracing costs is in docs/metrics.md.
Log lines carry `trace_id` and `span_id` of the span they were written in (agentq/logs.py).
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Iterator

log = logging.getLogger(__name__)

try:
    from opentelemetry import trace
except ImportError:  # the otel extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]  # the optional module, absent

_configured = False
_enabled = False
_tracer = None
"""Our tracer, made when the provider is (`get_tracer` builds a new one on each call)."""


def wanted() -> bool:
    if os.environ.get("AGENTQ_TRACING", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(service: str) -> bool:
    """Set up this process's tracer provider; True when tracing is on. Call once per process
    (again is a no-op); the roots then instrument Flask (`api.create_app`) and Celery
    (`tasks.tracing.configure`)."""
    global _configured, _enabled, _tracer
    if not wanted():
        return False
    if trace is None:
        log.warning("tracing.unavailable: an OTLP endpoint is configured but the otel extra "
                    "is not installed (pip install 'agentq[otel]')")
        return False
    if not _configured:
        _configured = True
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        name = os.environ.get("OTEL_SERVICE_NAME") or f"agentq-{service}"
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _tracer = trace.get_tracer("agentq")
        _enabled = True
    return True


def after_fork() -> bool:
    """A forked pool process gets a provider of its own (the parent's export thread did not
    survive the fork); True when tracing is on."""
    global _configured
    if not _enabled:
        return False
    _configured = False
    return configure("worker")


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A child span of the current one (a no-op unless tracing is on)."""
    if not _enabled or _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(
            name, attributes={f"agentq.{k}": v for k, v in attributes.items()
                              if v is not None}):
        yield


def annotate(**attributes: Any) -> None:
    """Set attributes on the current span (the step's run span)."""
    if _enabled:
        current = trace.get_current_span()
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(f"agentq.{key}", value)


def current_ids() -> dict[str, str]:
    """`trace_id`/`span_id` of the current span, for log lines; empty when none."""
    if not _enabled:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": format(context.trace_id, "032x"),
            "span_id": format(context.span_id, "016x")}

