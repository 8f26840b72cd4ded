"""Tracing off (no OTLP endpoint): nothing is set up, spans cost nothing, logs carry no ids.
Tracing on is tested through a real stack in tests/integration/test_tracing.py."""
from __future__ import annotations

import json
import logging

from agentq import logs, tracing


def test_without_an_endpoint_nothing_is_set_up(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert not tracing.wanted()
    assert tracing.configure("unit") is False
    with tracing.span("llm.request", model="m"):
        tracing.annotate(job_id="j")
        assert tracing.current_ids() == {}


def test_an_endpoint_with_tracing_turned_off_is_not_wanted(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("AGENTQ_TRACING", "0")
    assert not tracing.wanted()


def test_log_lines_have_no_trace_fields_without_a_span():
    record = logging.LogRecord("agentq.test", logging.INFO, __file__, 1, "hello", (), None)
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["msg"] == "hello" and "trace_id" not in line
