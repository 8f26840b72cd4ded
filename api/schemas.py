"""Marshmallow schemas per request and response (API.md, to the letter)."""
from __future__ import annotations

import json
from typing import Any

from marshmallow import (RAISE, Schema, ValidationError, fields, validate, validates,
                         validates_schema)

from agentq.models import FINISH_REASONS, JOB_STATUSES

ON_BUSY = ("queue", "steer", "interrupt", "reject")
MAX_CONTENT_CHARS = 100_000
MAX_METADATA_BYTES = 16_384
MAX_ATTACHMENTS = 20


def _not_blank(value: str) -> None:
    if not value.strip():
        raise ValidationError("Must not be blank.")


class StrictSchema(Schema):
    class Meta:
        unknown = RAISE


class AttachmentSchema(StrictSchema):
    filename = fields.String(required=True, validate=[validate.Length(1, 255), _not_blank])
    url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    mime_type = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=255))
    size_bytes = fields.Integer(load_default=None, allow_none=True,
                                validate=validate.Range(min=0))
    minio_key = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=512))


class MessageRequestSchema(StrictSchema):
    platform = fields.String(required=True, validate=[validate.Length(1, 64), _not_blank])
    platform_user_id = fields.String(required=True,
                                     validate=[validate.Length(1, 255), _not_blank])
    platform_channel_id = fields.String(required=True,
                                        validate=[validate.Length(1, 255), _not_blank])
    platform_thread_id = fields.String(load_default=None, allow_none=True,
                                       validate=validate.Length(1, 255))
    platform_server_id = fields.String(load_default=None, allow_none=True,
                                       validate=validate.Length(1, 255))
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), _not_blank])
    attachments = fields.List(fields.Nested(AttachmentSchema), load_default=list,
                              validate=validate.Length(max=MAX_ATTACHMENTS))
    callback_url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    on_busy = fields.String(load_default="queue", validate=validate.OneOf(ON_BUSY))
    metadata = fields.Dict(keys=fields.String(), load_default=dict)

    @validates("metadata")
    def _metadata_size(self, value: dict[str, Any], **_kw) -> None:
        if len(json.dumps(value)) > MAX_METADATA_BYTES:
            raise ValidationError(f"Must be at most {MAX_METADATA_BYTES} bytes as JSON.")


class ContinueRequestSchema(StrictSchema):
    conversation_id = fields.UUID(required=True)
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), _not_blank])
    callback_url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    on_busy = fields.String(load_default="queue", validate=validate.OneOf(ON_BUSY))
    metadata = fields.Dict(keys=fields.String(), load_default=dict)

    @validates("metadata")
    def _metadata_size(self, value: dict[str, Any], **_kw) -> None:
        if len(json.dumps(value)) > MAX_METADATA_BYTES:
            raise ValidationError(f"Must be at most {MAX_METADATA_BYTES} bytes as JSON.")


class EmbedRequestSchema(StrictSchema):
    text = fields.String(required=True, validate=[validate.Length(1, 100_000), _not_blank])


class EmbedResponseSchema(Schema):
    embedding = fields.List(fields.Float())


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
