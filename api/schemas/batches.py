"""Batches and replays (api/batches.py): a batch's body and lines, its object and counts, a
replay of one job or many, and the comparison of a replay with its original."""
from __future__ import annotations

from datetime import timezone
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates, validates_schema

from agentq.loop.states import (
    BATCH_STATUSES,
    ENDED_STATUSES,
    FINISH_REASONS,
    JOB_STATUSES,
    REPLAY_MODES,
    ReplayMode,
)
from api.schemas.common import StrictSchema, callback_allowed
from api.schemas.jobs import MessageRequestSchema


class BatchLineSchema(MessageRequestSchema):
    """One line of a batch: a POST /v1/messages body, plus an id echoed in its result."""
    custom_id = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(1, 255))


class _BatchFields(StrictSchema):
    """What every batch may say: where its end is announced, how much runs at once."""
    callback_url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    max_concurrency = fields.Integer(load_default=None, allow_none=True,
                                     validate=validate.Range(1, 1000))

    @validates("callback_url")
    def _callback_url_allowed(self, value: str | None, **_kw) -> None:
        callback_allowed(value)


class BatchOptionsSchema(_BatchFields):
    metadata = fields.Dict(keys=fields.String(), load_default=dict)


class BatchRequestSchema(BatchOptionsSchema):
    """POST /v1/batches as JSON: the batch options and its requests (the view reads them
    apart, api/batches.py; this class documents the body)."""
    requests = fields.List(fields.Nested(BatchLineSchema), required=True,
                           validate=validate.Length(1, 10_000))


class ReplaySchema(StrictSchema):
    mode = fields.String(load_default=ReplayMode.RECORDED.value,
                         validate=validate.OneOf(REPLAY_MODES))
    model = fields.String(load_default=None, allow_none=True, validate=validate.Length(1, 200))
    persona_id = fields.UUID(load_default=None, allow_none=True)


class ReplayFilterSchema(StrictSchema):
    status = fields.String(validate=validate.OneOf(ENDED_STATUSES))
    finish_reason = fields.String(validate=validate.OneOf(FINISH_REASONS))
    since = fields.AwareDateTime(default_timezone=timezone.utc)
    until = fields.AwareDateTime(default_timezone=timezone.utc)
    platform = fields.String(validate=validate.Length(1, 64))
    user_id = fields.UUID()


class ReplayBatchSchema(ReplaySchema, _BatchFields):
    job_ids = fields.List(fields.UUID(), validate=validate.Length(1, 10_000))
    filter = fields.Nested(ReplayFilterSchema)

    @validates_schema
    def _one_target(self, data: dict[str, Any], **_kw) -> None:
        if ("job_ids" in data) == ("filter" in data):
            raise ValidationError("Give exactly one of job_ids and filter.", "job_ids")


class BatchCountsSchema(Schema):
    total = fields.Integer()
    queued = fields.Integer()
    running = fields.Integer()
    completed = fields.Integer()
    failed = fields.Integer()
    cancelled = fields.Integer()


class BatchSchema(Schema):
    id = fields.String()
    kind = fields.String()
    status = fields.String(validate=validate.OneOf(BATCH_STATUSES))
    counts = fields.Nested(BatchCountsSchema)
    max_concurrency = fields.Integer()
    created_at = fields.String()
    finished_at = fields.String(allow_none=True)
    metadata = fields.Dict()

class CompareToolCallSchema(Schema):
    turn = fields.Integer(required=True)
    name = fields.String(required=True)
    arguments = fields.Raw(required=True)
    ok = fields.Boolean(required=True)
    result = fields.Raw()
    error = fields.String(allow_none=True)


class CompareUsageSchema(Schema):
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    cost_estimate = fields.Float(required=True, allow_none=True)


class CompareSideSchema(Schema):
    job_id = fields.String(required=True)
    status = fields.String(required=True, validate=validate.OneOf(JOB_STATUSES))
    finish_reason = fields.String(required=True, allow_none=True,
                                  validate=validate.OneOf(FINISH_REASONS))
    content = fields.String(required=True, allow_none=True)
    tool_calls = fields.List(fields.Nested(CompareToolCallSchema), required=True)
    usage = fields.Nested(CompareUsageSchema, required=True)
    model = fields.String(required=True, allow_none=True)


class CompareSchema(Schema):
    original = fields.Nested(CompareSideSchema, required=True, allow_none=True)
    replay = fields.Nested(CompareSideSchema, required=True, allow_none=True)
    mode = fields.String(required=True, allow_none=True)
    same_answer = fields.Boolean(required=True)
    same_tool_calls = fields.Boolean(required=True)

