"""Submit and poll: POST /v1/messages, GET /v1/jobs/<id>, GET /v1/jobs/<id>/events."""
from __future__ import annotations

import logging
import uuid

from flask import Blueprint, g, jsonify, request
from sqlalchemy import select

from agentq.db import session_factory, session_scope
from agentq.errors import NotFound, UnsupportedMediaType, ValidationFailed
from agentq.loop.identity import Incoming
from agentq.loop.step import NextStep
from agentq.loop.store import event_dict
from agentq.loop.submit import Submission, create_job
from agentq.models import Job, JobEvent
from agentq.waiting import wait_for_end
from api.auth import can_see, require_key
from api.schemas import MessageRequestSchema
from api.views import job_object

log = logging.getLogger(__name__)
bp = Blueprint("jobs", __name__)
MAX_WAIT_S = 60
EVENTS_PAGE = 500


def json_body() -> dict:
    if not request.is_json:
        raise UnsupportedMediaType("Send a JSON body with Content-Type: application/json.")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ValidationFailed({"_body": ["Must be a JSON object."]},
                               "The body is not a JSON object.")
    return body


def wait_seconds() -> float | None:
    raw = request.args.get("wait")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValidationFailed({"wait": [f"Must be a number of seconds 0..{MAX_WAIT_S}."]})
    if not 0 <= value <= MAX_WAIT_S:
        raise ValidationFailed({"wait": [f"Must be between 0 and {MAX_WAIT_S}."]})
    return value


def parse_uuid(value: str, kind: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound(kind, value) from None


def load_job(session, job_id: str) -> Job:
    job = session.get(Job, parse_uuid(job_id, "job"))
    if job is None or not can_see(job.api_key_id):
        raise NotFound("job", job_id)
    return job


def enqueue_after_commit(effects) -> None:
    """The job row is committed; if the broker refuses, the sweeper re-drives it later."""
    from tasks.dispatch import dispatch
    try:
        dispatch(effects)
    except Exception:
        log.exception("enqueue failed; the sweeper will re-drive the job")


def answer_job(job_id: uuid.UUID, wait: float | None, created: bool):
    if wait:
        wait_for_end(session_factory(g.settings), job_id, wait)
    with session_scope(g.settings) as session:
        job = session.get(Job, job_id)
        body = job_object(job)
    ended = job.status in ("completed", "failed", "cancelled")
    status = 200 if (wait is not None and ended) or not created else 202
    response = jsonify(body)
    response.status_code = status
    if created:
        response.headers["Location"] = f"/v1/jobs/{job_id}"
    return response


@bp.post("/v1/messages")
@require_key()
def submit_message():
    wait = wait_seconds()
    data = MessageRequestSchema().load(json_body())
    incoming = Incoming(data["platform"], data["platform_user_id"],
                        data["platform_channel_id"], data["platform_thread_id"],
                        data["platform_server_id"])
    with session_scope(g.settings) as session:
        job = create_job(session, g.settings, Submission(
            incoming=incoming, content=data["content"], attachments=data["attachments"],
            metadata=data["metadata"], callback_url=data["callback_url"],
            on_busy=data["on_busy"], api_key_id=g.api_key_id))
        job_id = job.id
    enqueue_after_commit([NextStep(str(job_id), 0, "start")])
    return answer_job(job_id, wait, created=True)


@bp.get("/v1/jobs/<job_id>")
@require_key()
def get_job(job_id: str):
    wait = wait_seconds()
    with session_scope(g.settings) as session:
        job = load_job(session, job_id)
        ident = job.id
    return answer_job(ident, wait, created=False)


@bp.get("/v1/jobs/<job_id>/events")
@require_key()
def list_events(job_id: str):
    try:
        after = int(request.args.get("after", 0))
    except ValueError:
        raise ValidationFailed({"after": ["Must be an integer."]}) from None
    with session_scope(g.settings) as session:
        job = load_job(session, job_id)
        rows = session.execute(
            select(JobEvent).where(JobEvent.job_id == job.id, JobEvent.seq > after)
            .order_by(JobEvent.seq).limit(EVENTS_PAGE)).scalars().all()
        return jsonify({"data": [event_dict(e) for e in rows],
                        "has_more": len(rows) == EVENTS_PAGE})
