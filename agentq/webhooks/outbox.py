"""The webhook outbox: a delivery row written in the caller's transaction, for an event
of a job or batch that ended or of a tool call that waits for approval. The row is all a
later send needs (`agentq.webhooks.delivery` rebuilds the payload from the job or batch
row and sends it; Celery only carries the row id), so an ended job never loses its webhook.

It imports no feature of ours: the job's lifecycle, approvals and batches write their rows
with it, below the modules that send them.
"""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.errors import AgentqError
from agentq.ids import new_id
from agentq.loop.states import DeliveryStatus
from agentq.models import Job, WebhookDelivery
from agentq.webhooks.signing import new_event_id

log = logging.getLogger(__name__)

JOB_EVENT_TYPES = ("job.completed", "job.failed", "job.cancelled")
BATCH_EVENT_TYPES = ("batch.completed", "batch.cancelled")
APPROVAL_EVENT_TYPE = "job.approval_required"
"""A tool call waits for a person: the body is the job object plus
`tool_call: {tool_use_id, name, arguments}` (API.md 1.1)."""
TOOL_CALL_KEYS = ("tool_use_id", "name", "arguments")
EVENT_TYPES = JOB_EVENT_TYPES + BATCH_EVENT_TYPES + (APPROVAL_EVENT_TYPE,)

PENDING, SUCCEEDED, FAILED, GAVE_UP = (DeliveryStatus.PENDING, DeliveryStatus.SUCCEEDED,
                                      DeliveryStatus.FAILED, DeliveryStatus.GAVE_UP)


def enqueue_event(session: Session, *, tenant_id, event_type: str, url: str, job_id=None,
                  batch_id=None, event_id: str | None = None, attempt: int = 1,
                  due: datetime | None = None,
                  data: dict[str, Any] | None = None) -> WebhookDelivery:
    """Add a pending delivery row (in the caller's transaction) and return it; its id is
    set at once, so the caller can enqueue `webhooks.deliver(id)` after committing.

    A new event gets a fresh `event_id`; a later attempt of the same event passes the first
    row's `event_id` and the next `attempt`. The payload is not stored: it is rebuilt from
    the job (or batch) row at send time, so that row must be final when this is called."""
    if event_type not in EVENT_TYPES:
        raise AgentqError(f"unknown webhook event type {event_type!r}", event_type=event_type)
    if (job_id is None) == (batch_id is None):
        raise AgentqError("a webhook event is about exactly one job or one batch")
    if not url:
        raise AgentqError("a webhook event needs a url")
    now = utcnow()
    delivery = WebhookDelivery(
        id=new_id(), tenant_id=tenant_id, event_id=event_id or new_event_id(),
        event_type=event_type,
        job_id=job_id, batch_id=batch_id, url=url, attempt=attempt, status=PENDING,
        created_at=now, next_attempt_at=due or now, data=data)
    session.add(delivery)
    return delivery


def enqueue_job_event(session: Session, job: Job) -> WebhookDelivery | None:
    """The `job.<status>` event of a job that just ended, if it has a callback_url."""
    if not job.callback_url:
        return None
    delivery = enqueue_event(session, tenant_id=job.tenant_id, event_type=f"job.{job.status}",
                             url=job.callback_url, job_id=job.id, due=job.finished_at)
    log.info("webhook event created", extra={"delivery_id": str(delivery.id),
                                              "event_id": delivery.event_id,
                                              "event_type": delivery.event_type,
                                              "job_id": str(job.id)})
    return delivery
