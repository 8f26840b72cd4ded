"""GET /openapi.json: the OpenAPI 3.1 description of every route, built with apispec from the
marshmallow schemas in api/schemas.py.

The spec is built from the app's own url_map: every route the app serves must have an entry
in OPERATIONS below, or building raises `UndocumentedRoute` (so /openapi.json answers 500 and
tests/integration/test_openapi.py fails, naming the route). A new route ships documented or
not at all. Entries for routes the app does not have (yet) are left out of the spec.
"""
from __future__ import annotations

import re
import threading
from importlib import metadata
from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Blueprint, Flask, current_app, jsonify
from marshmallow import fields, validate

from api import schemas

bp = Blueprint("openapi", __name__)
OPENAPI_VERSION = "3.1.0"
IGNORED_METHODS = {"HEAD", "OPTIONS"}
_lock = threading.Lock()


class UndocumentedRoute(RuntimeError):
    """A route the app serves has no entry in api/openapi.py's OPERATIONS."""


# --- components ---------------------------------------------------------------------------

# Marshmallow schemas registered under these names; nested ones get their own names
# (Attachment, Usage, JobResponse, ...) from the plugin.
SCHEMAS = {
    "MessageRequest": schemas.MessageRequestSchema,
    "ContinueRequest": schemas.ContinueRequestSchema,
    "EmbedRequest": schemas.EmbedRequestSchema,
    "EmbedResponse": schemas.EmbedResponseSchema,
    "Job": schemas.JobSchema,
    "Event": schemas.EventSchema,
    "EventPage": schemas.EventPageSchema,
    "MessagePage": schemas.MessagePageSchema,
    "BranchRequest": schemas.BranchRequestSchema,
    "Conversation": schemas.ConversationSchema,
    "ConversationUpdate": schemas.ConversationUpdateSchema,
    "Delivery": schemas.DeliverySchema,
    "DeliveryPage": schemas.DeliveryPageSchema,
    "Error": schemas.ErrorSchema,
    "Health": schemas.HealthSchema,
    "NotReady": schemas.NotReadySchema,
    "BatchLine": schemas.BatchLineSchema,
    "BatchRequest": None,  # BatchRequestSchema below: the JSON form of POST /v1/batches
    "Batch": schemas.BatchSchema,
    "Replay": schemas.ReplaySchema,
    "ReplayBatch": schemas.ReplayBatchSchema,
    "Compare": schemas.CompareSchema,
    "TenantRequest": schemas.TenantRequestSchema,
    "Tenant": schemas.TenantSchema,
    "TenantPage": schemas.TenantPageSchema,
    "TenantUpdate": schemas.TenantUpdateSchema,
    "KeyRequest": schemas.KeyRequestSchema,
    "ApiKey": schemas.ApiKeySchema,
    "NewApiKey": schemas.NewApiKeySchema,
    "ApiKeyPage": schemas.ApiKeyPageSchema,
    "ModuleRequest": schemas.ModuleRequestSchema,
    "Module": schemas.ModuleSchema,
    "ModulePage": schemas.ModulePageSchema,
    "WebhookSecret": schemas.WebhookSecretSchema,
    "PersonaRequest": schemas.PersonaRequestSchema,
    "PersonaUpdate": schemas.PersonaUpdateSchema,
    "Persona": schemas.PersonaSchema,
    "PersonaPage": schemas.PersonaPageSchema,
    "Deleted": schemas.DeletedSchema,
    "User": schemas.UserSchema,
    "UserPage": schemas.UserPageSchema,
    "UserDetail": schemas.UserDetailSchema,
    "UserUpdate": schemas.UserUpdateSchema,
    "IdentityRequest": schemas.IdentityRequestSchema,
    "UsageReport": schemas.UsageReportSchema,
    "ApproveRequest": schemas.ApproveRequestSchema,
    "DenyRequest": schemas.DenyRequestSchema,
    "ScheduleRequest": schemas.ScheduleRequestSchema,
    "Schedule": schemas.ScheduleSchema,
    "ScheduleDetail": schemas.ScheduleDetailSchema,
    "SchedulePage": schemas.SchedulePageSchema,
}


class BatchRequestSchema(schemas.BatchOptionsSchema):
    """POST /v1/batches as JSON: the batch options and its requests (the view reads them
    apart; this class only documents the body)."""
    requests = fields.List(fields.Nested(schemas.BatchLineSchema), required=True,
                           validate=validate.Length(1, 10_000))


SCHEMAS["BatchRequest"] = BatchRequestSchema

# Objects the API always renders with every key (null where API.md allows it): the spec
# marks all their properties required, so a response missing one breaks conformance.
ALWAYS_COMPLETE = ("Job", "Usage", "JobResponse", "ResponseMetadata", "ToolCallSummary",
                   "FileRef", "Message", "MessagePage", "EmbedResponse", "Error", "ErrorBody",
                   "Batch", "BatchCounts", "Tenant", "Quotas", "TenantPage", "ApiKey",
                   "NewApiKey",
                   "ApiKeyPage", "Persona", "PersonaPage", "Deleted", "User", "UserPage",
                   "UserDetail", "Identity", "PeriodUsage", "TokenLog", "UsageReport",
                   "UsageRow", "Schedule", "ScheduleDetail", "ScheduleFiring", "SchedulePage")

ERROR_STATUSES = {
    400: ("BadRequest", "The request cannot be read: a body that is not JSON or is nested "
                        "too deep, a body, JSONL line or query string that is not UTF-8 "
                        "(`bad_encoding`), or a query parameter the route does not take."),
    401: ("Unauthorized", "A missing or wrong API key."),
    403: ("Forbidden", "The key lacks the scope this route needs."),
    404: ("NotFound", "No such object, or not one this key may see."),
    409: ("Conflict", "The object's state does not allow this."),
    413: ("PayloadTooLarge", "The body is larger than the deployment allows "
                             "(`AGENTQ_MAX_BODY_BYTES`)."),
    415: ("UnsupportedMediaType", "The body is not `application/json`."),
    422: ("ValidationError", "A field, query parameter or header is not valid; "
                             "`details.fields` names each problem."),
    431: ("HeadersTooLarge", "A request header is larger than the deployment allows "
                             "(`AGENTQ_MAX_HEADER_BYTES`)."),
    429: ("RateLimited", "`rate_limited`: the key made more requests a second than its "
                         "tenant's `requests_per_second`, or holds `streams_per_key` event "
                         "streams and `?wait` answers open already (`details.limit` says "
                         "which); nothing was done. `Retry-After` says when to try again."),
    502: ("ProviderFailed", "The model provider failed."),
    503: ("Unavailable", "`unavailable`: the database or the broker cannot be reached for a "
                         "moment; nothing was done. `Retry-After` says when to send the same "
                         "request again (a submit with the same Idempotency-Key creates its "
                         "job once)."),
}
ALWAYS_POSSIBLE = (400, 431)
"""Any route may answer these (an unknown query parameter, an oversize header); a route
with a body may answer 413 too. Added to every operation when the spec is built."""

PARAMETERS: dict[str, dict[str, Any]] = {
    "wait": {"in": "query", "name": "wait", "required": False,
             "description": "Hold the answer until the job ends or this many seconds pass; "
                            "then `200` with the job if it ended.",
             "schema": {"type": "number", "minimum": 0, "maximum": 60}},
    "events_after": {"in": "query", "name": "after", "required": False,
                     "description": "Only events with a larger `seq`.",
                     "schema": {"type": "integer", "minimum": 0, "default": 0}},
    "messages_after": {"in": "query", "name": "after", "required": False,
                       "description": "Only messages with a larger `seq` (the page's "
                                      "`next_after`).",
                       "schema": {"type": "integer", "minimum": 0, "maximum": 2**62,
                                  "default": 0}},
    "limit": {"in": "query", "name": "limit", "required": False,
              "description": "Page size.",
              "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}},
    "idempotency_key": {"in": "header", "name": "Idempotency-Key", "required": False,
                        "description": "The same key and body within 24 h returns the first "
                                       "job; the same key with another body is `422`.",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 255}},
    "offset": {"in": "query", "name": "offset", "required": False,
               "description": "Skip this many.",
               "schema": {"type": "integer", "minimum": 0, "maximum": 10**9, "default": 0}},
    "usage_group_by": {"in": "query", "name": "group_by", "required": False,
                       "description": "One row per `user` (id), `persona` (the job's; null "
                                      "for none) or `model`.",
                       "schema": {"type": "string", "enum": ["user", "persona", "model"],
                                  "default": "user"}},
    "usage_since": {"in": "query", "name": "since", "required": False,
                    "description": "From this time (ISO 8601; default: `until` less the "
                                   "budget period).",
                    "schema": {"type": "string", "format": "date-time"}},
    "usage_until": {"in": "query", "name": "until", "required": False,
                    "description": "Up to this time (ISO 8601; default: now).",
                    "schema": {"type": "string", "format": "date-time"}},
    "schedule_conversation": {"in": "query", "name": "conversation_id", "required": False,
                              "description": "Only this conversation's schedules.",
                              "schema": {"type": "string", "format": "uuid"}},
    "schedule_status": {"in": "query", "name": "status", "required": False,
                        "description": "Only schedules in this status (default: all, "
                                       "cancelled ones too).",
                        "schema": {"type": "string",
                                   "enum": ["active", "done", "cancelled"]}},
    "last_event_id": {"in": "header", "name": "Last-Event-ID", "required": False,
                      "description": "Resume after this `seq` (overrides `after`).",
                      "schema": {"type": "string", "pattern": "^[0-9]+$"}},
}

PATH_PARAMETERS = {
    "job_id": "The job's id.",
    "conversation_id": "The conversation's id.",
    "file_id": "The file's id.",
    "batch_id": "The batch's id.",
    "key_id": "The API key's id.",
    "name": "The tool module's name.",
    "persona_id": "The persona's id.",
    "user_id": "The user's id.",
    "schedule_id": "The schedule's id.",
    "tool_use_id": "The tool call's id (`tool_use_id` in the `approval_required` event).",
}
PATH_SCHEMAS = {"name": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,30}$"},
                "tool_use_id": {"type": "string", "minLength": 1, "maxLength": 64}}
"""Path parameters that are not UUIDs."""

HEADERS = {
    "Location": {"description": "The job's URL, `/v1/jobs/<id>`.",
                 "schema": {"type": "string"}},
    "BatchLocation": {"description": "The batch's URL, `/v1/batches/<id>`.",
                      "schema": {"type": "string"}},
    "Idempotent-Replayed": {"description": "`true` when an earlier request with the same "
                                           "Idempotency-Key made this job.",
                            "schema": {"type": "string", "enum": ["true"]}},
}


# --- operations, keyed by (method, path with `{}` for each path parameter) ----------------

def _json(schema: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": schema}}, **extra}


def _errors(*statuses: int) -> dict[str, str]:
    """The responses of these error statuses: each a reference to its ERROR_STATUSES entry."""
    return {str(s): ERROR_STATUSES[s][0] for s in statuses}


def _body(schema: str) -> dict[str, Any]:
    """A required JSON request body of this schema."""
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _job_links() -> dict[str, Any]:
    by_id = {"job_id": "$response.body#/id"}
    return {
        "GetJob": {"operationId": "getJob", "parameters": by_id},
        "CancelJob": {"operationId": "cancelJob", "parameters": by_id},
        "ListJobEvents": {"operationId": "listJobEvents", "parameters": by_id},
        "ListDeliveries": {"operationId": "listDeliveries", "parameters": by_id},
        "ListConversationMessages": {
            "operationId": "listConversationMessages",
            "parameters": {"conversation_id": "$response.body#/conversation_id"}},
        "ReplayJob": {"operationId": "replayJob", "parameters": by_id},
        "CompareReplay": {"operationId": "compareReplay", "parameters": by_id},
    }


def _batch_links() -> dict[str, Any]:
    by_id = {"batch_id": "$response.body#/id"}
    return {"GetBatch": {"operationId": "getBatch", "parameters": by_id},
            "GetBatchResults": {"operationId": "getBatchResults", "parameters": by_id},
            "CancelBatch": {"operationId": "cancelBatch", "parameters": by_id}}


def _submitted(summary: str, body: str, description: str, errors: tuple[int, ...],
               operation_id: str) -> dict[str, Any]:
    return {
        "operationId": operation_id, "summary": summary, "description": description,
        "tags": ["jobs"],
        "parameters": ["wait", "idempotency_key"],
        "requestBody": _body(body),
        "responses": {
            "202": _json("Job", "The job, accepted (or the first job of this "
                                "Idempotency-Key).",
                         headers={"Location": "Location",
                                  "Idempotent-Replayed": "Idempotent-Replayed"},
                         links=_job_links()),
            "200": _json("Job", "With `wait`: the job, which ended within the wait.",
                         headers={"Location": "Location",
                                  "Idempotent-Replayed": "Idempotent-Replayed"},
                         links=_job_links()),
            **_errors(*errors),
        },
    }


OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/v1/messages"): _submitted(
        "Submit a message", "MessageRequest",
        "An incoming message, run as a job. `on_busy` says what happens when the "
        "conversation already runs a job; `reject` answers `409` naming it. A `persona_id` "
        "that is not one of the key's tenant is `404`.",
        (401, 403, 404, 409, 415, 422), "submitMessage"),
    ("POST", "/v1/continue"): _submitted(
        "Continue a conversation", "ContinueRequest",
        "A message into an existing conversation (background jobs, the scheduler).",
        (401, 403, 404, 409, 415, 422), "continueConversation"),
    ("GET", "/v1/jobs/{}"): {
        "operationId": "getJob", "summary": "Get a job", "tags": ["jobs"],
        "parameters": ["wait"],
        "responses": {"200": _json("Job", "The job object."),
                      **_errors(401, 403, 404, 422)}},
    ("POST", "/v1/jobs/{}/cancel"): {
        "operationId": "cancelJob", "summary": "Cancel a job", "tags": ["jobs"],
        "description": "The job ends `cancelled` at its next step boundary; queued tool "
                       "tasks are revoked. `409` once it has ended.",
        "responses": {"202": _json("Job", "Cancelling; the job object."),
                      **_errors(401, 403, 404, 409)}},
    ("GET", "/v1/jobs/{}/events"): {
        "operationId": "listJobEvents", "summary": "A job's events", "tags": ["jobs"],
        "description": "The job's ordered events. With `Accept: text/event-stream` they "
                       "stream as server-sent events (`id` = seq, `event` = type, `data` = "
                       "the event as JSON) until `job_end`, resuming after `Last-Event-ID`.",
        "parameters": ["events_after", "last_event_id"],
        "responses": {
            "200": {"description": "The events after `after`, oldest first.",
                    "content": {"application/json": {"schema": "EventPage"},
                                "text/event-stream": {"schema": {
                                    "type": "string",
                                    "description": "Server-sent events, one per job "
                                                   "event, with keep-alive comments."}}}},
            **_errors(401, 403, 404, 422)}},
    ("GET", "/v1/jobs/{}/deliveries"): {
        "operationId": "listDeliveries", "summary": "A job's webhook deliveries",
        "tags": ["webhooks"],
        "responses": {"200": _json("DeliveryPage", "Every attempt, oldest first."),
                      **_errors(401, 403, 404)}},
    ("POST", "/v1/jobs/{}/deliveries/redeliver"): {
        "operationId": "redeliver", "summary": "Send a job's webhook event again",
        "tags": ["webhooks"],
        "description": "A new attempt of the same event (same `webhook-id`). `409` when "
                       "the job has not ended, has no `callback_url`, or a delivery is "
                       "pending.",
        "responses": {"202": _json("Delivery", "The new delivery attempt, pending."),
                      **_errors(401, 403, 404, 409)}},
    ("GET", "/v1/conversations/{}/messages"): {
        "operationId": "listConversationMessages", "summary": "A conversation's history",
        "tags": ["conversations"],
        "parameters": ["messages_after", "limit"],
        "responses": {"200": _json("MessagePage", "Stored messages, oldest first."),
                      **_errors(401, 403, 404, 422)}},
    ("GET", "/v1/conversations/{}"): {
        "operationId": "getConversation", "summary": "A conversation",
        "tags": ["conversations"],
        "description": "`branched_from` names a branch's source conversation and the "
                       "source's first message it does not hold.",
        "responses": {"200": _json("Conversation", "The conversation."),
                      **_errors(401, 403, 404)}},
    ("PATCH", "/v1/conversations/{}"): {
        "operationId": "updateConversation", "summary": "Set a conversation's active project",
        "tags": ["conversations"],
        "description": "`active_project` is sent in the context of the conversation's next "
                       "turns (after the persona's system prompt, bootstrap, memories, "
                       "skills and tool documentation); null or blank clears it.",
        "requestBody": _body("ConversationUpdate"),
        "responses": {"200": _json("Conversation", "The conversation."),
                      **_errors(401, 403, 404, 415, 422)}},
    ("POST", "/v1/conversations/{}/branch"): {
        "operationId": "branchConversation", "summary": "Continue from an earlier point",
        "tags": ["conversations"],
        "description": "A job in a new conversation holding a copy of this one's history "
                       "before `at_message_id` (or before `at_job_id`'s first message), "
                       "asking `content`; its first turn's `triggered_by` is `branch`. This "
                       "conversation is not changed. A message or job not in it is `404`; a "
                       "non-admin key's `model` must be the persona's default model or a "
                       "configured one (`422` naming `model` otherwise).",
        "requestBody": _body("BranchRequest"),
        "responses": {"202": _json("Job", "The branch's job.",
                                   headers={"Location": "Location"}, links=_job_links()),
                      **_errors(401, 403, 404, 415, 422)}},
    ("GET", "/v1/files/{}"): {
        "operationId": "getFile", "summary": "A stored file's bytes", "tags": ["files"],
        "description": "`Content-Disposition` names the file by RFC 6266 (`filename*` in "
                       "UTF-8 for a name that is not ASCII; control characters replaced). "
                       "`inline` only for plain text and raster images, else `attachment`; "
                       "always `X-Content-Type-Options: nosniff` and "
                       "`Content-Security-Policy: default-src 'none'; sandbox`.",
        "responses": {
            "200": {"description": "The file, with its own media type when known.",
                    "headers": {"Content-Disposition": {"schema": {"type": "string"}}},
                    "content": {"application/octet-stream": {
                        "schema": {"type": "string", "format": "binary"}}}},
            **_errors(401, 403, 404)}},
    ("POST", "/v1/embed"): {
        "operationId": "embed", "summary": "Embed a text", "tags": ["embeddings"],
        "requestBody": _body("EmbedRequest"),
        "description": "Paid from a user's monthly token budget: the user `platform` + "
                       "`platform_user_id` name, or else the key's own (platform `api_key`). "
                       "A text whose tokens the budget cannot pay is refused `429` "
                       "`budget_exceeded` (`Retry-After`: when the budget resets) and no "
                       "provider is called.",
        "responses": {"200": _json("EmbedResponse", "The embedding."),
                      "429": _json("Error", "`budget_exceeded`: the user's monthly token "
                                            "budget cannot pay for this text.",
                                   headers={"Retry-After": {"schema": {"type": "integer"}}}),
                      **_errors(401, 403, 415, 422, 502)}},
    ("GET", "/health"): {
        "operationId": "health", "summary": "Alive", "tags": ["health"], "security": [],
        "responses": {"200": _json("Health", "`{\"status\": \"ok\"}`.")}},
    ("GET", "/health/ready"): {
        "operationId": "ready", "summary": "Ready: the database and broker answer, the code sandbox works",
        "tags": ["health"], "security": [],
        "responses": {"200": _json("Health", "Ready."),
                      "503": _json("NotReady", "Not ready; `down` names what is down "
                                          "(`database`, `broker`, `sandbox`). "
                                          "`modules`: each tool module's health.")}},
    ("GET", "/metrics"): {
        "operationId": "metrics", "summary": "Prometheus metrics of every process (docs/metrics.md)",
        "tags": ["health"], "security": [],
        "description": "No key unless AGENTQ_METRICS_TOKEN is set; then "
                       "`Authorization: Bearer <token>`.",
        "responses": {"200": {"description": "Prometheus' text exposition format.",
                              "content": {"text/plain": {"schema": {"type": "string"}}}},
                      "401": ERROR_STATUSES[401][0]}},
    ("GET", "/openapi.json"): {
        "operationId": "openapi", "summary": "This document", "tags": ["meta"],
        "security": [],
        "responses": {"200": {"description": "The OpenAPI document.",
                              "content": {"application/json": {"schema": {
                                  "type": "object"}}}}}},
    # --- batches and replay ----------------------------------------------------------------
    ("POST", "/v1/batches"): {
        "operationId": "createBatch", "summary": "Submit a batch", "tags": ["batches"],
        "description": "JSON `{\"requests\": [...], \"callback_url\"?, ...}`, or JSONL "
                       "(`application/x-ndjson`) with one POST /v1/messages body a line and "
                       "the batch options as query parameters. A bad line fails the whole "
                       "batch with `422` naming its line.",
        "parameters": [
            {"in": "query", "name": "callback_url", "required": False,
             "description": "JSONL form only: a webhook on the batch's end.",
             "schema": {"type": "string", "format": "uri"}},
            {"in": "query", "name": "max_concurrency", "required": False,
             "description": "JSONL form only: how many of its jobs run at once.",
             "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": "BatchRequest"},
            "application/x-ndjson": {"schema": {
                "type": "string", "description": "One BatchLine (a POST /v1/messages body, "
                                                 "plus custom_id) a line."}}}},
        "responses": {"202": _json("Batch", "The batch.",
                                   headers={"Location": "BatchLocation"},
                                   links=_batch_links()),
                      **_errors(401, 403, 404, 415, 422)}},
    ("GET", "/v1/batches/{}"): {
        "operationId": "getBatch", "summary": "Get a batch", "tags": ["batches"],
        "responses": {"200": _json("Batch", "The batch."),
                      **_errors(401, 403, 404)}},
    ("GET", "/v1/batches/{}/results"): {
        "operationId": "getBatchResults", "summary": "A batch's ended jobs",
        "tags": ["batches"],
        "responses": {"200": {"description": "One job object (with `custom_id` and "
                                             "`batch_index`) a line, in request order.",
                              "content": {"application/x-ndjson": {"schema": {
                                  "type": "string"}}}},
                      **_errors(401, 403, 404)}},
    ("POST", "/v1/batches/{}/cancel"): {
        "operationId": "cancelBatch", "summary": "Cancel a batch", "tags": ["batches"],
        "responses": {"202": _json("Batch", "Cancelling; the batch."),
                      **_errors(401, 403, 404, 409)}},
    ("POST", "/v1/jobs/{}/replay"): {
        "operationId": "replayJob", "summary": "Replay a job", "tags": ["replay"],
        "description": "`recorded` answers each LLM call from the original's stored replies "
                       "and re-runs the tools; `live` calls the LLM again. `409` until the "
                       "original has ended. A non-admin key's `model` must be the persona's "
                       "default model or a configured one (`422` naming `model` otherwise).",
        "requestBody": _body("Replay"),
        "responses": {"202": _json("Job", "The new job, with `replay_of` set.",
                                   headers={"Location": "Location"}, links=_job_links()),
                      **_errors(401, 403, 404, 409, 415, 422)}},
    ("POST", "/v1/batches/replay"): {
        "operationId": "replayBatch", "summary": "Replay many jobs as a batch",
        "tags": ["replay"],
        "description": "A non-admin key's `model` must be each persona's default model or a "
                       "configured one (`422` naming `model` otherwise).",
        "requestBody": _body("ReplayBatch"),
        "responses": {"202": _json("Batch", "The batch of replays.",
                                   headers={"Location": "BatchLocation"},
                                   links=_batch_links()),
                      **_errors(401, 403, 404, 409, 415, 422)}},
    ("GET", "/v1/jobs/{}/compare"): {
        "operationId": "compareReplay", "summary": "A replay beside its original",
        "tags": ["replay"],
        "description": "`404` when the job is not a replay.",
        "responses": {"200": _json("Compare", "Answers, tool calls and usage side by side."),
                      **_errors(401, 403, 404)}},
    # --- admin: tenants (operators) and keys (operators: any tenant; tenant admins: their
    # own) -----------------------------------------------------------------------------------
    ("POST", "/v1/admin/tenants"): {
        "operationId": "createTenant", "summary": "Make a tenant", "tags": ["admin"],
        "description": "Operator keys only (a tenant admin gets `403`). `409` when the name "
                       "is taken.",
        "requestBody": _body("TenantRequest"),
        "responses": {"201": _json("Tenant", "The new tenant."),
                      **_errors(401, 403, 409, 415, 422)}},
    ("GET", "/v1/admin/tenants"): {
        "operationId": "listTenants", "summary": "Every tenant", "tags": ["admin"],
        "description": "Operator keys only (a tenant admin gets `403`).",
        "responses": {"200": _json("TenantPage", "Every tenant, oldest first."),
                      **_errors(401, 403)}},
    ("GET", "/v1/admin/tenants/{}"): {
        "operationId": "getTenant", "summary": "A tenant and its quotas", "tags": ["admin"],
        "description": "An operator: any tenant; a tenant admin: its own (another tenant is "
                       "`404`). Each quota is the tenant's own or the settings' default "
                       "(`quotas_set` names those set); 0 is no limit.",
        "responses": {"200": _json("Tenant", "The tenant."),
                      **_errors(401, 403, 404)}},
    ("PATCH", "/v1/admin/tenants/{}"): {
        "operationId": "updateTenant", "summary": "Set a tenant's quotas", "tags": ["admin"],
        "description": "Operator keys only (a tenant admin gets `403`, even for its own "
                       "tenant). Each quota given is set (a whole number 0..1,000,000; 0 is "
                       "no limit) or, with `null`, back to the settings' default "
                       "(`AGENTQ_QUOTA_*`); the others stay.",
        "requestBody": _body("TenantUpdate"),
        "responses": {"200": _json("Tenant", "The tenant, with its quotas now."),
                      **_errors(401, 403, 404, 415, 422)}},
    ("POST", "/v1/admin/keys"): {
        "operationId": "createKey", "summary": "Make an API key of a tenant",
        "tags": ["admin"],
        "description": "Admin keys only. The answer holds the key itself, the only time it "
                       "is shown; only its hash is stored. `admin: true` makes an admin of "
                       "that tenant (never an operator: those are made on the server). A "
                       "tenant admin names only its own tenant: another is `404`.",
        "requestBody": _body("KeyRequest"),
        "responses": {"201": _json("NewApiKey", "The new key, with `key`."),
                      **_errors(401, 403, 404, 415, 422)}},
    ("GET", "/v1/admin/keys"): {
        "operationId": "listKeys", "summary": "Every API key (never the key itself)",
        "tags": ["admin"],
        "description": "An operator: every tenant's keys; a tenant admin: its tenant's.",
        "responses": {"200": _json("ApiKeyPage", "Every key, oldest first."),
                      **_errors(401, 403)}},
    ("POST", "/v1/admin/keys/{}/revoke"): {
        "operationId": "revokeKey", "summary": "Revoke an API key", "tags": ["admin"],
        "description": "From now on the key answers `401`, and its schedules stop firing. "
                       "Another tenant's key is `404` to a tenant admin; an operator's key "
                       "is `403` to it.",
        "responses": {"200": _json("ApiKey", "The key, revoked."),
                      **_errors(401, 403, 404)}},
    # --- tool modules: admin keys only ----------------------------------------------------
    ("GET", "/v1/modules"): {
        "operationId": "listModules", "summary": "Every tool module with its tools and health",
        "tags": ["modules"],
        "description": "Admin keys only. `kind` is `python` (in-process), `http` or `mcp`; "
                       "an unhealthy module's tools are not offered. Secrets are never shown "
                       "(`signed` says whether there is one). A tenant admin sees its "
                       "tenant's modules and the global ones; an operator every one.",
        "responses": {"200": _json("ModulePage", "Every module, python ones first."),
                      **_errors(401, 403)}},
    ("POST", "/v1/modules"): {
        "operationId": "addModule", "summary": "Register an HTTP module or an MCP server",
        "tags": ["modules"],
        "description": "Admin keys only. The module's manifest (`GET <url>/manifest`, or an "
                       "MCP server's tools) is fetched and checked first: `422` with "
                       "`details.fields.manifest` saying what to fix when it is refused; "
                       "`409` when the name is taken. The URL passes the SSRF guard "
                       "(private addresses only with AGENTQ_MODULE_ALLOW_PRIVATE). The "
                       "module is the key's tenant's (offered only to its jobs); "
                       "`global: true` (an operator only, else `403`) offers it to every "
                       "tenant.",
        "requestBody": _body("ModuleRequest"),
        "responses": {"201": _json("Module", "The module, with its tools."),
                      **_errors(401, 403, 409, 415, 422)}},
    ("POST", "/v1/modules/{}/refresh"): {
        "operationId": "refreshModule", "summary": "Fetch a module's manifest now",
        "tags": ["modules"],
        "description": "The manifest is cached again for an hour; a module that does not "
                       "answer is shown unhealthy. `409` for a python module; another "
                       "tenant's module is `404`.",
        "responses": {"200": _json("Module", "The module as it is now."),
                      **_errors(401, 403, 404, 409)}},
    ("DELETE", "/v1/modules/{}"): {
        "operationId": "removeModule", "summary": "Unregister a module",
        "tags": ["modules"],
        "description": "Its tools are no longer offered. `409` for a python module or one "
                       "configured by AGENTQ_TOOL_MODULES; another tenant's module is `404`; "
                       "a global one is removed by an operator only (`403`).",
        "responses": {"204": {"description": "Removed."},
                      **_errors(401, 403, 404, 409)}},
    ("POST", "/v1/admin/keys/{}/rotate"): {
        "operationId": "rotateKey", "summary": "Rotate an API key", "tags": ["admin"],
        "description": "Revokes the key and makes its successor (same name, tenant and "
                       "scope); the answer holds the new key, the only time it is shown. "
                       "`409` when the key is revoked already. Another tenant's key is `404` "
                       "to a tenant admin; an operator's key is `403` to it.",
        "responses": {"201": _json("NewApiKey", "The new key, with `key`."),
                      **_errors(401, 403, 404, 409)}},
    ("POST", "/v1/admin/webhook-secret/rotate"): {
        "operationId": "rotateWebhookSecret", "summary": "A new webhook secret for the "
                                                         "key's tenant",
        "tags": ["webhooks"],
        "description": "Admin keys (a tenant admin or an operator), for the key's own "
                       "tenant. Each tenant signs its webhooks with its own secret "
                       "(`AGENTQ_WEBHOOK_SECRET` is the default tenant's until it rotates; "
                       "another tenant's is generated at its first need and known to no "
                       "one: rotate to get one). The new secret is in this answer only; "
                       "for 24 h the previous one signs too (two `v1,` signatures, "
                       "space-separated).",
        "responses": {"200": _json("WebhookSecret", "The new secret, shown this once."),
                      **_errors(401, 403)}},
    # --- admin: in the admin key's tenant -------------------------------------------------
    ("POST", "/v1/personas"): {
        "operationId": "createPersona", "summary": "Make a persona", "tags": ["admin"],
        "description": "Admin keys only. A tenant's first persona is its default; "
                       "`is_default: true` moves the default here. `allowed_modules` must "
                       "name known tool modules and `requires_approval` known tools "
                       "(`422`).",
        "requestBody": _body("PersonaRequest"),
        "responses": {"201": _json("Persona", "The new persona."),
                      **_errors(401, 403, 415, 422)}},
    ("GET", "/v1/personas"): {
        "operationId": "listPersonas", "summary": "The tenant's personas", "tags": ["admin"],
        "responses": {"200": _json("PersonaPage", "Every persona, oldest first."),
                      **_errors(401, 403)}},
    ("GET", "/v1/personas/{}"): {
        "operationId": "getPersona", "summary": "Get a persona", "tags": ["admin"],
        "responses": {"200": _json("Persona", "The persona."),
                      **_errors(401, 403, 404)}},
    ("PATCH", "/v1/personas/{}"): {
        "operationId": "updatePersona", "summary": "Change a persona", "tags": ["admin"],
        "description": "Only the fields given change. `is_default: false` on the default "
                       "is `409` (make another the default instead).",
        "requestBody": _body("PersonaUpdate"),
        "responses": {"200": _json("Persona", "The persona."),
                      **_errors(401, 403, 404, 409, 415, 422)}},
    ("DELETE", "/v1/personas/{}"): {
        "operationId": "deletePersona", "summary": "Delete a persona", "tags": ["admin"],
        "description": "Conversations and jobs that named it go on with none; if it was the "
                       "default, the oldest remaining persona becomes the default.",
        "responses": {"200": _json("Deleted", "`{\"id\", \"deleted\": true}`."),
                      **_errors(401, 403, 404)}},
    ("GET", "/v1/users"): {
        "operationId": "listUsers", "summary": "The tenant's users", "tags": ["admin"],
        "parameters": ["limit", "offset"],
        "responses": {"200": _json("UserPage", "Users, oldest first, with identities."),
                      **_errors(401, 403, 422)}},
    ("GET", "/v1/users/{}"): {
        "operationId": "getUser", "summary": "A user, their usage and token logs",
        "tags": ["admin"],
        "responses": {"200": _json("UserDetail", "The user, usage this budget period and "
                                                 "the latest token logs."),
                      **_errors(401, 403, 404)}},
    ("PATCH", "/v1/users/{}"): {
        "operationId": "updateUser", "summary": "Set a user's level, budget or name",
        "tags": ["admin"],
        "requestBody": _body("UserUpdate"),
        "responses": {"200": _json("UserDetail", "The user."),
                      **_errors(401, 403, 404, 415, 422)}},
    ("POST", "/v1/users/{}/links"): {
        "operationId": "linkUser", "summary": "Link another platform identity",
        "tags": ["admin"],
        "description": "Messages from this (platform, platform_user_id) are this user's "
                       "from now on. `409` when it is another user's; `200` when it is "
                       "this user's already.",
        "requestBody": _body("IdentityRequest"),
        "responses": {"201": _json("User", "The user, with the new identity."),
                      "200": _json("User", "The user; the identity was linked already."),
                      **_errors(401, 403, 404, 409, 415, 422)}},
    ("GET", "/v1/usage"): {
        "operationId": "usageReport", "summary": "Tokens and cost per user, persona or model",
        "tags": ["admin"],
        "parameters": ["usage_group_by", "usage_since", "usage_until"],
        "responses": {"200": _json("UsageReport", "One row per group, largest cost first."),
                      **_errors(401, 403, 422)}},
    # --- approvals ------------------------------------------------------------------------
    ("POST", "/v1/jobs/{}/tool_calls/{}/approve"): {
        "operationId": "approveToolCall", "summary": "Approve a tool call", "tags": ["jobs"],
        "description": "The call (of a `requires_approval` tool, awaiting approval: the job is "
                       "`waiting`) runs, with `arguments` instead of the model's if given. "
                       "`409` when the call does not await approval.",
        "requestBody": {"required": False,
                        "content": {"application/json": {"schema": "ApproveRequest"}}},
        "responses": {"202": _json("Job", "Approved: the call runs; the job object."),
                      **_errors(401, 403, 404, 409, 415, 422)}},
    ("POST", "/v1/jobs/{}/tool_calls/{}/deny"): {
        "operationId": "denyToolCall", "summary": "Deny a tool call", "tags": ["jobs"],
        "description": "The call does not run; the model reads a `denied` tool error with "
                       "the reason. `409` when the call does not await approval.",
        "requestBody": {"required": False,
                        "content": {"application/json": {"schema": "DenyRequest"}}},
        "responses": {"202": _json("Job", "Denied; the job object."),
                      **_errors(401, 403, 404, 409, 415, 422)}},
    # --- schedules ------------------------------------------------------------------------
    ("POST", "/v1/schedules"): {
        "operationId": "createSchedule", "summary": "Continue a conversation later",
        "tags": ["schedules"],
        "description": "Exactly one of `run_at`, `delay_s` and `cron` (+ `timezone`). Each "
                       "firing is a POST /v1/continue job, made once per tick.",
        "requestBody": _body("ScheduleRequest"),
        "responses": {"201": _json("ScheduleDetail", "The schedule.",
                                   headers={"Location": {"description": "The schedule's "
                                                                        "URL.",
                                                         "schema": {"type": "string"}}}),
                      **_errors(401, 403, 404, 415, 422)}},
    ("GET", "/v1/schedules"): {
        "operationId": "listSchedules", "summary": "Schedules", "tags": ["schedules"],
        "parameters": ["schedule_conversation", "schedule_status", "limit"],
        "responses": {"200": _json("SchedulePage", "Newest first."),
                      **_errors(401, 403, 422)}},
    ("GET", "/v1/schedules/{}"): {
        "operationId": "getSchedule", "summary": "Get a schedule and its firings",
        "tags": ["schedules"],
        "responses": {"200": _json("ScheduleDetail", "The schedule."),
                      **_errors(401, 403, 404)}},
    ("DELETE", "/v1/schedules/{}"): {
        "operationId": "deleteSchedule", "summary": "Cancel a schedule",
        "tags": ["schedules"],
        "description": "It never fires again; it stays readable (GET, the list) with "
                       "`status: cancelled` (a schedule that was done stays `done`) and "
                       "`cancelled_at`. Deleting it again changes nothing (204).",
        "responses": {"204": {"description": "Cancelled; no body."},
                      **_errors(401, 403, 404)}},
}


# --- building -------------------------------------------------------------------------------

_RULE_ARG = re.compile(r"<(?:[^<>:]+:)?([^<>]+)>")


def route_key(method: str, rule: str) -> tuple[str, str]:
    """("GET", "/v1/jobs/<job_id>") → ("GET", "/v1/jobs/{}")."""
    return method, _RULE_ARG.sub("{}", rule)


def app_routes(app: Flask) -> list[tuple[str, str]]:
    """(method, Flask rule) for every route the app serves (HEAD, OPTIONS aside), but the
    dashboard's HTML pages under /ui (api/ui.py: for browsers, not API clients)."""
    found = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.rule.startswith("/ui"):
            continue
        for method in sorted((rule.methods or set()) - IGNORED_METHODS):
            found.append((method, rule.rule))
    return sorted(found, key=lambda mr: (mr[1], mr[0]))


def build_spec(app: Flask) -> dict[str, Any]:
    """The OpenAPI document for `app`; raises UndocumentedRoute if any route lacks an entry."""
    routes = app_routes(app)
    missing = [f"{m} {r}" for m, r in routes if route_key(m, r) not in OPERATIONS]
    if missing:
        raise UndocumentedRoute(
            "routes without an OpenAPI entry in api/openapi.py OPERATIONS: "
            + ", ".join(missing))

    plugin = MarshmallowPlugin()
    spec = APISpec(
        title="agentq", version=_version(), openapi_version=OPENAPI_VERSION,
        plugins=[plugin],
        info={"description": "Durable LLM agent loops as background jobs. Every `/v1/` "
                             "route needs `Authorization: Bearer <api key>`. Errors are "
                             "`{\"error\": {\"code\", \"message\", \"details\"}}`."},
        security=[{"bearerAuth": []}],
    )
    plugin.map_to_openapi_type(fields.Url, "string", "uri")
    spec.components.security_scheme("bearerAuth", {
        "type": "http", "scheme": "bearer",
        "description": "An API key from `agentq keys create NAME [--tenant T] [--admin]` "
                       "or `POST /v1/admin/keys`. A key acts in its tenant only; admin keys "
                       "may also use the /v1/admin/ routes, across tenants."})
    for name, schema in SCHEMAS.items():
        # one nested in a schema registered before it is registered already, under the
        # same name (apispec 6.10 refuses a name twice)
        if name not in spec.components.schemas:
            spec.components.schema(name, schema=schema)
    selected = [(m, r, OPERATIONS[route_key(m, r)]) for m, r in routes]
    for status, (name, description) in ERROR_STATUSES.items():
        spec.components.response(name, {
            "description": description,
            "content": {"application/json": {"schema": "Error"}},
            **({"headers": {"Retry-After": {
                "description": "Seconds to wait before sending the request again.",
                "schema": {"type": "integer"}}}} if status in (429, 503) else {})})
    for name, parameter in PARAMETERS.items():
        spec.components.parameter(name, parameter["in"],
                                  {k: v for k, v in parameter.items() if k != "in"})
    for name, header in HEADERS.items():
        spec.components.header(name, header)

    paths: dict[str, dict[str, Any]] = {}
    for method, rule, operation in selected:
        path = _RULE_ARG.sub(lambda m: "{" + m.group(1) + "}", rule)
        operation = dict(operation)
        extra = ALWAYS_POSSIBLE + ((413,) if "requestBody" in operation else ())
        operation["responses"] = {**operation["responses"],
                                  **_errors(*extra)}
        if path not in ("/health", "/openapi.json"):  # every route that reads a dependency
            operation["responses"].setdefault("503", ERROR_STATUSES[503][0])
        if path.startswith("/v1/"):  # every route that takes a key (api/ratelimit.py)
            operation["responses"].setdefault("429", ERROR_STATUSES[429][0])
        arguments = _RULE_ARG.findall(rule)
        if arguments:
            operation["parameters"] = [
                {"in": "path", "name": arg, "required": True,
                 "description": PATH_PARAMETERS.get(arg, ""),
                 "schema": PATH_SCHEMAS.get(arg, {"type": "string", "format": "uuid"})}
                for arg in arguments] + list(operation.get("parameters", []))
        paths.setdefault(path, {})[method.lower()] = operation
    for path, operations in paths.items():
        spec.path(path=path, operations=operations)
    document = spec.to_dict()
    for name in ALWAYS_COMPLETE:
        component = document["components"]["schemas"].get(name)
        if component is not None and "properties" in component:
            component["required"] = [p for p in component["properties"]
                                     if (name, p) not in SOMETIMES]
    return document


SOMETIMES = {("Job", "steering")}
"""Properties of an ALWAYS_COMPLETE object that only some answers carry."""


def _version() -> str:
    try:
        return metadata.version("agentq")
    except metadata.PackageNotFoundError:  # pragma: no cover - not installed
        return "0.0.0"


@bp.get("/openapi.json")
def openapi_json():
    with _lock:
        document = current_app.extensions.get("agentq_openapi")
        if document is None:
            document = current_app.extensions["agentq_openapi"] = build_spec(current_app)
    return jsonify(document)
