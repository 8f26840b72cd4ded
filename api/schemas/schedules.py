"""A schedule's schemas (api/schedules.py, agentq/schedules.py): its request, the schedule
with its firings, and a listing's query."""
from __future__ import annotations

from marshmallow import Schema, fields, validate

from agentq.loop.states import SCHEDULE_STATUSES_SHOWN
from api.schemas.common import (
    MAX_CONTENT_CHARS,
    PAGE_SIZE,
    CallbackAndMetadata,
    StrictSchema,
    not_blank,
)


class ScheduleRequestSchema(CallbackAndMetadata):
    conversation_id = fields.UUID(required=True)
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), not_blank])
    run_at = fields.AwareDateTime(load_default=None, allow_none=True,
                                  metadata={"description": "When to fire, with an offset."})
    delay_s = fields.Float(load_default=None, allow_none=True,
                           validate=validate.Range(0, 366 * 86400),
                           metadata={"description": "Fire this many seconds from now."})
    cron = fields.String(load_default=None, allow_none=True, validate=validate.Length(1, 200),
                         metadata={"description": "Fire on each tick: 5 cron fields, or 6 "
                                                  "with seconds last."})
    timezone = fields.String(load_default=None, allow_none=True,
                             validate=validate.Length(1, 64),
                             metadata={"description": "The cron's IANA time zone (UTC)."})


class ScheduleFiringSchema(Schema):
    fire_at = fields.String(required=True)
    job_id = fields.String(allow_none=True, required=True)
    missed = fields.Integer(required=True)
    created_at = fields.String(required=True)


class ScheduleSchema(Schema):
    id = fields.String(required=True)
    conversation_id = fields.String(required=True)
    content = fields.String(required=True)
    kind = fields.String(required=True, validate=validate.OneOf(("once", "cron")))
    run_at = fields.String(allow_none=True, required=True)
    cron = fields.String(allow_none=True, required=True)
    timezone = fields.String(required=True)
    next_run_at = fields.String(allow_none=True, required=True)
    status = fields.String(required=True, validate=validate.OneOf(SCHEDULE_STATUSES_SHOWN))
    runs = fields.Integer(required=True, metadata={"description": "Firings so far."})
    last_job_id = fields.String(allow_none=True, required=True, metadata={
        "description": "The job of the latest firing (null before the first)."})
    created_by = fields.String(required=True)
    last_fired_at = fields.String(allow_none=True, required=True)
    created_at = fields.String(required=True)
    cancelled_at = fields.String(allow_none=True, required=True)
    metadata = fields.Dict(required=True)


class ScheduleDetailSchema(ScheduleSchema):
    firings = fields.List(fields.Nested(ScheduleFiringSchema), required=True,
                          metadata={"description": "The latest firings, newest first."})


class SchedulePageSchema(Schema):
    data = fields.List(fields.Nested(ScheduleSchema), required=True)


class ScheduleQuerySchema(StrictSchema):
    conversation_id = fields.UUID(metadata={"description": "Only this conversation's "
                                                           "schedules."})
    status = fields.String(validate=validate.OneOf(SCHEDULE_STATUSES_SHOWN),
                           metadata={"description": "Only schedules in this status "
                                                    "(default: all, cancelled ones too)."})
    limit = fields.Integer(load_default=100, validate=validate.Range(1, 1000),
                           metadata=PAGE_SIZE)

