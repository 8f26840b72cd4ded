"""Webhook tasks: `webhooks.deliver` makes one attempt (agentq.webhooks.delivery) and
sends the next (tasks.dispatch.send_webhook); `maintenance.sweep_webhooks` (beat) re-sends
deliveries whose message was lost. Thin: the rows in Postgres decide everything, a message
only says "look at row X".
"""
from __future__ import annotations

from agentq.config import get_settings
from agentq.db import session_factory
from agentq.loop.sweeper import sweep_deliveries
from agentq.webhooks.delivery import attempt_delivery
from tasks import names
from tasks.app import app
from tasks.base import AgentqTask, maintenance_run
from tasks.dispatch import send_webhook


@app.task(base=AgentqTask, name=names.DELIVER_WEBHOOK, ignore_result=True)
def deliver(delivery_id: str) -> str:
    outcome = attempt_delivery(delivery_id)
    if outcome.retry_id is not None:
        send_webhook(outcome.retry_id, outcome.retry_in_s or 0.0)
    return outcome.status


@app.task(base=AgentqTask, name=names.SWEEP_WEBHOOKS, ignore_result=True)
def sweep_webhooks() -> int:
    settings = get_settings()
    ids = maintenance_run(names.SWEEP_WEBHOOKS,
                          lambda: sweep_deliveries(settings, session_factory(settings))) or []
    for delivery_id in ids:
        send_webhook(delivery_id)
    return len(ids)
