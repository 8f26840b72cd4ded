"""Submit and poll: POST /v1/messages, POST /v1/continue, GET /v1/jobs/<id>,
POST /v1/jobs/<id>/cancel, GET /v1/jobs/<id>/events (JSON, or server-sent events),
POST /v1/jobs/<id>/tool_calls/<tool_use_id>/approve|deny (agentq.loop.approvals)."""
from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from typing import Any, Iterator

from flask import Blueprint, Response, g, jsonify, request
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agentq import idempotency
from agentq.agents import cancel_children
from agentq.db import read_scope, session_factory, session_scope
from agentq.errors import Conflict, NotFound, UnsupportedMediaType, ValidationFailed
from agentq.ids import new_id
from agentq.loop.identity import Incoming
from agentq.loop.states import ENDED
from agentq.loop.store import event_dict
from agentq.loop.submit import Submission, cancel, submit
from agentq.loop.uow import UnitOfWork
from agentq.models import Conversation, Job, JobEvent
from agentq.notify import hub_for
from agentq.views import read_job
from agentq.waiting import wait_for_end
from api.auth import can_see, require_key
from api.limits import request_json
from api.openapi import MAX_SEQ, json_response, operation, submitted_responses
from api.ratelimit import hold_request, take_hold
from api.rideout import rides_out_database
from api.schemas.jobs import (
    ApproveRequestSchema,
    ContinueRequestSchema,
    DenyRequestSchema,
    EventPageSchema,
    JobSchema,
    MessageRequestSchema,
)
from api.views import accepted, job_object

log = logging.getLogger(__name__)
bp = Blueprint("jobs", __name__)
MAX_WAIT_S = 60
EVENTS_PAGE = 500
KEEPALIVE_S = 15.0
DELTA = "message_delta"
SSE_RETRY_MS = 1000


def json_body() -> dict:
    if not request.is_json:
        raise UnsupportedMediaType("Send a JSON body with Content-Type: application/json.")
    body = request_json()
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
        raise ValidationFailed(
            {"wait": [f"Must be a number of seconds 0..{MAX_WAIT_S}."]}) from None
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
    if not can_see(job):
        raise NotFound("job", job_id)
    return job


def read_visible_job(session: Session, job_id: str) -> tuple[Any, list[str] | None]:
    """`load_job`, with the job's children read in the same statement (`read_job`: on
    Postgres the job a row of its columns, for `job_object`)."""
    read = read_job(session, parse_uuid(job_id, "job"))
    if read is None or not can_see(read[0]):
        raise NotFound("job", job_id)
    return read


def _get_job(session: Session, job_id: uuid.UUID) -> Job:
    """A job this request has seen already (made, or loaded through `load_job`), read
    again; NotFound if it was deleted meanwhile."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound("job", str(job_id))
    return job


def load_conversation(session, conversation_id: uuid.UUID) -> Conversation:
    """A conversation of the key's tenant (any, for an admin key); for another key, one it
    owns (`agentq.loop.identity.scope_key`: a conversation made at a place by a non-admin
    key is that key's alone) or, where it has no owner, one with a job the key made; else
    404, as if absent."""
    conversation = session.get(Conversation, conversation_id)
    if conversation is None or conversation.tenant_id != g.tenant_id:
        raise NotFound("conversation", str(conversation_id))
    owner = owner_of(conversation)
    visible = g.is_admin or owner == str(g.api_key_id) or (owner is None and session.execute(
        select(Job.id).where(Job.conversation_id == conversation_id,
                             Job.tenant_id == g.tenant_id,
                             Job.api_key_id == g.api_key_id).limit(1)).first())
    if not visible:
        raise NotFound("conversation", str(conversation_id))
    return conversation


def owner_of(conversation: Conversation) -> str | None:
    """The API key id a conversation belongs to (its scope key's fifth part), if any."""
    try:
        parts = json.loads(conversation.scope_key or "[]")
    except ValueError:
        return None
    return parts[4] if isinstance(parts, list) and len(parts) > 4 else None


def answer_job(job_id: uuid.UUID, wait: float | None, created: bool, replayed: bool = False,
               body: dict | None = None, steering_input: uuid.UUID | None = None):
    """The job object, after waiting if asked; `body` (the object as just written) saves a
    read when there is nothing to wait for. A message that steered the running job gets
    that job with `steering`: where its input went.

    The caller holds no session (no database connection) here: the wait listens on the hub
    and reads Postgres in short sessions of its own (agentq.waiting), and the answer is read
    afresh after it."""
    if wait:
        wait_for_end(session_factory(g.settings), hub_for(g.settings), job_id, wait)
    if body is None or wait or steering_input is not None:
        with session_scope(g.settings) as session:
            body = job_object(_get_job(session, job_id))
            if steering_input is not None:
                body["steering"] = steering_status(session, job_id, steering_input)
    ended = body["status"] in ENDED
    response = jsonify(body)
    response.status_code = 200 if (wait is not None and ended) or not created else 202
    if created:
        response.headers["Location"] = f"/v1/jobs/{job_id}"
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


def steering_status(session, job_id: uuid.UUID, input_id: uuid.UUID) -> dict:
    """`queued` (waiting for the job's next turn), `injected` (the job read it) or
    `deferred` (the job ended first: it runs as `follow_up_job_id`)."""
    status, follow_up = "queued", None
    events = session.execute(select(JobEvent.type, JobEvent.data).where(
        JobEvent.job_id == job_id,
        JobEvent.type.in_(("steering_injected", "steering_deferred")))).all()
    for kind, data in events:
        if kind == "steering_injected" and data.get("input_id") == str(input_id):
            status = "injected"
        elif kind == "steering_deferred" and str(input_id) in (data.get("input_ids") or ()):
            status, follow_up = "deferred", data.get("follow_up_job_id")
    message = {"queued": "The input will be read at the job's next turn.",
               "injected": "The job read the input.",
               "deferred": f"The job ended before reading the input; it runs as job "
                           f"{follow_up}."}[status]
    return {"input_id": str(input_id), "status": status, "follow_up_job_id": follow_up,
            "message": message}


def _submit(route: str, body: dict, sub: Submission):
    """Create (or steer) under the request's Idempotency-Key, commit, then enqueue."""
    wait = wait_seconds()
    hold_request(wait)  # before anything is written: a 429 creates no job
    key = request.headers.get("Idempotency-Key")
    key = idempotency.check_key(key) if key is not None else None
    digest = idempotency.request_hash(route, body)
    earlier: uuid.UUID | None = None
    for attempt in range(2):
        try:
            with UnitOfWork(session_factory(g.settings)) as uow:
                session, job_id = uow.session, new_id()
                claimed = None
                if key is not None:  # claimed for the job about to be made, in one INSERT
                    earlier, claimed = idempotency.take(session, g.tenant_id, g.api_key_id,
                                                        key, digest, job_id)
                    if earlier is not None:
                        break  # answered below: a `wait` must not hold this connection
                submitted = submit(uow, g.settings, dataclasses.replace(sub, job_id=job_id))
                if claimed is not None and claimed.job_id != submitted.job.id:
                    claimed.job_id = submitted.job.id  # the running job it steered
                session.flush()
                job_id, body_now = submitted.job.id, job_object(submitted.job)
                steering_input = submitted.steering_input_id
            break
        except IntegrityError:
            if attempt or key is None:
                raise
            log.info("idempotency key raced; answering with the first job")
    if earlier is not None:
        return answer_job(earlier, wait, created=True, replayed=True)
    if steering_input is not None:
        return answer_job(job_id, wait, created=True, steering_input=steering_input)
    return answer_job(job_id, wait, created=True, body=body_now)


@bp.post("/v1/messages")
@operation(
    "submitMessage", "Submit a message", tags=["jobs"],
    description="An incoming message, run as a job. `on_busy` says what happens when the "
                "conversation already runs a job; `reject` answers `409` naming it. A `persona_id` "
                "that is not one of the key's tenant is `404`.",
    parameters=["wait", "idempotency_key"], body=MessageRequestSchema,
    responses=submitted_responses(JobSchema), errors=(401, 403, 404, 409, 415, 422))
@rides_out_database  # a database blip waited out inside the request (api/rideout.py)
@require_key()
def submit_message():
    body = json_body()
    data = MessageRequestSchema().load(body)
    incoming = Incoming(data["platform"], data["platform_user_id"],
                        data["platform_channel_id"], data["platform_thread_id"],
                        data["platform_server_id"])
    return _submit("/v1/messages", body, Submission(
        incoming=incoming, content=data["content"], attachments=data["attachments"],
        metadata=data["metadata"], callback_url=data["callback_url"],
        on_busy=data["on_busy"], limits=data["limits"], persona_id=data["persona_id"],
        stream=data["stream"], api_key_id=g.api_key_id, tenant_id=g.tenant_id,
        own_conversations=not g.is_admin))


@bp.post("/v1/continue")
@operation(
    "continueConversation", "Continue a conversation", tags=["jobs"],
    description="A message into an existing conversation (background jobs, the scheduler).",
    parameters=["wait", "idempotency_key"], body=ContinueRequestSchema,
    responses=submitted_responses(JobSchema), errors=(401, 403, 404, 409, 415, 422))
@rides_out_database  # a database blip waited out inside the request (api/rideout.py)
@require_key()
def continue_conversation():
    body = json_body()
    data = ContinueRequestSchema().load(body)
    conversation_id = data["conversation_id"]
    with session_scope(g.settings) as session:
        load_conversation(session, conversation_id)
    return _submit("/v1/continue", body, Submission(
        incoming=None, conversation_id=conversation_id, content=data["content"],
        metadata=data["metadata"], callback_url=data["callback_url"],
        on_busy=data["on_busy"], limits=data["limits"], persona_id=data["persona_id"],
        stream=data["stream"], api_key_id=g.api_key_id, tenant_id=g.tenant_id,
        own_conversations=not g.is_admin))


@bp.get("/v1/jobs/<job_id>")
@operation(
    "getJob", "Get a job",
    tags=["jobs"],
    parameters=["wait"],
    responses={
        200: json_response(JobSchema, "The job object."),
    },
    errors=(401, 403, 404, 422))
@require_key()
def get_job(job_id: str):
    wait = wait_seconds()
    with read_scope(g.settings) as session:  # no transaction: one round trip a read
        if wait:
            job, body = load_job(session, job_id), None
        else:  # a poll: the job and its children read once, in one statement, answered as read
            job, children = read_visible_job(session, job_id)
            body = job_object(job, children)
    hold_request(wait)
    return answer_job(job.id, wait, created=False, body=body)


@bp.post("/v1/jobs/<job_id>/cancel")
@operation(
    "cancelJob", "Cancel a job",
    tags=["jobs"],
    description="The job ends `cancelled` at its next step boundary; queued tool "
                "tasks are revoked. `409` once it has ended.",
    responses={
        202: json_response(JobSchema, "Cancelling; the job object."),
    },
    errors=(401, 403, 404, 409))
@require_key()
def cancel_job(job_id: str):
    with UnitOfWork(session_factory(g.settings)) as uow:
        job = load_job(uow.session, job_id)
        if job.status in ENDED:
            raise Conflict(f"Job {job_id} has already ended ({job.status}).",
                           job_id=job_id, status=job.status)
        cancel(uow, job)
        body = job_object(job)
    # its sub-agents after it (each alone; the sweeper finishes a cascade cut short)
    cancel_children(session_factory(g.settings), uuid.UUID(body["id"]))
    return accepted(body)


def _optional_body() -> dict:
    """A body that may be left out (approve, deny); when sent, JSON as everywhere."""
    if not request.get_data(cache=True):
        return {}
    return json_body()


def _decide(job_id: str, decide) -> object:
    with UnitOfWork(session_factory(g.settings)) as uow:
        job = load_job(uow.session, job_id)
        decide(uow, job.id)
        uow.session.flush()
        body = job_object(_get_job(uow.session, job.id))
    return accepted(body)


@bp.post("/v1/jobs/<job_id>/tool_calls/<tool_use_id>/approve")
@operation(
    "approveToolCall", "Approve a tool call",
    tags=["jobs"],
    description="The call (of a `requires_approval` tool, awaiting approval: the job is "
                "`waiting`) runs, with `arguments` instead of the model's if given. "
                "`409` when the call does not await approval.",
    body={"required": False,
          "content": {"application/json": {"schema": ApproveRequestSchema}}},
    responses={
        202: json_response(JobSchema, "Approved: the call runs; the job object."),
    },
    errors=(401, 403, 404, 409, 415, 422))
@require_key()
def approve_tool_call(job_id: str, tool_use_id: str):
    """Run a call that waits for approval, optionally with edited arguments."""
    from agentq.loop.approvals import approve
    from agentq.tools.registry import get_registry
    data = ApproveRequestSchema().load(_optional_body())
    registry = get_registry(g.settings)
    return _decide(job_id, lambda uow, ident: approve(
        uow, ident, tool_use_id, data["arguments"], registry))


@bp.post("/v1/jobs/<job_id>/tool_calls/<tool_use_id>/deny")
@operation(
    "denyToolCall", "Deny a tool call",
    tags=["jobs"],
    description="The call does not run; the model reads a `denied` tool error with "
                "the reason. `409` when the call does not await approval.",
    body={"required": False,
          "content": {"application/json": {"schema": DenyRequestSchema}}},
    responses={
        202: json_response(JobSchema, "Denied; the job object."),
    },
    errors=(401, 403, 404, 409, 415, 422))
@require_key()
def deny_tool_call(job_id: str, tool_use_id: str):
    """Refuse a call that waits for approval; the model reads a `denied` tool error."""
    from agentq.loop.approvals import deny
    data = DenyRequestSchema().load(_optional_body())
    return _decide(job_id, lambda uow, ident: deny(uow, ident, tool_use_id, data["reason"]))


@bp.get("/v1/jobs/<job_id>/events")
@operation(
    "listJobEvents", "A job's events",
    tags=["jobs"],
    description="The job's ordered events. With `Accept: text/event-stream` they "
                "stream as server-sent events (`id` = seq, `event` = type, `data` = "
                "the event as JSON) until `job_end`, resuming after `Last-Event-ID`.",
    parameters=["events_after", "last_event_id"],
    responses={
        200: {"description": "The events after `after`, oldest first.",
              "content": {"application/json": {"schema": EventPageSchema},
                          "text/event-stream": {"schema": {
                              "type": "string",
                              "description": "Server-sent events, one per job "
                                             "event, with keep-alive comments."}}}},
    },
    errors=(401, 403, 404, 422))
@require_key()
def list_events(job_id: str):
    after = _after_arg()
    with session_scope(g.settings) as session:
        ident = load_job(session, job_id).id
    if request.accept_mimetypes.best_match(["application/json", "text/event-stream"]) \
            == "text/event-stream":
        return _stream(ident, after)
    rows = _events_after(session_factory(g.settings), ident, after)
    return jsonify({"data": rows, "has_more": len(rows) == EVENTS_PAGE})


def _after_arg() -> int:
    raw = request.headers.get("Last-Event-ID") or request.args.get("after", "0")
    try:
        after = int(raw)
    except ValueError:
        raise ValidationFailed({"after": ["Must be an integer (an event seq)."]}) from None
    if not 0 <= after <= MAX_SEQ:
        raise ValidationFailed({"after": [f"Must be between 0 and {MAX_SEQ}."]})
    return after


def _events_after(sessions, job_id: uuid.UUID, after: int) -> list[dict]:
    with sessions() as session:
        rows = session.execute(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after)
            .order_by(JobEvent.seq).limit(EVENTS_PAGE)).scalars().all()
        return [event_dict(e) for e in rows]


def _sse(event: dict) -> str:
    return (f"id: {event['seq']}\nevent: {event['type']}\n"
            f"data: {json.dumps(event, default=str)}\n\n")


def _sse_delta(delta: dict) -> str:
    """A message_delta: no `id` (it is not an event of the record: Last-Event-ID stays
    at the last stored event), its JSON as `data`."""
    return f"event: {DELTA}\ndata: {json.dumps(delta, default=str)}\n\n"


def _stream(job_id: uuid.UUID, after: int) -> Response:
    """The backlog from Postgres, then live events pushed through the hub, until job_end.

    The stream holds no database connection while idle: it waits on the hub and reads
    Postgres only to fill a gap or on a keep-alive tick. It holds a slot of its key's
    holds (api/ratelimit.py) until it ends or its client goes away.
    """
    hold = take_hold()
    sessions = session_factory(g.settings)
    sub = hub_for(g.settings).subscribe(str(job_id))

    def generate() -> Iterator[str]:
        last = after
        try:
            yield f"retry: {SSE_RETRY_MS}\n\n"
            while True:
                batch = _events_after(sessions, job_id, last)
                for event in batch:
                    yield _sse(event)
                    last = event["seq"]
                    if event["type"] == "job_end":
                        return
                if len(batch) < EVENTS_PAGE:
                    break
            while True:
                pushed = sub.get(KEEPALIVE_S)
                hold.renew()
                deltas = [e for e in pushed if e.get("type") == DELTA]
                if deltas:  # streamed text: passed on as it comes, never stored
                    for delta in deltas:
                        yield _sse_delta(delta)
                    pushed = [e for e in pushed if e.get("type") != DELTA]
                    if not pushed:
                        continue
                if not pushed:
                    yield ": keep-alive\n\n"
                fresh = [e for e in pushed if e["seq"] > last]
                if not pushed or (fresh and fresh[0]["seq"] != last + 1):
                    fresh = _events_after(sessions, job_id, last)  # a gap, or a tick
                for event in fresh:
                    if event["seq"] <= last:
                        continue
                    yield _sse(event)
                    last = event["seq"]
                    if event["type"] == "job_end":
                        return
        finally:
            sub.close()
            hold.release()

    response = Response(generate(), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    response.call_on_close(hold.release)  # also when the stream never started
    return response
