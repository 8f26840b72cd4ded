"""Schedules (agentq.schedules): POST /v1/schedules, GET /v1/schedules,
GET /v1/schedules/<id>, DELETE /v1/schedules/<id> (204; cancel: it never fires again and
stays readable with `status: cancelled`; its firings stay recorded). A schedule continues
one of the key's conversations later, as a POST /v1/continue would; a key sees the
schedules it made (an admin key every one of its tenant)."""
from __future__ import annotations

from flask import Blueprint, g, jsonify, request
from sqlalchemy import select

from agentq.db import session_scope
from agentq.errors import NotFound
from agentq.models import Schedule
from agentq.schedules import (
    STATUS_STORED,
    cancel_schedule,
    create_schedule,
    firings,
    last_jobs,
    schedule_object,
    timing,
)
from api.auth import can_see, require_key
from api.jobs import json_body, load_conversation, parse_uuid
from api.openapi import json_response, operation
from api.schemas.schedules import (
    ScheduleDetailSchema,
    SchedulePageSchema,
    ScheduleQuerySchema,
    ScheduleRequestSchema,
)

bp = Blueprint("schedules", __name__)


def load_schedule(session, schedule_id: str) -> Schedule:
    schedule = session.get(Schedule, parse_uuid(schedule_id, "schedule"))
    if not can_see(schedule):
        raise NotFound("schedule", schedule_id)
    return schedule


@bp.post("/v1/schedules")
@operation(
    "createSchedule", "Continue a conversation later",
    tags=["schedules"],
    description="Exactly one of `run_at`, `delay_s` and `cron` (+ `timezone`). Each "
                "firing is a POST /v1/continue job, made once per tick.",
    body=ScheduleRequestSchema,
    responses={
        201: json_response(ScheduleDetailSchema, "The schedule.",
                           headers={"Location": {"description": "The schedule's "
                                                                "URL.",
                                                 "schema": {"type": "string"}}}),
    },
    errors=(401, 403, 404, 415, 422))
@require_key()
def post_schedule():
    data = ScheduleRequestSchema().load(json_body())
    when = timing(data["run_at"], data["delay_s"], data["cron"], data["timezone"])
    with session_scope(g.settings) as session:
        conversation = load_conversation(session, data["conversation_id"])
        schedule = create_schedule(session, conversation, data["content"], when,
                                   g.api_key_id, callback_url=data["callback_url"],
                                   metadata=data["metadata"], settings=g.settings)
        body = schedule_object(schedule, [])
    response = jsonify(body)
    response.status_code = 201
    response.headers["Location"] = f"/v1/schedules/{body['id']}"
    return response


@bp.get("/v1/schedules")
@operation(
    "listSchedules", "Schedules",
    tags=["schedules"],
    query=ScheduleQuerySchema,
    responses={
        200: json_response(SchedulePageSchema, "Newest first."),
    },
    errors=(401, 403, 422))
@require_key()
def list_schedules():
    query = ScheduleQuerySchema().load(request.args.to_dict())
    stmt = select(Schedule).where(Schedule.tenant_id == g.tenant_id)
    if not g.is_admin:
        stmt = stmt.where(Schedule.api_key_id == g.api_key_id)
    if "conversation_id" in query:
        stmt = stmt.where(Schedule.conversation_id == query["conversation_id"])
    if "status" in query:
        stmt = stmt.where(Schedule.status == STATUS_STORED.get(query["status"],
                                                               query["status"]))
    with session_scope(g.settings) as session:
        rows = list(session.execute(stmt.order_by(Schedule.created_at.desc(), Schedule.id)
                                    .limit(query["limit"])).scalars())
        last = last_jobs(session, [s.id for s in rows])
        return jsonify({"data": [schedule_object(s, last_job_id=last.get(s.id))
                                 for s in rows]})


@bp.get("/v1/schedules/<schedule_id>")
@operation(
    "getSchedule", "Get a schedule and its firings",
    tags=["schedules"],
    responses={
        200: json_response(ScheduleDetailSchema, "The schedule."),
    },
    errors=(401, 403, 404))
@require_key()
def get_schedule(schedule_id: str):
    with session_scope(g.settings) as session:
        schedule = load_schedule(session, schedule_id)
        return jsonify(schedule_object(schedule, firings(session, schedule.id)))


@bp.delete("/v1/schedules/<schedule_id>")
@operation(
    "deleteSchedule", "Cancel a schedule",
    tags=["schedules"],
    description="It never fires again; it stays readable (GET, the list) with "
                "`status: cancelled` (a schedule that was done stays `done`) and "
                "`cancelled_at`. Deleting it again changes nothing (204).",
    responses={
        204: {"description": "Cancelled; no body."},
    },
    errors=(401, 403, 404))
@require_key()
def delete_schedule(schedule_id: str):
    with session_scope(g.settings) as session:
        cancel_schedule(session, load_schedule(session, schedule_id))
    return "", 204
