"""Webhook tasks: `webhooks.deliver` makes one attempt (agentq.webhooks.delivery) and
schedules the next; `maintenance.sweep_webhooks` (beat) re-enqueues deliveries whose message
was lost. Thin: the rows in Postgres decide everything, a message only says "look at row X".
"""
from __future__ import annotations

import logging

from agentq.config import get_settings
from agentq.db import session_factory
from agentq.loop.sweeper import sweep_deliveries
from agentq.webhooks.delivery import attempt_delivery
from tasks.app import WEBHOOKS_QUEUE, app
from tasks.base import AgentqTask

log = logging.getLogger(__name__)
MAX_COUNTDOWN_S = 600.0
"""Longer waits are left to the sweeper: an ETA message sits in a worker's memory, and Redis
hands it out again after its visibility timeout, so hour-long countdowns would duplicate."""


def schedule(delivery_id: str, countdown_s: float = 0.0) -> None:
    """Enqueue one attempt; on a broker error the row stays pending and the sweeper sends it."""
    if countdown_s > MAX_COUNTDOWN_S:
        log.info("webhook retry left to the sweeper",
                 extra={"delivery_id": delivery_id, "retry_in_s": countdown_s})
        return
    try:
        deliver.apply_async((delivery_id,), countdown=countdown_s or None,
                            queue=WEBHOOKS_QUEUE)
    except Exception:
        log.exception("webhook enqueue failed; the sweeper will send it",
                      extra={"delivery_id": delivery_id})


@app.task(base=AgentqTask, name="webhooks.deliver", ignore_result=True)
def deliver(delivery_id: str) -> str:
    outcome = attempt_delivery(delivery_id)
    if outcome.retry_id is not None:
        schedule(outcome.retry_id, outcome.retry_in_s or 0.0)
    return outcome.status


@app.task(base=AgentqTask, name="maintenance.sweep_webhooks", ignore_result=True)
def sweep_webhooks() -> int:
    settings = get_settings()
    ids = sweep_deliveries(settings, session_factory(settings))
    for delivery_id in ids:
        schedule(delivery_id)
    return len(ids)
