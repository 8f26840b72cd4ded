"""Batches and replay: POST /v1/batches (JSON or JSONL), GET /v1/batches/<id>,
GET /v1/batches/<id>/results (JSONL, request order), POST /v1/batches/<id>/cancel,
POST /v1/jobs/<id>/replay, POST /v1/batches/replay, GET /v1/jobs/<id>/compare."""
from __future__ import annotations

import json
from typing import Any, Iterator

from flask import Blueprint, Response, g, jsonify, request
from marshmallow import ValidationError
from sqlalchemy import select

from agentq import batches
from agentq.db import session_factory, session_scope
from agentq.errors import (
    Conflict,
    NotFound,
    UnknownQueryParameter,
    UnsupportedMediaType,
    ValidationFailed,
)
from agentq.loop import replay
from agentq.loop.identity import Incoming
from agentq.loop.states import ENDED_STATUSES
from agentq.loop.submit import Submission
from agentq.loop.uow import UnitOfWork
from agentq.models import Batch, Conversation, Job
from agentq.views import batch_counts, batch_object
from api.auth import can_see, require_key
from api.jobs import json_body, load_job, parse_uuid
from api.limits import parse_json, utf8
from api.openapi import batch_links, job_links, json_response, operation
from api.schemas.batches import (
    BatchLineSchema,
    BatchOptionsSchema,
    BatchRequestSchema,
    BatchSchema,
    CompareSchema,
    ReplayBatchSchema,
    ReplaySchema,
)
from api.schemas.jobs import JobSchema
from api.views import accepted, job_object

bp = Blueprint("batches", __name__)
MAX_LINES = 10_000
RESULTS_PAGE = 500
NDJSON = ("application/x-ndjson", "application/jsonl", "application/json-lines")


def _lines() -> tuple[list[Any], dict[str, Any]]:
    """The batch's request bodies and its options, from a JSON or a JSONL body."""
    mimetype = request.mimetype
    if mimetype in NDJSON:
        options = BatchOptionsSchema().load(request.args.to_dict())
        lines = []
        # each line decoded by itself, strictly: a bad byte is a 400 naming its line
        for number, raw_bytes in enumerate(request.get_data().splitlines(), start=1):
            raw = utf8(raw_bytes, f"Line {number}", line=number)
            if not raw.strip():
                continue
            lines.append(parse_json(raw, g.settings.front.max_json_depth, f"Line {number}",
                                    line=number))
        return lines, options
    if mimetype != "application/json":
        raise UnsupportedMediaType("Send application/json ({\"requests\": [...]}) or "
                                   "application/x-ndjson (one request a line).")
    if request.args:
        raise UnknownQueryParameter(sorted(request.args), [])  # the JSON form says them
        # in its body; only a JSONL body takes them as query parameters
    body = json_body()
    options = BatchOptionsSchema().load({k: v for k, v in body.items() if k != "requests"})
    requests_ = body.get("requests")
    if not isinstance(requests_, list):
        raise ValidationFailed({"requests": ["Must be a list of POST /v1/messages bodies."]})
    return requests_, options


def _validate(lines: list[Any]) -> list[dict[str, Any]]:
    """Every line, before anything is written: the first bad one names its line and field."""
    if not lines:
        raise ValidationFailed({"requests": ["A batch needs at least one request."]})
    if len(lines) > MAX_LINES:
        raise ValidationFailed({"requests": [f"At most {MAX_LINES} requests a batch."]})
    schema, loaded = BatchLineSchema(), []
    for number, line in enumerate(lines, start=1):
        if not isinstance(line, dict):
            raise ValidationFailed({"_line": ["Must be an object."]},
                                   f"Line {number} is not a JSON object.", line=number)
        try:
            loaded.append(schema.load(line))
        except ValidationError as exc:
            fields = exc.normalized_messages()
            raise ValidationFailed(fields, f"Line {number}: invalid field(s) "
                                           f"{', '.join(sorted(map(str, fields)))}.",
                                   line=number) from None
    return loaded


@bp.post("/v1/batches")
@operation(
    "createBatch", "Submit a batch",
    tags=["batches"],
    description="JSON `{\"requests\": [...], \"callback_url\"?, ...}`, or JSONL "
                "(`application/x-ndjson`) with one POST /v1/messages body a line and "
                "the batch options as query parameters. A bad line fails the whole "
                "batch with `422` naming its line.",
    parameters=[
        {"in": "query", "name": "callback_url", "required": False,
         "description": "JSONL form only: a webhook on the batch's end.",
         "schema": {"type": "string", "format": "uri"}},
        {"in": "query", "name": "max_concurrency", "required": False,
         "description": "JSONL form only: how many of its jobs run at once.",
         "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
    body={"required": True, "content": {
        "application/json": {"schema": BatchRequestSchema},
        "application/x-ndjson": {"schema": {
            "type": "string", "description": "One BatchLine (a POST /v1/messages body, "
                                             "plus custom_id) a line."}}}},
    responses={
        202: json_response(BatchSchema, "The batch.",
                           headers={"Location": "BatchLocation"},
                           links=batch_links()),
    },
    errors=(401, 403, 404, 415, 422))
@require_key()
def create_batch():
    lines, options = _lines()
    loaded = _validate(lines)
    with UnitOfWork(session_factory(g.settings)) as uow:
        batch = batches.create(
            uow, kind="messages", tenant_id=g.tenant_id, api_key_id=g.api_key_id,
            total=len(loaded),
            max_concurrency=options.get("max_concurrency") or g.settings.batch_max_concurrency,
            callback_url=options.get("callback_url"), meta=options.get("metadata") or {})
        batches.add_messages(uow, g.settings, batch, [(Submission(
            incoming=Incoming(data["platform"], data["platform_user_id"],
                              data["platform_channel_id"], data["platform_thread_id"],
                              data["platform_server_id"]),
            content=data["content"], attachments=data["attachments"],
            metadata=data["metadata"], callback_url=data["callback_url"],
            limits=data["limits"], persona_id=data["persona_id"], stream=data["stream"],
            api_key_id=g.api_key_id, tenant_id=g.tenant_id,
            own_conversations=not g.is_admin), data.get("custom_id"))
            for data in loaded])
        body = _admitted(uow, batch)
    return _answer(body)


def _admitted(uow: UnitOfWork, batch: Batch) -> dict:
    """Admit the first jobs (they start after the commit); the batch as answered."""
    batches.admit(uow, batch)
    return batch_object(batch, batch_counts(uow.session, batch.id))


def _answer(body: dict):
    return accepted(body, f"/v1/batches/{body['id']}")


def load_batch(session, batch_id: str) -> Batch:
    batch = session.get(Batch, parse_uuid(batch_id, "batch"))
    if not can_see(batch):
        raise NotFound("batch", batch_id)
    return batch


@bp.get("/v1/batches/<batch_id>")
@operation(
    "getBatch", "Get a batch",
    tags=["batches"],
    responses={
        200: json_response(BatchSchema, "The batch."),
    },
    errors=(401, 403, 404))
@require_key()
def get_batch(batch_id: str):
    with session_scope(g.settings) as session:
        batch = load_batch(session, batch_id)
        return jsonify(batch_object(batch, batch_counts(session, batch.id)))


@bp.get("/v1/batches/<batch_id>/results")
@operation(
    "getBatchResults", "A batch's ended jobs",
    tags=["batches"],
    responses={
        200: {"description": "One job object (with `custom_id` and "
                             "`batch_index`) a line, in request order.",
              "content": {"application/x-ndjson": {"schema": {
                  "type": "string"}}}},
    },
    errors=(401, 403, 404))
@require_key()
def batch_results(batch_id: str):
    """Finished jobs so far, one job object a line, in request order."""
    with session_scope(g.settings) as session:
        ident = load_batch(session, batch_id).id
    sessions = session_factory(g.settings)

    def generate() -> Iterator[str]:
        after = -1
        while True:
            with sessions() as session:
                jobs = session.execute(
                    select(Job).where(Job.batch_id == ident, Job.batch_index > after)
                    .order_by(Job.batch_index).limit(RESULTS_PAGE)).scalars().all()
                lines = [json.dumps({**job_object(j), "custom_id": j.custom_id,
                                     "batch_index": j.batch_index}) + "\n"
                         for j in jobs if j.finished_at is not None]
            yield from lines
            if len(jobs) < RESULTS_PAGE:
                return
            last = jobs[-1].batch_index
            assert last is not None  # read by batch_index > after: never NULL
            after = last

    return Response(generate(), mimetype="application/x-ndjson")


@bp.post("/v1/batches/<batch_id>/cancel")
@operation(
    "cancelBatch", "Cancel a batch",
    tags=["batches"],
    responses={
        202: json_response(BatchSchema, "Cancelling; the batch."),
    },
    errors=(401, 403, 404, 409))
@require_key()
def cancel_batch(batch_id: str):
    with session_scope(g.settings) as session:
        ident = load_batch(session, batch_id).id
    batches.cancel(session_factory(g.settings), ident)
    with session_scope(g.settings) as session:
        batch = load_batch(session, batch_id)
        body = batch_object(batch, batch_counts(session, ident))
    return accepted(body)


@bp.post("/v1/jobs/<job_id>/replay")
@operation(
    "replayJob", "Replay a job",
    tags=["replay"],
    description="`recorded` answers each LLM call from the original's stored replies "
                "and re-runs the tools; `live` calls the LLM again. `409` until the "
                "original has ended. A non-admin key's `model` must be the persona's "
                "default model or a configured one (`422` naming `model` otherwise).",
    body=ReplaySchema,
    responses={
        202: json_response(JobSchema, "The new job, with `replay_of` set.",
                           headers={"Location": "Location"},
                           links=job_links()),
    },
    errors=(401, 403, 404, 409, 415, 422))
@require_key()
def replay_job(job_id: str):
    data = ReplaySchema().load(json_body())
    with UnitOfWork(session_factory(g.settings)) as uow:
        original = load_job(uow.session, job_id)
        if original.status not in ENDED_STATUSES:
            raise Conflict(f"Job {job_id} has not ended; replay it once it has.",
                           status=original.status)
        if not g.is_admin:  # a non-admin key picks only a model the persona allows
            replay.check_model(uow.session, g.settings, data.get("model"),
                               [data.get("persona_id") or original.persona_id],
                               g.tenant_id)
        job = replay.create_replay(
            uow, g.settings, original, data["mode"], model=data.get("model"),
            persona_id=data.get("persona_id"), api_key_id=g.api_key_id)
        body = job_object(job)
    return accepted(body, f"/v1/jobs/{body['id']}")


@bp.post("/v1/batches/replay")
@operation(
    "replayBatch", "Replay many jobs as a batch",
    tags=["replay"],
    description="A non-admin key's `model` must be each persona's default model or a "
                "configured one (`422` naming `model` otherwise).",
    body=ReplayBatchSchema,
    responses={
        202: json_response(BatchSchema, "The batch of replays.",
                           headers={"Location": "BatchLocation"},
                           links=batch_links()),
    },
    errors=(401, 403, 404, 409, 415, 422))
@require_key()
def replay_batch():
    data = ReplayBatchSchema().load(json_body())
    with UnitOfWork(session_factory(g.settings)) as uow:
        originals = _replay_targets(uow.session, data)
        if not originals:
            raise ValidationFailed({"filter": ["No ended job matches."]},
                                   "No job to replay: nothing matched.")
        if not g.is_admin:
            replay.check_model(uow.session, g.settings, data.get("model"),
                               [data.get("persona_id") or o.persona_id for o in originals],
                               g.tenant_id)
        batch = batches.create(
            uow, kind="replay", tenant_id=g.tenant_id, api_key_id=g.api_key_id,
            total=len(originals),
            max_concurrency=data.get("max_concurrency") or g.settings.batch_max_concurrency,
            callback_url=data.get("callback_url"),
            meta={"matched": len(originals), "mode": data["mode"]})
        batches.add_replays(uow, g.settings, batch, originals, data["mode"],
                            model=data.get("model"), persona_id=data.get("persona_id"),
                            api_key_id=g.api_key_id)
        body = _admitted(uow, batch)
    return _answer(body)


def _replay_targets(session, data: dict[str, Any]) -> list[Job]:
    ended = ENDED_STATUSES
    if data.get("job_ids"):
        jobs = []
        for ident in data["job_ids"]:
            job = session.get(Job, ident)
            if not can_see(job):
                raise NotFound("job", str(ident))
            if job.status not in ended:
                raise Conflict(f"Job {ident} has not ended.", job_id=str(ident))
            jobs.append(job)
        return jobs
    f = data["filter"]
    query = select(Job).where(Job.status.in_(ended), Job.tenant_id == g.tenant_id)
    if not g.is_admin:
        query = query.where(Job.api_key_id == g.api_key_id)
    if f.get("status"):
        query = query.where(Job.status == f["status"])
    if f.get("finish_reason"):
        query = query.where(Job.finish_reason == f["finish_reason"])
    if f.get("since"):
        query = query.where(Job.created_at >= f["since"])
    if f.get("until"):
        query = query.where(Job.created_at < f["until"])
    if f.get("platform") or f.get("user_id"):
        query = query.join(Conversation, Conversation.id == Job.conversation_id)
        if f.get("platform"):
            query = query.where(Conversation.platform == f["platform"])
        if f.get("user_id"):
            query = query.where(Job.user_id == f["user_id"])
    return list(session.execute(query.order_by(Job.created_at).limit(MAX_LINES)).scalars())


@bp.get("/v1/jobs/<job_id>/compare")
@operation(
    "compareReplay", "A replay beside its original",
    tags=["replay"],
    description="`404` when the job is not a replay.",
    responses={
        200: json_response(CompareSchema, "Answers, tool calls and usage side by side."),
    },
    errors=(401, 403, 404))
@require_key()
def compare_job(job_id: str):
    with session_scope(g.settings) as session:
        job = load_job(session, job_id)
        if job.replay_of is None:
            raise NotFound("replay", job_id)
        return jsonify(replay.compare(session, job))
