"""A job's schemas (api/jobs.py): a message and a continuation as sent, the job object and
its events as answered, and a decision on a call waiting for approval
(agentq.loop.approvals)."""
from __future__ import annotations

from marshmallow import Schema, fields, validate

from agentq.loop.approvals import MAX_REASON_CHARS
from agentq.loop.states import FINISH_REASONS, JOB_STATUSES, WAITS
from api.schemas.common import (
    MAX_CONTENT_CHARS,
    AppliedLimitsSchema,
    CallbackAndMetadata,
    LimitsSchema,
    StrictSchema,
    not_blank,
)

ON_BUSY = ("queue", "steer", "interrupt", "reject")
MAX_ATTACHMENTS = 20


class AttachmentSchema(StrictSchema):
    filename = fields.String(required=True, validate=[validate.Length(1, 255), not_blank])
    url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    mime_type = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=255))
    size_bytes = fields.Integer(load_default=None, allow_none=True,
                                validate=validate.Range(min=0, max=2**63 - 1))
    minio_key = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=512))


class _DeliveryFields(CallbackAndMetadata):
    """What a message and a continuation share: its text, delivery and bookkeeping."""
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), not_blank])
    on_busy = fields.String(load_default="queue", validate=validate.OneOf(ON_BUSY))
    limits = fields.Nested(LimitsSchema, load_default=None, allow_none=True)
    persona_id = fields.UUID(load_default=None, allow_none=True,
                             metadata={"description": "Answer as this persona of the key's "
                                                      "tenant (404 if it has none such)."})
    stream = fields.Boolean(load_default=False, metadata={
        "description": "Stream the model's replies: `message_delta` events on the job's "
                       "event stream (server-sent events) as the text arrives; not stored."})


class MessageRequestSchema(_DeliveryFields):
    platform = fields.String(required=True, validate=[validate.Length(1, 64), not_blank])
    platform_user_id = fields.String(required=True,
                                     validate=[validate.Length(1, 255), not_blank])
    platform_channel_id = fields.String(required=True,
                                        validate=[validate.Length(1, 255), not_blank])
    platform_thread_id = fields.String(load_default=None, allow_none=True,
                                       validate=validate.Length(1, 255))
    platform_server_id = fields.String(load_default=None, allow_none=True,
                                       validate=validate.Length(1, 255))
    attachments = fields.List(fields.Nested(AttachmentSchema), load_default=list,
                              validate=validate.Length(max=MAX_ATTACHMENTS))


class ContinueRequestSchema(_DeliveryFields):
    conversation_id = fields.UUID(required=True)


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
    status = fields.String(metadata={
        "description": "`succeeded`, `failed` or `cancelled` (`pending` or `awaiting` only "
                       "if the job ended while the call was out or held for approval)."})
    arguments = fields.Raw(allow_none=True, metadata={
        "description": "The arguments the tool was called with; over 2 KB of JSON: its "
                       "first 2 KB as a string, with `truncated: true`."})
    result = fields.Raw(allow_none=True, metadata={
        "description": "What the tool returned (null when it failed); over 2 KB: its first "
                       "2 KB as a string, with `truncated: true`."})
    error = fields.Raw(allow_none=True, metadata={
        "description": "The tool's error `{code, message}` when it failed, else null."})
    truncated = fields.Boolean(metadata={
        "description": "`arguments` or `result` was cut at 2 KB (the job's events keep "
                       "them whole)."})


class ResponseMetadataSchema(Schema):
    tool_calls = fields.List(fields.Nested(ToolCallSummarySchema))


class JobResponseSchema(Schema):
    content = fields.String()
    files = fields.List(fields.Nested(FileRefSchema))
    error = fields.Raw(allow_none=True)
    metadata = fields.Nested(ResponseMetadataSchema)


class SteeringSchema(Schema):
    input_id = fields.String()
    status = fields.String(validate=validate.OneOf(("queued", "injected", "deferred")))
    follow_up_job_id = fields.String(allow_none=True)
    message = fields.String()


class JobSchema(Schema):
    id = fields.String()
    status = fields.String(validate=validate.OneOf(JOB_STATUSES))
    waiting_for = fields.String(allow_none=True, validate=validate.OneOf(WAITS), metadata={
        "description": "What a job with status `waiting` waits for: its model provider to "
                       "answer again (API.md 1.1), a person's approval of a tool call, or "
                       "its sub-agents (`children`: agents.delegate calls) to end; "
                       "what a `queued` job waits for before its start: its conversation "
                       "(another job of it runs), its batch's admission, or its tenant's "
                       "running-jobs quota. Else null."})
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
    follow_up_job_id = fields.String(allow_none=True)
    parent_job_id = fields.String(allow_none=True, metadata={
        "description": "A sub-agent's parent job (its `agents.delegate` call made this "
                       "job; docs/sub-agents.md); null for a top-level job."})
    children = fields.List(fields.String(), metadata={
        "description": "The ids of the sub-agent jobs this job started (agents.delegate), "
                       "in the order of its calls; empty when none."})
    limits = fields.Nested(LimitsSchema, allow_none=True, metadata={
        "description": "The limits the request asked for, as sent (null: none); "
                       "`limits_applied` has the ones that apply."})
    limits_applied = fields.Nested(AppliedLimitsSchema, allow_none=True, metadata={
        "description": "The limits that apply to this job: for each, the smallest of the "
                       "request's, the persona's and the settings' (null where none sets "
                       "it), fixed when the job is made. Null until its first step for a "
                       "job made without them (before agentq recorded them; a follow-up)."})
    metadata = fields.Dict()
    steering = fields.Nested(SteeringSchema, metadata={
        "description": "Only in the answer to a message that steered this running job "
                       "(on_busy=steer): where the input went (docs/api-events.md)."})


class EventSchema(Schema):
    seq = fields.Integer(required=True)
    type = fields.String(required=True)
    data = fields.Dict(required=True)
    created_at = fields.String(required=True)


class EventPageSchema(Schema):
    data = fields.List(fields.Nested(EventSchema), required=True)
    has_more = fields.Boolean(required=True)


class ApproveRequestSchema(StrictSchema):
    arguments = fields.Dict(keys=fields.String(), load_default=None, allow_none=True,
                            metadata={"description": "Run the call with these arguments "
                                                     "instead (checked against the tool's "
                                                     "schema: 422 if they do not fit)."})


class DenyRequestSchema(StrictSchema):
    reason = fields.String(load_default=None, allow_none=True,
                           validate=validate.Length(max=MAX_REASON_CHARS),
                           metadata={"description": "Told to the model with the denial."})
