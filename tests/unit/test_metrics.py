"""agentq.metrics and its wiring (tasks.metrics) without servers: events become counts, a bad
event never escapes the event hook, and the docs and the Grafana dashboard name only metrics
that exist."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.parser import text_string_to_metric_families

from agentq import metrics
from agentq.config import get_settings
from agentq.llm.pricing import model_label
from agentq.loop import store
from tasks import metrics as recording

ROOT = Path(__file__).resolve().parents[2]


def _sample(families, name: str, labels: dict[str, str]) -> float:
    for family in families:
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v
                                           for k, v in labels.items()):
                return sample.value
    return 0.0


def value(name: str, **labels: str) -> float:
    """The scrape's value: every process's sample files."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return _sample(text_string_to_metric_families(generate_latest(registry).decode()), name,
                   labels)


def own(metric, name: str, **labels: str) -> float:
    """This process's own count: the metrics directory is shared with the suite's other
    processes (a second pytest worker, its Celery workers), which end jobs of their own."""
    return _sample(metric.collect(), name, labels)


@pytest.fixture(autouse=True)
def configured_models():
    """The models these tests label by are configured ones (a name that is not becomes
    `other`: test_unknown_names_are_counted_as_other)."""
    from agentq.config import Settings, get_settings, set_settings
    before = get_settings()
    set_settings(Settings.from_env({"AGENTQ_MODEL": "unit-model",
                                    "AGENTQ_FALLBACK_MODELS": "unit-flight"}))
    from agentq.tools.registry import get_registry
    get_registry(get_settings())  # as in a process that runs tools: their names are known
    yield
    set_settings(before)


def test_events_are_counted_by_their_labels():
    def counts():
        return (own(metrics.JOBS_ENDED, "agentq_jobs_ended_total",
                    status="completed", finish_reason="end_turn"),
                own(metrics.TOOL_EXECUTIONS, "agentq_tool_executions_total",
                    tool="math.evaluate", outcome="error"),
                own(metrics.TOKENS, "agentq_tokens_total", model="unit-model", direction="output"),
                own(metrics.REDRIVES, "agentq_sweeper_redrives_total"))

    before = counts()
    recording.observe_events("j1", [
        {"type": "job_end", "data": {"status": "completed", "finish_reason": "end_turn"}},
        {"type": "tool_execution_end", "data": {"name": "math.evaluate", "ok": False}},
        {"type": "message_end", "data": {"role": "assistant", "model": "unit-model",
                                         "input_tokens": 11, "output_tokens": 7}},
        {"type": "job_redriven", "data": {}},
        {"type": "turn_start", "data": {}},
    ])
    assert [a - b for a, b in zip(counts(), before, strict=True)] == [1, 1, 7, 1]
    # and the scrape (every process's files) holds at least this process's counts
    assert value("agentq_tokens_total", model="unit-model", direction="output") >= 7


def test_unknown_names_are_counted_as_other():
    """A tool name the model made up, or a model nobody configured, is `other`: such names
    never become series of their own (issue 30)."""
    def series() -> set:
        return {(name, tuple(sorted(labels.items())))
                for metric in (metrics.TOOL_EXECUTIONS, metrics.TOKENS)
                for family in metric.collect() for name, labels, _v, *_ in
                [(s.name, s.labels, s.value) for s in family.samples]}
    recording.observe_events("j3", [
        {"type": "tool_execution_end", "data": {"name": "made_up.warmup", "ok": False}},
        {"type": "message_end", "data": {"role": "assistant", "model": "made-up-model-0",
                                         "input_tokens": 1, "output_tokens": 1}}])
    before = series()
    other = own(metrics.TOOL_EXECUTIONS, "agentq_tool_executions_total", tool="other",
                outcome="error")
    recording.observe_events("j4", [
        *({"type": "tool_execution_end", "data": {"name": f"made_up_{i}.tool", "ok": False}}
          for i in range(50)),
        *({"type": "message_end", "data": {"role": "assistant", "model": f"made-up-{i}",
                                           "input_tokens": 1, "output_tokens": 1}}
          for i in range(50))])
    assert series() == before
    assert own(metrics.TOOL_EXECUTIONS, "agentq_tool_executions_total", tool="other",
               outcome="error") == other + 50
    assert recording.tool_label("math.evaluate") == "math.evaluate"
    assert model_label("unit-model", get_settings()) == "unit-model"
    assert model_label("gpt-4o-mini", get_settings()) == "gpt-4o-mini"  # a priced model's name


def test_a_model_call_is_in_flight_only_while_it_runs():
    with metrics.model_call("unit-flight"):
        assert value("agentq_model_calls_in_flight", model="unit-flight") == 1
    assert value("agentq_model_calls_in_flight", model="unit-flight") == 0
    assert value("agentq_model_call_seconds_count", model="unit-flight", outcome="ok") == 1


def test_a_malformed_event_is_logged_by_the_hook_runner_and_never_raised(caplog):
    recording.install()
    store.notify("j2", [{"data": {}}])  # no "type"
    assert "event hook failed" in caplog.text


def test_docs_and_dashboard_name_exactly_the_metrics_that_exist():
    exposed = {"agentq_jobs", "agentq_queue_depth", "agentq_jobs_unclaimed"} | {
        m._name + ("_total" if isinstance(m, Counter) else "")
        for m in vars(metrics).values() if isinstance(m, (Counter, Gauge, Histogram))}
    documented = set(re.findall(r"`(agentq_[a-z_]+)`", (ROOT / "docs/metrics.md").read_text()))
    assert documented == exposed
    dashboard = json.loads((ROOT / "docs/grafana-dashboard.json").read_text())
    used = {re.sub(r"_(bucket|count|sum)$", "", name) for panel in dashboard["panels"]
            for target in panel["targets"]
            for name in re.findall(r"agentq_[a-z_]+", target["expr"])}
    assert used <= exposed and len(used) >= 10
