"""Marshmallow schemas per request and response (API.md, to the letter)."""
from __future__ import annotations

import json
import re
from datetime import timezone
from typing import Any

from flask import g, has_app_context
from marshmallow import (RAISE, Schema, ValidationError, fields, pre_load, validate,
                         validates, validates_schema)

from agentq.config import get_settings
from agentq.errors import ValidationFailed
from agentq.models import FINISH_REASONS, JOB_STATUSES
from agentq.webhooks.urls import FIELD as CALLBACK_FIELD, check_callback_url

ON_BUSY = ("queue", "steer", "interrupt", "reject")
MAX_CONTENT_CHARS = 100_000
MAX_METADATA_BYTES = 16_384
MAX_ATTACHMENTS = 20


def _not_blank(value: str) -> None:
    if not value.strip():
        raise ValidationError("Must not be blank.")


def _callback_allowed(value: str | None) -> None:
    """SSRF guard at submit: http(s), and a public address unless the deployment allows
    private ones (the check runs again at each send)."""
    if value is None:
        return
    settings = g.settings if has_app_context() and "settings" in g else get_settings()
    try:
        check_callback_url(value, settings.webhook_allow_private)
    except ValidationFailed as exc:
        raise ValidationError(exc.fields[CALLBACK_FIELD]) from None


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL, unpaired surrogates


def _storable(value: Any) -> bool:
    """Postgres text and JSONB hold neither NUL nor unpaired surrogates (a 500 otherwise)."""
    if isinstance(value, str):
        return not _UNSTORABLE.search(value)
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    return True


class StrictSchema(Schema):
    class Meta:
        unknown = RAISE

    @pre_load
    def _no_unstorable_text(self, data: Any, **_kw) -> Any:
        if isinstance(data, dict) and not _storable(data):
            bad = [k for k, v in data.items() if not (_storable(k) and _storable(v))]
            raise ValidationError({k if isinstance(k, str) and _storable(k) else "_schema":
                                   ["Must not contain NUL (\\u0000) or unpaired surrogate "
                                    "characters."] for k in bad})
        return data


class AttachmentSchema(StrictSchema):
    filename = fields.String(required=True, validate=[validate.Length(1, 255), _not_blank])
    url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    mime_type = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=255))
    size_bytes = fields.Integer(load_default=None, allow_none=True,
                                validate=validate.Range(min=0))
    minio_key = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=512))


class _DeliveryFields(StrictSchema):
    """What a message and a continuation share: its text, delivery and bookkeeping."""
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), _not_blank])
    callback_url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    on_busy = fields.String(load_default="queue", validate=validate.OneOf(ON_BUSY))
    metadata = fields.Dict(keys=fields.String(), load_default=dict)

    @validates("metadata")
    def _metadata_size(self, value: dict[str, Any], **_kw) -> None:
        if len(json.dumps(value)) > MAX_METADATA_BYTES:
            raise ValidationError(f"Must be at most {MAX_METADATA_BYTES} bytes as JSON.")

    @validates("callback_url")
    def _callback_url_allowed(self, value: str | None, **_kw) -> None:
        _callback_allowed(value)


class MessageRequestSchema(_DeliveryFields):
    platform = fields.String(required=True, validate=[validate.Length(1, 64), _not_blank])
    platform_user_id = fields.String(required=True,
                                     validate=[validate.Length(1, 255), _not_blank])
    platform_channel_id = fields.String(required=True,
                                        validate=[validate.Length(1, 255), _not_blank])
    platform_thread_id = fields.String(load_default=None, allow_none=True,
                                       validate=validate.Length(1, 255))
    platform_server_id = fields.String(load_default=None, allow_none=True,
                                       validate=validate.Length(1, 255))
    attachments = fields.List(fields.Nested(AttachmentSchema), load_default=list,
                              validate=validate.Length(max=MAX_ATTACHMENTS))


class ContinueRequestSchema(_DeliveryFields):
    conversation_id = fields.UUID(required=True)


class EmbedRequestSchema(StrictSchema):
    text = fields.String(required=True, validate=[validate.Length(1, 100_000), _not_blank])


class EmbedResponseSchema(Schema):
    embedding = fields.List(fields.Float())


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
        _callback_allowed(value)


class BatchOptionsSchema(_BatchFields):
    metadata = fields.Dict(keys=fields.String(), load_default=dict)


class ReplaySchema(StrictSchema):
    mode = fields.String(load_default="recorded", validate=validate.OneOf(("recorded", "live")))
    model = fields.String(load_default=None, allow_none=True, validate=validate.Length(1, 200))
    persona_id = fields.UUID(load_default=None, allow_none=True)


class ReplayFilterSchema(StrictSchema):
    status = fields.String(validate=validate.OneOf(("completed", "failed", "cancelled")))
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
    status = fields.String(validate=validate.OneOf(("queued", "running", "completed",
                                                    "cancelled")))
    counts = fields.Nested(BatchCountsSchema)
    max_concurrency = fields.Integer()
    created_at = fields.String()
    finished_at = fields.String(allow_none=True)
    metadata = fields.Dict()


class UsageSchema(Schema):
    input_tokens = fields.Integer()
    output_tokens = fields.Integer()
    cost_estimate = fields.Float()


class FileRefSchema(Schema):
    filename = fields.String()
    url = fields.String()


class ToolCallSummarySchema(Schema):
    name = fields.String()
    success = fields.Boolean()
    tool_use_id = fields.String()


class ResponseMetadataSchema(Schema):
    tool_calls = fields.List(fields.Nested(ToolCallSummarySchema))


class JobResponseSchema(Schema):
    content = fields.String()
    files = fields.List(fields.Nested(FileRefSchema))
    error = fields.Raw(allow_none=True)
    metadata = fields.Nested(ResponseMetadataSchema)


class JobSchema(Schema):
    id = fields.String()
    status = fields.String(validate=validate.OneOf(JOB_STATUSES))
    finish_reason = fields.String(allow_none=True, validate=validate.OneOf(FINISH_REASONS))
    conversation_id = fields.String()
    created_at = fields.String()
    started_at = fields.String(allow_none=True)
    finished_at = fields.String(allow_none=True)
    iterations = fields.Integer()
    usage = fields.Nested(UsageSchema)
    response = fields.Nested(JobResponseSchema, allow_none=True)
    replay_of = fields.String(allow_none=True)
    batch_id = fields.String(allow_none=True)
    metadata = fields.Dict()


class MessageSchema(Schema):
    id = fields.String()
    seq = fields.Integer()
    role = fields.String()
    content = fields.String()
    job_id = fields.String(allow_none=True)
    model_used = fields.String(allow_none=True)
    created_at = fields.String()


class MessagePageSchema(Schema):
    data = fields.List(fields.Nested(MessageSchema))
    has_more = fields.Boolean()
    next_after = fields.Integer(allow_none=True)


class ErrorBodySchema(Schema):
    code = fields.String()
    message = fields.String()
    details = fields.Dict()


class ErrorSchema(Schema):
    error = fields.Nested(ErrorBodySchema)


# --- responses documented in the OpenAPI spec (api/openapi.py) --------------------------

class EventSchema(Schema):
    seq = fields.Integer(required=True)
    type = fields.String(required=True)
    data = fields.Dict(required=True)
    created_at = fields.String(required=True)


class EventPageSchema(Schema):
    data = fields.List(fields.Nested(EventSchema), required=True)
    has_more = fields.Boolean(required=True)


class DeliverySchema(Schema):
    id = fields.String(required=True)
    event_id = fields.String(required=True)
    event_type = fields.String(required=True)
    url = fields.String(required=True)
    attempt = fields.Integer(required=True)
    status = fields.String(required=True,
                           validate=validate.OneOf(("pending", "succeeded", "failed", "gave_up")))
    status_code = fields.Integer(allow_none=True, required=True)
    latency_ms = fields.Integer(allow_none=True, required=True)
    error = fields.String(allow_none=True, required=True)
    created_at = fields.String(required=True)
    next_attempt_at = fields.String(allow_none=True, required=True)


class DeliveryPageSchema(Schema):
    data = fields.List(fields.Nested(DeliverySchema), required=True)


class HealthSchema(Schema):
    status = fields.String(required=True)


class NotReadySchema(Schema):
    status = fields.String(required=True)
    down = fields.List(fields.String(), required=True)
    error = fields.Nested(ErrorBodySchema, required=True)


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


# --- admin: tenants and keys ----------------------------------------------------------------

class TenantRequestSchema(StrictSchema):
    name = fields.String(required=True, validate=[validate.Length(1, 200), _not_blank])


class TenantSchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    created_at = fields.String(required=True)


class TenantPageSchema(Schema):
    data = fields.List(fields.Nested(TenantSchema), required=True)


class KeyRequestSchema(StrictSchema):
    name = fields.String(required=True, validate=[validate.Length(1, 200), _not_blank])
    tenant_id = fields.UUID(required=True)
    admin = fields.Boolean(load_default=False)


class ApiKeySchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    prefix = fields.String(required=True)
    tenant_id = fields.String(required=True)
    admin = fields.Boolean(required=True)
    created_at = fields.String(required=True)
    last_used_at = fields.String(allow_none=True, required=True)
    revoked_at = fields.String(allow_none=True, required=True)


class NewApiKeySchema(ApiKeySchema):
    key = fields.String(required=True, metadata={"description": "The key itself: shown only "
                                                               "in this answer."})


class ApiKeyPageSchema(Schema):
    data = fields.List(fields.Nested(ApiKeySchema), required=True)
