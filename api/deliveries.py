"""A job's webhook deliveries: GET /v1/jobs/<id>/deliveries (every attempt, oldest first)
and POST /v1/jobs/<id>/deliveries/redeliver (send the job's event again)."""
from __future__ import annotations

from flask import Blueprint, g, jsonify
from sqlalchemy import select

from agentq.db import session_factory, session_scope
from agentq.loop.effects import SendWebhooks
from agentq.models import Job
from agentq.uow import UnitOfWork
from agentq.views import delivery_object
from agentq.webhooks.delivery import deliveries_for_job, redeliver_job_event
from api.auth import require_key
from api.jobs import load_job
from api.views import accepted

bp = Blueprint("deliveries", __name__)


@bp.get("/v1/jobs/<job_id>/deliveries")
@require_key()
def list_deliveries(job_id: str):
    with session_scope(g.settings) as session:
        job = load_job(session, job_id)
        rows = deliveries_for_job(session, job.id)
        return jsonify({"data": [delivery_object(row) for row in rows]})


@bp.post("/v1/jobs/<job_id>/deliveries/redeliver")
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
