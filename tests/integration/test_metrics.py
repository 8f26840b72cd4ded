"""GET /metrics after real jobs: what it counts matches what the database holds, summed over
the web process and every worker process (prometheus multiprocess mode): jobs, tokens and
cost by model (token_logs), tool results, webhook attempts by outcome (webhook_deliveries);
a model call in flight is counted while it runs and not after."""
from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from agentq.models import Job, TokenLog, ToolCall, WebhookDelivery
from agentq.testing.scripted_llm import call, error, text, tool_calls
from tests.support.api import uid

pytestmark = pytest.mark.integration
SETTLE_S = 60  # counters are written after each commit; the scrape may run just before


def scrape(client) -> dict[str, dict[tuple, float]]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def database_view(stack) -> dict:
    with stack.sessions()() as s:
        by_status = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        ended = dict(s.execute(
            select(Job.status, func.count()).where(Job.finished_at.is_not(None))
            .group_by(Job.status)).all())
        tokens = {(model, "input"): int(i) for model, i, _ in s.execute(
            select(TokenLog.model, func.sum(TokenLog.input_tokens),
                   func.sum(TokenLog.output_tokens)).group_by(TokenLog.model)).all()}
        tokens.update({(model, "output"): int(o) for model, _, o in s.execute(
            select(TokenLog.model, func.sum(TokenLog.input_tokens),
                   func.sum(TokenLog.output_tokens)).group_by(TokenLog.model)).all()})
        tool_results = s.execute(select(func.count()).select_from(ToolCall).where(
            ToolCall.status != "pending")).scalar_one()
        cost = {model: round(float(c), 8) for model, c in s.execute(
            select(TokenLog.model, func.sum(TokenLog.cost_estimate))
            .group_by(TokenLog.model)).all()}
        # an attempt made is a row no longer pending: succeeded (delivered), failed (to be
        # retried: its next attempt is a row of its own) or gave_up (failed)
        webhooks = {WEBHOOK_OUTCOMES[status]: n for status, n in s.execute(
            select(WebhookDelivery.status, func.count()).where(
                WebhookDelivery.status != "pending").group_by(WebhookDelivery.status)).all()}
    return {"by_status": by_status, "ended": ended, "tokens": tokens,
            "tool_results": tool_results, "cost": cost, "webhooks": webhooks}


WEBHOOK_OUTCOMES = {"succeeded": "delivered", "failed": "retry", "gave_up": "failed"}


def metrics_view(samples) -> dict:
    ended: dict[str, float] = defaultdict(float)
    for labels, value in samples["agentq_jobs_ended_total"].items():
        ended[dict(labels)["status"]] += value
    tokens = {(dict(labels)["model"], dict(labels)["direction"]): int(value)
              for labels, value in samples["agentq_tokens_total"].items()}
    return {"by_status": {dict(k)["status"]: int(v) for k, v in samples["agentq_jobs"].items()
                          if v},
            "ended": {k: int(v) for k, v in ended.items() if v},
            "tokens": {k: v for k, v in tokens.items() if v},
            "tool_results": int(sum(samples["agentq_tool_executions_total"].values())),
            "cost": {dict(k)["model"]: round(v, 8)
                     for k, v in samples["agentq_cost_estimate_total"].items()},
            "webhooks": {dict(k)["outcome"]: int(v)
                         for k, v in samples["agentq_webhook_attempts_total"].items()}}


COMPARED = ("ended", "tokens", "tool_results", "cost", "webhooks")


def timed(samples, *tasks: str) -> float:
    """How many runs of these Celery tasks were timed (recorded once each task returns)."""
    return sum(v for k, v in samples["agentq_task_seconds_count"].items()
               if dict(k)["task"] in tasks)


def delta(after: dict, before: dict) -> dict:
    return {k: round(v - before.get(k, 0), 8) for k, v in after.items()
            if round(v - before.get(k, 0), 8)}


def in_flight(samples, model: str) -> float:
    return sum(v for k, v in samples["agentq_model_calls_in_flight"].items()
               if dict(k)["model"] == model)


def test_metrics_after_jobs_match_the_database(client, script, stack, receiver):
    # Other tests end jobs too, some from this pytest process (whose metrics are not the
    # stack's): so what is compared is what changed while this test ran.
    samples = scrape(client)
    seen0, truth0 = metrics_view(samples), database_view(stack)
    flying0 = in_flight(samples, "primary-model")
    steps0 = timed(samples, "orchestrator.step", "orchestrator.after_tools")
    tools0 = timed(samples, "tools.execute")
    errors0 = sum(v for k, v in samples["agentq_provider_errors_total"].items()
                  if dict(k)["status"] == "500")

    # given jobs that run a tool, meet a provider error (then a retry answers) and fail a tool
    # (a priced model's name: its cost is not 0), and whose webhook fails once then arrives;
    # while the last answer is held back, its model call is in flight
    held = threading.Event()
    priced = "gpt-4o-mini"
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     error(500), text("42", model=priced, input_tokens=20_000,
                                      output_tokens=3_000),
                     tool_calls(call("math.evaluate", {"expression": "1/0"})),
                     text("cannot", hold=held)])
    hook = f"/metrics-{uid('w')}"
    first = client.wait(client.submit(f"{marker} a", user=uid("u"),
                                      callback_url=receiver.url(hook, 500))["id"])
    second = client.submit(f"{marker} b", user=uid("u"))
    try:
        deadline = time.monotonic() + SETTLE_S
        while in_flight(scrape(client), "primary-model") < flying0 + 1:  # held: answering
            assert time.monotonic() < deadline, "the held model call was never in flight"
            time.sleep(0.2)
    finally:
        held.set()
    second = client.wait(second["id"])
    assert first["status"] == second["status"] == "completed"
    receiver.wait_for(hook, 2)  # the 500, then the retry that arrived

    # then, once every process has written what it saw, the counts moved as the database
    # did, and the workers timed 4 more steps (a step after a turn's tools runs as the
    # chord's callback, orchestrator.after_tools) and 2 more tool calls
    deadline = time.monotonic() + SETTLE_S
    while True:
        samples = scrape(client)
        seen, truth = metrics_view(samples), database_view(stack)
        moved = {k: (delta(seen[k], seen0[k]) if isinstance(seen[k], dict)
                     else seen[k] - seen0[k]) for k in COMPARED}
        happened = {k: (delta(truth[k], truth0[k]) if isinstance(truth[k], dict)
                        else truth[k] - truth0[k]) for k in COMPARED}
        if (moved == happened and happened["ended"].get("completed", 0) >= 2
                and happened["webhooks"].get("retry", 0) >= 1
                and happened["webhooks"].get("delivered", 0) >= 1
                and timed(samples, "orchestrator.step", "orchestrator.after_tools") >= steps0 + 4
                and timed(samples, "tools.execute") >= tools0 + 2):
            break
        assert time.monotonic() < deadline, (moved, happened)
        time.sleep(0.2)
    # jobs by status is read from the database at each scrape
    now = {k: v for k, v in database_view(stack)["by_status"].items() if v}
    assert metrics_view(scrape(client))["by_status"] in (now, truth["by_status"])

    # the provider's 500 was counted and retried
    errors = sum(v for k, v in samples["agentq_provider_errors_total"].items()
                 if dict(k)["status"] == "500")
    assert errors >= errors0 + 1
    assert sum(samples["agentq_provider_retries_total"].values()) >= 1
    # what cost moved is the priced model's (the scripted model's name is not priced)
    assert moved["cost"].get(priced, 0) > 0
    assert moved["webhooks"].get("retry", 0) >= 1 and moved["webhooks"].get("delivered", 0) >= 1
    # the held call is answered: what is in flight is back to what it was before the test
    assert in_flight(samples, "primary-model") == flying0
    assert sum(samples["agentq_model_call_seconds_count"].values()) >= 5
    outcomes = {dict(k)["outcome"]: v for k, v in samples["agentq_tool_executions_total"].items()
                if dict(k)["tool"] == "math.evaluate"}
    assert outcomes.get("ok", 0) >= 1 and outcomes.get("error", 0) >= 1
    # the broker's queues are read live
    depths = {dict(k)["queue"] for k in samples["agentq_queue_depth"]}
    assert {"orchestrator", "webhooks", "maintenance"} <= depths


def test_metrics_need_the_token_when_one_is_set(stack):
    from agentq import config
    from api import create_app
    before = config._settings
    try:
        web = create_app(stack.settings().replace(metrics_token="s3cret")).test_client()
        refused = web.get("/metrics")
        assert refused.status_code == 401
        assert refused.get_json()["error"]["code"] == "unauthorized"
        assert web.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert web.get("/metrics",
                       headers={"Authorization": "Bearer s3cret"}).status_code == 200
    finally:
        config.set_settings(before)
