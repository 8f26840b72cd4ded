"""A job's webhook deliveries: GET /v1/jobs/<id>/deliveries (every attempt, oldest first)
and POST /v1/jobs/<id>/deliveries/redeliver (send the job's event again); and the tenant's
signing secret: POST /v1/admin/webhook-secret/rotate (an admin of the tenant, for its own
tenant: agentq.webhooks.secrets)."""
from __future__ import annotations

from flask import Blueprint, g, jsonify
from sqlalchemy import select

from agentq.db import session_factory, session_scope
from agentq.loop.effects import SendWebhooks
from agentq.loop.uow import UnitOfWork
from agentq.models import Job
from agentq.views import delivery_object
from agentq.webhooks import secrets
from agentq.webhooks.delivery import deliveries_for_job, redeliver_job_event
from api.auth import require_key
from api.jobs import load_job
from api.openapi import json_response, operation
from api.schemas.deliveries import (
    DeliveryPageSchema,
    DeliverySchema,
    WebhookSecretSchema,
)
from api.views import accepted

bp = Blueprint("deliveries", __name__)


@bp.get("/v1/jobs/<job_id>/deliveries")
@operation(
    "listDeliveries", "A job's webhook deliveries",
    tags=["webhooks"],
    responses={
        200: json_response(DeliveryPageSchema, "Every attempt, oldest first."),
    },
    errors=(401, 403, 404))
@require_key()
def list_deliveries(job_id: str):
    with session_scope(g.settings) as session:
        job = load_job(session, job_id)
        rows = deliveries_for_job(session, job.id)
        return jsonify({"data": [delivery_object(row) for row in rows]})


@bp.post("/v1/jobs/<job_id>/deliveries/redeliver")
@operation(
    "redeliver", "Send a job's webhook event again",
    tags=["webhooks"],
    description="A new attempt of the same event (same `webhook-id`). `409` when "
                "the job has not ended, has no `callback_url`, or a delivery is "
                "pending.",
    responses={
        202: json_response(DeliverySchema, "The new delivery attempt, pending."),
    },
    errors=(401, 403, 404, 409))
@require_key()
def redeliver(job_id: str):
    with UnitOfWork(session_factory(g.settings)) as uow:
        job = load_job(uow.session, job_id)
        # Locked: two redeliveries of one job cannot both see "none pending".
        job = uow.session.execute(select(Job).where(Job.id == job.id).with_for_update()
                                  .execution_options(populate_existing=True)).scalar_one()
        delivery = redeliver_job_event(uow.session, job)
        body = delivery_object(delivery)
        uow.effect(SendWebhooks((body["id"],)))
    return accepted(body)


@bp.post("/v1/admin/webhook-secret/rotate")
@operation(
    "rotateWebhookSecret", "A new webhook secret for the "
                           "key's tenant",
    tags=["webhooks"],
    description="Admin keys (a tenant admin or an operator), for the key's own "
                "tenant. Each tenant signs its webhooks with its own secret "
                "(`AGENTQ_WEBHOOK_SECRET` is the default tenant's until it rotates; "
                "another tenant's is generated at its first need and known to no "
                "one: rotate to get one). The new secret is in this answer only; "
                "for 24 h the previous one signs too (two `v1,` signatures, "
                "space-separated).",
    responses={
        200: json_response(WebhookSecretSchema, "The new secret, shown this once."),
    },
    errors=(401, 403))
@require_key(admin=True)
def rotate_webhook_secret():
    """A new secret for the key's own tenant, shown this once; the one before it keeps
    signing for 24 h (both signatures are sent)."""
    with session_scope(g.settings) as session:
        secret = secrets.rotate(session, g.tenant_id, g.settings)
    response = jsonify({"secret": secret})
    response.headers["Cache-Control"] = "no-store"
    return response
