"""Marshmallow schemas per request and response (API.md, to the letter)."""
from __future__ import annotations

import json
import re
from datetime import timezone
from typing import Any

from flask import g, has_app_context
from marshmallow import (
    RAISE,
    Schema,
    ValidationError,
    fields,
    pre_load,
    validate,
    validates,
    validates_schema,
)

from agentq.config import get_settings
from agentq.errors import ValidationFailed
from agentq.loop.approvals import MAX_REASON_CHARS
from agentq.loop.states import (
    BATCH_STATUSES,
    ENDED_STATUSES,
    FINISH_REASONS,
    JOB_STATUSES,
    REPLAY_MODES,
    SCHEDULE_STATUSES_SHOWN,
    WAITS,
    ReplayMode,
)
from agentq.tenants import MAX_QUOTA, QUOTA_NAMES
from agentq.webhooks.urls import FIELD as CALLBACK_FIELD
from agentq.webhooks.urls import check_callback_url

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
                                validate=validate.Range(min=0, max=2**63 - 1))
    minio_key = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=512))


class LimitsSchema(StrictSchema):
    """Per-job execution limits (seed 001); the smaller of these, the persona's and the
    settings' applies."""
    max_iterations = fields.Integer(load_default=None, allow_none=True,
                                    validate=validate.Range(min=1, max=200))
    max_tokens = fields.Integer(load_default=None, allow_none=True,
                                validate=validate.Range(min=1, max=10**12))
    max_seconds = fields.Float(load_default=None, allow_none=True,
                               validate=validate.Range(min=0.1, max=7 * 86400),
                               allow_nan=False)


class AppliedLimitsSchema(Schema):
    """The limits that apply to a job (the job object's `limits_applied`): each the
    smallest of the request's, the persona's and the settings' (the settings' may lie
    outside a request's ranges), null where none sets it."""
    max_iterations = fields.Integer(allow_none=True)
    max_tokens = fields.Integer(allow_none=True)
    max_seconds = fields.Float(allow_none=True)


class _CallbackAndMetadata(StrictSchema):
    """A webhook on the job's end, and metadata echoed back (messages, schedules)."""
    callback_url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    metadata = fields.Dict(keys=fields.String(), load_default=dict)

    @validates("metadata")
    def _metadata_size(self, value: dict[str, Any], **_kw) -> None:
        if len(json.dumps(value)) > MAX_METADATA_BYTES:
            raise ValidationError(f"Must be at most {MAX_METADATA_BYTES} bytes as JSON.")

    @validates("callback_url")
    def _callback_url_allowed(self, value: str | None, **_kw) -> None:
        _callback_allowed(value)


class _DeliveryFields(_CallbackAndMetadata):
    """What a message and a continuation share: its text, delivery and bookkeeping."""
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), _not_blank])
    on_busy = fields.String(load_default="queue", validate=validate.OneOf(ON_BUSY))
    limits = fields.Nested(LimitsSchema, load_default=None, allow_none=True)
    persona_id = fields.UUID(load_default=None, allow_none=True,
                             metadata={"description": "Answer as this persona of the key's "
                                                      "tenant (404 if it has none such)."})
    stream = fields.Boolean(load_default=False, metadata={
        "description": "Stream the model's replies: `message_delta` events on the job's "
                       "event stream (server-sent events) as the text arrives; not stored."})


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
    platform = fields.String(load_default=None, allow_none=True,
                             validate=validate.Length(1, 64), metadata={
                                 "description": "With platform_user_id: the user whose "
                                                "token budget pays (else the key's own "
                                                "user, platform `api_key`)."})
    platform_user_id = fields.String(load_default=None, allow_none=True,
                                     validate=validate.Length(1, 255))

    @validates_schema
    def _user_whole(self, data: dict[str, Any], **_kw) -> None:
        if (data.get("platform") is None) != (data.get("platform_user_id") is None):
            raise ValidationError("Give platform and platform_user_id together, or neither.",
                                  "platform_user_id")


class WebhookSecretSchema(Schema):
    secret = fields.String(required=True, metadata={
        "description": "`whsec_` + base64: shown this once."})


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


class BranchRequestSchema(_CallbackAndMetadata):
    """POST /v1/conversations/<id>/branch: continue from an earlier point with new content."""
    at_message_id = fields.UUID(load_default=None, allow_none=True, metadata={
        "description": "Branch before this message of the conversation: the branch holds "
                       "the messages before it."})
    at_job_id = fields.UUID(load_default=None, allow_none=True, metadata={
        "description": "Branch before this job of the conversation (before its first "
                       "message)."})
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), _not_blank])
    persona_id = fields.UUID(load_default=None, allow_none=True, metadata={
        "description": "Answer as this persona of the key's tenant (404 if it has none "
                       "such); else the conversation's."})
    model = fields.String(load_default=None, allow_none=True, validate=validate.Length(1, 200),
                          metadata={"description": "A non-admin key: the persona's default "
                                                   "model or a configured one."})
    limits = fields.Nested(LimitsSchema, load_default=None, allow_none=True)
    stream = fields.Boolean(load_default=False)

    @validates_schema
    def _one_point(self, data: dict[str, Any], **_kw) -> None:
        if (data.get("at_message_id") is None) == (data.get("at_job_id") is None):
            raise ValidationError("Give exactly one of at_message_id and at_job_id.",
                                  "at_message_id")


class BranchedFromSchema(Schema):
    conversation_id = fields.String(required=True)
    message_id = fields.String(allow_none=True, required=True)


class ConversationSchema(Schema):
    id = fields.String(required=True)
    created_at = fields.String(required=True)
    persona_id = fields.String(allow_none=True, required=True)
    branched_from = fields.Nested(BranchedFromSchema, allow_none=True, required=True, metadata={
        "description": "A branch's source conversation and branch point; null otherwise."})
    active_project = fields.String(allow_none=True, required=True, metadata={
        "description": "The conversation's active project, sent in its context."})


class ConversationUpdateSchema(StrictSchema):
    active_project = fields.String(required=True, allow_none=True,
                                   validate=validate.Length(max=MAX_CONTENT_CHARS), metadata={
                                       "description": "Sent in the context of the "
                                                      "conversation's jobs (null: none)."})


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


class ModuleReadinessSchema(Schema):
    kind = fields.String(required=True)
    status = fields.String(required=True, metadata={"description": "ok, unhealthy, unknown"})
    error = fields.String(allow_none=True)


class BacklogSchema(Schema):
    unclaimed_jobs = fields.Integer(allow_none=True, metadata={
        "description": "Live jobs the sweeper re-drove that no worker has taken yet (they "
                       "wait and are re-driven with backoff; null when unreadable)."})


class MemorySearchSchema(Schema):
    backend = fields.String(required=True, metadata={
        "description": "Where memories are searched, chosen at migration time: `pgvector` "
                       "(HNSW index), `exact_sql` (cosine in Postgres), `in_process` "
                       "(SQLite)."})
    hnsw_dimensions = fields.Integer(allow_none=True, metadata={
        "description": "The embedding dimensions the HNSW index serves (pgvector only)."})


class HealthSchema(Schema):
    status = fields.String(required=True)
    memory_search = fields.Nested(MemorySearchSchema, metadata={
        "description": "GET /health/ready only."})
    modules = fields.Dict(keys=fields.String(), values=fields.Nested(ModuleReadinessSchema),
                          metadata={"description": "GET /health/ready: each external tool "
                                                   "module's health (an unhealthy module's "
                                                   "tools are not offered; agentq stays "
                                                   "ready)."})
    backlog = fields.Nested(BacklogSchema, metadata={"description": "/health/ready only."})


class NotReadySchema(Schema):
    status = fields.String(required=True)
    down = fields.List(fields.String(), required=True)
    memory_search = fields.Nested(MemorySearchSchema)
    backlog = fields.Nested(BacklogSchema)
    error = fields.Nested(ErrorBodySchema, required=True)
    modules = fields.Dict(keys=fields.String(), values=fields.Nested(ModuleReadinessSchema))


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


class QuotasSchema(Schema):
    """A tenant's quotas (API.md 1.2); 0 is no limit."""
    requests_per_second = fields.Integer(required=True, metadata={
        "description": "Requests per second per key (429 `rate_limited` past it)."})
    streams_per_key = fields.Integer(required=True, metadata={
        "description": "Open event streams and `?wait` holds per key (429 past it)."})
    running_jobs = fields.Integer(required=True, metadata={
        "description": "Jobs of the tenant running at once; more stay `queued` with "
                       "`waiting_for: quota`."})
    schedules = fields.Integer(required=True, metadata={
        "description": "Active schedules of the tenant (422 `quota_exceeded` past it)."})
    modules = fields.Integer(required=True, metadata={
        "description": "Tool modules the tenant registered (422 `quota_exceeded` past it)."})
    tool_calls_per_turn = fields.Integer(required=True, metadata={
        "description": "Tool calls one model reply may make; the calls past it get the tool "
                       "error `too_many_tool_calls`."})


QuotasUpdateSchema = StrictSchema.from_dict(
    {name: fields.Integer(strict=True, allow_none=True, validate=validate.Range(0, MAX_QUOTA))
     for name in QUOTA_NAMES}, name="QuotasUpdateSchema")
"""Quotas to set (a whole number, 0 = no limit) or reset to the default (null): any of
agentq.tenants.QUOTA_NAMES."""


class TenantUpdateSchema(StrictSchema):
    quotas = fields.Nested(QuotasUpdateSchema, required=True)


class TenantSchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    created_at = fields.String(required=True)
    quotas = fields.Nested(QuotasSchema, required=True, metadata={
        "description": "Each the tenant's own, or the settings' default."})
    quotas_set = fields.List(fields.String(), required=True, metadata={
        "description": "The quotas an operator set for this tenant (the others are the "
                       "defaults)."})


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
    operator = fields.Boolean(required=True, metadata={
        "description": "An operator key (across tenants; made only on the server)."})
    created_at = fields.String(required=True)
    last_used_at = fields.String(allow_none=True, required=True)
    revoked_at = fields.String(allow_none=True, required=True)


class NewApiKeySchema(ApiKeySchema):
    key = fields.String(required=True, metadata={"description": "The key itself: shown only "
                                                               "in this answer."})


class ApiKeyPageSchema(Schema):
    data = fields.List(fields.Nested(ApiKeySchema), required=True)


class ModuleRequestSchema(StrictSchema):
    """POST /v1/modules: an HTTP module by url, an MCP server by url or command."""
    name = fields.String(required=True, validate=validate.Regexp(
        r"^[a-z][a-z0-9_]{0,30}$", error="Must be a lowercase letter, then up to 30 "
                                          "lowercase letters, digits or underscores."))
    kind = fields.String(load_default="http", validate=validate.OneOf(["http", "mcp"]))
    url = fields.String(validate=validate.Length(1, 2000))
    command = fields.List(fields.String(validate=validate.Length(1, 1000)),
                          validate=validate.Length(1, 50))
    slow = fields.Boolean(load_default=False)
    secret = fields.String(validate=validate.Length(1, 500), load_only=True)
    permission = fields.String(validate=validate.OneOf(["guest", "user", "admin", "owner"]),
                               metadata={"description": "The level a caller needs for its "
                                         "tools (default guest; an HTTP manifest's own wins)."})
    requires_approval = fields.Raw(metadata={
        "description": "true (every call waits for approval) or a list of its tool names.",
        "oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "string"},
                                        "minItems": 1, "maxItems": 200}]})
    timeout_s = fields.Float(validate=validate.Range(min=0.1, max=86400),
                             allow_nan=False,
                             metadata={"description": "Each call's time limit in seconds."})
    is_global = fields.Boolean(data_key="global", load_default=False, metadata={
        "description": "An operator's module offered to every tenant (a tenant admin "
                       "asking gets 403); otherwise the module is the key's tenant's."})


class ModuleToolSchema(Schema):
    name = fields.String(required=True)
    description = fields.String(required=True)
    parameters = fields.Dict(required=True)
    permission = fields.String(required=True)


class ModuleHealthSchema(Schema):
    status = fields.String(required=True)
    error = fields.String(allow_none=True)
    checked_at = fields.Float(allow_none=True)


class ModuleSchema(Schema):
    name = fields.String(required=True)
    kind = fields.String(required=True)
    url = fields.String(allow_none=True)
    command = fields.List(fields.String(), allow_none=True)
    slow = fields.Boolean(required=True)
    local = fields.Boolean(required=True, metadata={
        "description": "Its calls run inside the orchestrator's step, not by chord on its "
                       "queue: an in-process module that declares itself local, named in "
                       "AGENTQ_LOCAL_MODULES (docs/api-modules.md). A registered module "
                       "never is."})
    signed = fields.Boolean(required=True)
    static = fields.Boolean(required=True)
    permission = fields.String(allow_none=True)
    requires_approval = fields.Raw(metadata={"oneOf": [
        {"type": "boolean"}, {"type": "array", "items": {"type": "string"}}]})
    timeout_s = fields.Float(allow_none=True)
    is_global = fields.Boolean(data_key="global", required=True, metadata={
        "description": "Offered to every tenant; else only to the tenant `tenant_id`."})
    tenant_id = fields.String(allow_none=True, required=True)
    health = fields.Nested(ModuleHealthSchema, required=True)
    tools = fields.List(fields.Nested(ModuleToolSchema), required=True)


class ModulePageSchema(Schema):
    data = fields.List(fields.Nested(ModuleSchema), required=True)


# --- admin: personas, users, usage (api/admin.py, agentq/admin.py) -------------------------

MODULE_NAME = validate.Regexp(r"^[a-z][a-z0-9_]{0,30}$", error="Not a module name.")


class SkillSchema(StrictSchema):
    """A named instruction block, sent when all its tools are offered to the job."""
    name = fields.String(required=True, validate=[validate.Length(1, 100), _not_blank])
    instructions = fields.String(required=True,
                                 validate=[validate.Length(1, 20_000), _not_blank])
    tools = fields.List(fields.String(validate=validate.Length(1, 255)), load_default=list,
                        validate=validate.Length(max=50), metadata={
                            "description": "The tools it needs (`module.tool`): the skill "
                                           "is sent only when all of them are offered."})


class PersonaRequestSchema(StrictSchema):
    name = fields.String(required=True, validate=[validate.Length(1, 200), _not_blank])
    platform = fields.String(load_default=None, allow_none=True,
                             validate=validate.Length(1, 64))
    platform_server_id = fields.String(load_default=None, allow_none=True,
                                       validate=validate.Length(1, 255))
    is_default = fields.Boolean(load_default=None, allow_none=True,
                                metadata={"description": "Default: true for a tenant's "
                                                         "first persona."})
    system_prompt = fields.String(load_default=None, allow_none=True,
                                  validate=validate.Length(max=MAX_CONTENT_CHARS))
    allowed_modules = fields.List(fields.String(validate=MODULE_NAME), load_default=None,
                                  allow_none=True, validate=validate.Length(max=100))
    default_model = fields.String(load_default=None, allow_none=True,
                                  validate=validate.Length(1, 200))
    max_tokens_per_request = fields.Integer(load_default=None, allow_none=True,
                                            validate=validate.Range(1, 1_000_000))
    stream = fields.Boolean(load_default=False, metadata={
        "description": "Stream the replies of every job of this persona."})
    limits = fields.Nested(LimitsSchema, load_default=None, allow_none=True, metadata={
        "description": "Limits for every job of this persona (each optional); the smaller of "
                       "the request's, these and the settings' applies."})
    requires_approval = fields.List(
        fields.String(validate=validate.Length(1, 255)), load_default=None, allow_none=True,
        validate=validate.Length(max=100), metadata={
            "description": "Tool names whose calls wait for a person's approval under this "
                           "persona (besides those whose manifest requires it)."})
    bootstrap = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=MAX_CONTENT_CHARS), metadata={
                                  "description": "Context sent after the system prompt."})
    skills = fields.List(fields.Nested(SkillSchema), load_default=None, allow_none=True,
                         validate=validate.Length(max=50))
    tool_docs = fields.Boolean(load_default=False, metadata={
        "description": "Send the offered tools' documentation in the context."})


class PersonaUpdateSchema(PersonaRequestSchema):
    """PATCH: only the fields given change."""
    name = fields.String(validate=[validate.Length(1, 200), _not_blank])
    platform = fields.String(allow_none=True, validate=validate.Length(1, 64))
    platform_server_id = fields.String(allow_none=True, validate=validate.Length(1, 255))
    is_default = fields.Boolean()
    system_prompt = fields.String(allow_none=True,
                                  validate=validate.Length(max=MAX_CONTENT_CHARS))
    allowed_modules = fields.List(fields.String(validate=MODULE_NAME), allow_none=True,
                                  validate=validate.Length(max=100))
    default_model = fields.String(allow_none=True, validate=validate.Length(1, 200))
    max_tokens_per_request = fields.Integer(allow_none=True,
                                            validate=validate.Range(1, 1_000_000))
    stream = fields.Boolean()
    limits = fields.Nested(LimitsSchema, allow_none=True)
    requires_approval = fields.List(fields.String(validate=validate.Length(1, 255)),
                                    allow_none=True, validate=validate.Length(max=100))
    bootstrap = fields.String(allow_none=True, validate=validate.Length(max=MAX_CONTENT_CHARS))
    skills = fields.List(fields.Nested(SkillSchema), allow_none=True,
                         validate=validate.Length(max=50))
    tool_docs = fields.Boolean()


class PersonaSchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    platform = fields.String(allow_none=True, required=True)
    platform_server_id = fields.String(allow_none=True, required=True)
    is_default = fields.Boolean(required=True)
    system_prompt = fields.String(allow_none=True, required=True)
    allowed_modules = fields.List(fields.String(), allow_none=True, required=True)
    default_model = fields.String(allow_none=True, required=True)
    max_tokens_per_request = fields.Integer(allow_none=True, required=True)
    stream = fields.Boolean(required=True)
    limits = fields.Nested(LimitsSchema, allow_none=True, required=True)
    requires_approval = fields.List(fields.String(), allow_none=True, required=True)
    bootstrap = fields.String(allow_none=True, required=True)
    skills = fields.List(fields.Nested(SkillSchema), allow_none=True, required=True)
    tool_docs = fields.Boolean(required=True)
    created_at = fields.String(required=True)


class PersonaPageSchema(Schema):
    data = fields.List(fields.Nested(PersonaSchema), required=True)


class ContextLayersUpdateSchema(StrictSchema):
    """A tenant's default context layers (agentq.loop.layers): only the fields given
    change; null clears one."""
    bootstrap = fields.String(allow_none=True, validate=validate.Length(max=MAX_CONTENT_CHARS),
                              metadata={"description": "Sent after the system prompt of a "
                                                       "job whose persona has no bootstrap "
                                                       "of its own."})
    skills = fields.List(fields.Nested(SkillSchema), allow_none=True,
                         validate=validate.Length(max=50), metadata={
                             "description": "Sent before the persona's own skills, less "
                                            "those the persona names again (names unique)."})

    @validates_schema
    def _something(self, data: dict[str, Any], **_kw) -> None:
        if not data:
            raise ValidationError("Give bootstrap, skills or both.", "_schema")


class ContextLayersSchema(Schema):
    tenant_id = fields.String(required=True)
    bootstrap = fields.String(allow_none=True, required=True)
    skills = fields.List(fields.Nested(SkillSchema), allow_none=True, required=True)


class DeletedSchema(Schema):
    id = fields.String(required=True)
    deleted = fields.Boolean(required=True)


class IdentitySchema(Schema):
    platform = fields.String(required=True)
    platform_user_id = fields.String(required=True)
    platform_username = fields.String(allow_none=True, required=True)


class IdentityRequestSchema(StrictSchema):
    platform = fields.String(required=True, validate=[validate.Length(1, 64), _not_blank])
    platform_user_id = fields.String(required=True,
                                     validate=[validate.Length(1, 255), _not_blank])
    platform_username = fields.String(load_default=None, allow_none=True,
                                      validate=validate.Length(1, 255))


class UserSchema(Schema):
    id = fields.String(required=True)
    display_name = fields.String(allow_none=True, required=True)
    permission_level = fields.String(required=True)
    token_budget_monthly = fields.Integer(allow_none=True, required=True)
    tokens_used_this_month = fields.Integer(required=True)
    budget_reset_at = fields.String(allow_none=True, required=True)
    created_at = fields.String(required=True)
    identities = fields.List(fields.Nested(IdentitySchema), required=True)


class UserPageSchema(Schema):
    data = fields.List(fields.Nested(UserSchema), required=True)


class PeriodUsageSchema(Schema):
    period_start = fields.String(required=True)
    period_end = fields.String(required=True)
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    cost_estimate = fields.Float(required=True)
    calls = fields.Integer(required=True)


class TokenLogSchema(Schema):
    id = fields.String(required=True)
    job_id = fields.String(allow_none=True, required=True)
    conversation_id = fields.String(allow_none=True, required=True)
    model = fields.String(required=True)
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    cost_estimate = fields.Float(required=True)
    created_at = fields.String(required=True)


class UserDetailSchema(UserSchema):
    usage = fields.Nested(PeriodUsageSchema, required=True)
    token_logs = fields.List(fields.Nested(TokenLogSchema), required=True)


class UserUpdateSchema(StrictSchema):
    permission_level = fields.String(validate=validate.OneOf(("guest", "user", "admin",
                                                              "owner")))
    token_budget_monthly = fields.Integer(allow_none=True, strict=True,
                                          validate=validate.Range(0, 10**15),
                                          metadata={"description": "Tokens a budget period; "
                                                                   "null = unlimited."})
    display_name = fields.String(allow_none=True, validate=validate.Length(1, 200))


class UsageRowSchema(Schema):
    key = fields.String(allow_none=True, required=True,
                        metadata={"description": "The user id, persona id or model."})
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    cost_estimate = fields.Float(required=True)
    calls = fields.Integer(required=True)


class UsageReportSchema(Schema):
    group_by = fields.String(required=True)
    since = fields.String(required=True)
    until = fields.String(required=True)
    data = fields.List(fields.Nested(UsageRowSchema), required=True)


# Query strings: each field is a query parameter of the route that loads it (its operation's
# `query`, api/openapi.py), described by its `description`.
PAGE_SIZE = {"description": "Page size."}


class UsageQuerySchema(StrictSchema):
    group_by = fields.String(load_default="user",
                             validate=validate.OneOf(("user", "persona", "model")),
                             metadata={"description": "One row per `user` (id), `persona` "
                                                      "(the job's; null for none) or "
                                                      "`model`."})
    since = fields.AwareDateTime(default_timezone=timezone.utc,
                                 metadata={"description": "From this time (ISO 8601; "
                                                          "default: `until` less the budget "
                                                          "period)."})
    until = fields.AwareDateTime(default_timezone=timezone.utc,
                                 metadata={"description": "Up to this time (ISO 8601; "
                                                          "default: now)."})


class PageQuerySchema(StrictSchema):
    limit = fields.Integer(load_default=100, validate=validate.Range(1, 1000),
                           metadata=PAGE_SIZE)
    offset = fields.Integer(load_default=0, validate=validate.Range(0, 10**9),
                            metadata={"description": "Skip this many."})


# --- schedules (api/schedules.py, agentq/schedules.py) --------------------------------------

class ScheduleRequestSchema(_CallbackAndMetadata):
    conversation_id = fields.UUID(required=True)
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), _not_blank])
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


# --- approvals (api/jobs.py, agentq.loop.approvals) ----------------------------------------------

class ApproveRequestSchema(StrictSchema):
    arguments = fields.Dict(keys=fields.String(), load_default=None, allow_none=True,
                            metadata={"description": "Run the call with these arguments "
                                                     "instead (checked against the tool's "
                                                     "schema: 422 if they do not fit)."})


class DenyRequestSchema(StrictSchema):
    reason = fields.String(load_default=None, allow_none=True,
                           validate=validate.Length(max=MAX_REASON_CHARS),
                           metadata={"description": "Told to the model with the denial."})
