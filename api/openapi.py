"""GET /openapi.json: the OpenAPI 3.1 description of every route, built with apispec and its
marshmallow plugin from what each view says of itself.

Each view carries its operation, next to its route:

    @bp.post("/v1/jobs/<job_id>/replay")
    @operation("replayJob", "Replay a job", tags=["replay"], body=ReplaySchema,
               responses={202: json_response(JobSchema, "The new job.")},
               errors=(401, 403, 404, 409, 415, 422))
    @require_key()
    def replay_job(job_id): ...

Request and response bodies are the marshmallow schemas of api/schemas/ (each a component
named by its class, less `Schema`); error statuses name the shared responses below, in the
error shape of API.md. Path parameters, the statuses any route may answer (400, 431, 413 with
a body, 503 and 429) and the security scheme are added here, once. This module holds no
per-route table.

The spec is built from the app's own url_map: every route the app serves must carry an
operation, or building raises `UndocumentedRoute` (so /openapi.json answers 500 and
tests/integration/test_openapi.py fails, naming the route). A new route ships documented or
not at all. The query parameters an operation names are the only ones its route accepts
(api/limits.py: any other is a 400).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Iterable, Mapping, TypeVar

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Blueprint, Flask, current_app, jsonify
from marshmallow import Schema, fields

from api.schemas.common import ErrorSchema

bp = Blueprint("openapi", __name__)
OPENAPI_VERSION = "3.1.0"
IGNORED_METHODS = {"HEAD", "OPTIONS"}
_lock = threading.Lock()


class UndocumentedRoute(RuntimeError):
    """A route the app serves whose view carries no `@operation`."""


# --- components ---------------------------------------------------------------------------

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

MAX_SEQ = 2**62
"""The largest `seq` a cursor (`after`, `Last-Event-ID`) may name: a seq is a BIGINT, and a
larger number is a 422, never a query that overflows."""

PARAMETERS: dict[str, dict[str, Any]] = {
    "wait": {"in": "query", "name": "wait", "required": False,
             "description": "Hold the answer until the job ends or this many seconds pass; "
                            "then `200` with the job if it ended.",
             "schema": {"type": "number", "minimum": 0, "maximum": 60}},
    "events_after": {"in": "query", "name": "after", "required": False,
                     "description": "Only events with a larger `seq`.",
                     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_SEQ,
                                "default": 0}},
    "messages_after": {"in": "query", "name": "after", "required": False,
                       "description": "Only messages with a larger `seq` (the page's "
                                      "`next_after`).",
                       "schema": {"type": "integer", "minimum": 0, "maximum": MAX_SEQ,
                                  "default": 0}},
    "limit": {"in": "query", "name": "limit", "required": False,
              "description": "Page size.",
              "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}},
    "idempotency_key": {"in": "header", "name": "Idempotency-Key", "required": False,
                        "description": "The same key and body within 24 h returns the first "
                                       "job; the same key with another body is `422`.",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 255}},
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


# --- what a view says of itself ------------------------------------------------------------

SchemaRef = type[Schema] | Schema
V = TypeVar("V", bound=Callable[..., Any])
OPERATION_ATTRIBUTE = "openapi_operation"


@dataclass(frozen=True)
class Operation:
    """One route's OpenAPI operation, as its view declares it (`operation`)."""
    operation_id: str
    summary: str
    tags: tuple[str, ...]
    responses: Mapping[int, Any]
    errors: tuple[int, ...] = ()
    description: str | None = None
    parameters: tuple[str | dict[str, Any], ...] = ()
    body: Any = None
    security: list[Any] | None = None
    query: SchemaRef | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def query_names(self) -> set[str]:
        """The query parameters the route takes (api/limits.py refuses any other)."""
        names = set()
        if self.query is not None:
            schema = self.query() if isinstance(self.query, type) else self.query
            names |= {f.data_key or name for name, f in schema.fields.items()}
        for parameter in self.parameters:
            spec = PARAMETERS[parameter] if isinstance(parameter, str) else parameter
            if spec["in"] == "query":
                names.add(spec["name"])
        return names

    def to_dict(self) -> dict[str, Any]:
        """The operation object, before path parameters and the statuses every route may
        answer are added (build_spec)."""
        document: dict[str, Any] = {"operationId": self.operation_id, "summary": self.summary,
                                    "tags": list(self.tags)}
        if self.description:
            document["description"] = self.description
        if self.security is not None:
            document["security"] = self.security
        parameters = ([{"in": "query", "schema": self.query}] if self.query is not None
                      else []) + list(self.parameters)
        if parameters:  # the marshmallow plugin makes a query schema one parameter a field
            document["parameters"] = parameters
        if self.body is not None:
            document["requestBody"] = (self.body if isinstance(self.body, dict)
                                       else {"required": True, "content": {
                                           "application/json": {"schema": self.body}}})
        document["responses"] = {**{str(s): r for s, r in self.responses.items()},
                                 **_errors(*self.errors)}
        return document


def operation(operation_id: str, summary: str, *, tags: Iterable[str],
              responses: Mapping[int, Any], errors: Iterable[int] = (),
              description: str | None = None,
              parameters: Iterable[str | dict[str, Any]] = (),
              body: SchemaRef | dict[str, Any] | None = None,
              query: SchemaRef | None = None,
              security: list[Any] | None = None) -> Callable[[V], V]:
    """Document the view below it (put it right under the route decorator).

    `body`: the request body's marshmallow schema (a required JSON body), or a whole
    requestBody object; `query`: the marshmallow schema the view loads its query string with
    (each field a query parameter, its `description` metadata the parameter's);
    `responses`: its success statuses (`json_response`); `errors`: the error statuses it
    answers, each one of ERROR_STATUSES; `parameters`: names of PARAMETERS or parameter
    objects, for what no schema loads. A name or status not known here fails at import."""
    errors = tuple(errors)
    unknown = [s for s in errors if s not in ERROR_STATUSES]
    if unknown:
        raise ValueError(f"{operation_id}: error statuses {unknown} are not in "
                         f"api/openapi.py's ERROR_STATUSES")
    parameters = tuple(parameters)
    unnamed = [p for p in parameters if isinstance(p, str) and p not in PARAMETERS]
    if unnamed:
        raise ValueError(f"{operation_id}: parameters {unnamed} are not in api/openapi.py's "
                         f"PARAMETERS")
    declared = Operation(operation_id, summary, tuple(tags), dict(responses), errors,
                         description, parameters, body, security, query)

    def document(view: V) -> V:
        setattr(view, OPERATION_ATTRIBUTE, declared)
        return view
    return document


def operation_of(view: Callable[..., Any] | None) -> Operation | None:
    """The operation a view carries, if any."""
    return getattr(view, OPERATION_ATTRIBUTE, None)


def json_response(schema: SchemaRef | dict[str, Any] | str, description: str,
                  **extra: Any) -> dict[str, Any]:
    """A JSON response of this marshmallow schema (`headers`, `links` as OpenAPI has them)."""
    return {"description": description,
            "content": {"application/json": {"schema": schema}}, **extra}


def _errors(*statuses: int) -> dict[str, str]:
    """The responses of these error statuses: each a reference to its ERROR_STATUSES entry."""
    return {str(s): ERROR_STATUSES[s][0] for s in statuses}


def job_links() -> dict[str, Any]:
    """Where a response holding a job leads (its id, its conversation)."""
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


def batch_links() -> dict[str, Any]:
    """Where a response holding a batch leads."""
    by_id = {"batch_id": "$response.body#/id"}
    return {"GetBatch": {"operationId": "getBatch", "parameters": by_id},
            "GetBatchResults": {"operationId": "getBatchResults", "parameters": by_id},
            "CancelBatch": {"operationId": "cancelBatch", "parameters": by_id}}


def submitted_responses(job: SchemaRef) -> dict[int, Any]:
    """POST /v1/messages and /v1/continue: 202 with the job, or 200 with `wait`."""
    headers = {"Location": "Location", "Idempotent-Replayed": "Idempotent-Replayed"}
    return {
        202: json_response(job, "The job, accepted (or the first job of this "
                                "Idempotency-Key).", headers=headers, links=job_links()),
        200: json_response(job, "With `wait`: the job, which ended within the wait.",
                           headers=headers, links=job_links()),
    }


# --- building -------------------------------------------------------------------------------

_RULE_ARG = re.compile(r"<(?:[^<>:]+:)?([^<>]+)>")


def app_routes(app: Flask) -> list[tuple[str, str]]:
    """(method, Flask rule) for every route the app serves (HEAD, OPTIONS aside), but the
    dashboard's HTML pages under /ui (api/ui.py: for browsers, not API clients)."""
    return [(method, rule.rule) for method, rule in _rules(app)]


def _rules(app: Flask) -> list[tuple[str, Any]]:
    found = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.rule.startswith("/ui"):
            continue
        for method in sorted((rule.methods or set()) - IGNORED_METHODS):
            found.append((method, rule))
    return sorted(found, key=lambda mr: (mr[1].rule, mr[0]))


def build_spec(app: Flask) -> dict[str, Any]:
    """The OpenAPI document for `app`; raises UndocumentedRoute if any route's view carries no
    operation (or one view serves several methods: one operation describes one)."""
    rules = _rules(app)
    operations = {(m, r.rule): operation_of(app.view_functions.get(r.endpoint))
                  for m, r in rules}
    missing = [f"{m} {r}" for (m, r), op in operations.items() if op is None]
    shared = sorted({f"{r.rule} ({', '.join(sorted(r.methods - IGNORED_METHODS))})"
                     for _m, r in rules if len(r.methods - IGNORED_METHODS) > 1})
    if missing or shared:
        raise UndocumentedRoute(
            ("routes whose view carries no @operation (api/openapi.py): "
             + ", ".join(missing) if missing else "")
            + ("; " if missing and shared else "")
            + ("views serving several methods, which one @operation cannot describe: "
               + ", ".join(shared) if shared else ""))

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
    for status, (name, description) in ERROR_STATUSES.items():
        spec.components.response(name, {
            "description": description,
            "content": {"application/json": {"schema": ErrorSchema}},
            **({"headers": {"Retry-After": {
                "description": "Seconds to wait before sending the request again.",
                "schema": {"type": "integer"}}}} if status in (429, 503) else {})})
    for name, parameter in PARAMETERS.items():
        spec.components.parameter(name, parameter["in"],
                                  {k: v for k, v in parameter.items() if k != "in"})
    for name, header in HEADERS.items():
        spec.components.header(name, header)

    paths: dict[str, dict[str, Any]] = {}
    for (method, rule), declared in operations.items():
        assert declared is not None
        path = _RULE_ARG.sub(lambda m: "{" + m.group(1) + "}", rule)
        document = declared.to_dict()
        extra = ALWAYS_POSSIBLE + ((413,) if "requestBody" in document else ())
        document["responses"].update(_errors(*extra))
        if path not in ("/health", "/openapi.json"):  # every route that reads a dependency
            document["responses"].setdefault("503", ERROR_STATUSES[503][0])
        if path.startswith("/v1/"):  # every route that takes a key (api/ratelimit.py)
            document["responses"].setdefault("429", ERROR_STATUSES[429][0])
        arguments = _RULE_ARG.findall(rule)
        if arguments:
            document["parameters"] = [
                {"in": "path", "name": arg, "required": True,
                 "description": PATH_PARAMETERS.get(arg, ""),
                 "schema": PATH_SCHEMAS.get(arg, {"type": "string", "format": "uuid"})}
                for arg in arguments] + list(document.get("parameters", []))
        paths.setdefault(path, {})[method.lower()] = document
    for path, path_operations in paths.items():
        spec.path(path=path, operations=path_operations)
    built = spec.to_dict()
    for name in ALWAYS_COMPLETE:
        component = built["components"]["schemas"].get(name)
        if component is not None and "properties" in component:
            component["required"] = [p for p in component["properties"]
                                     if (name, p) not in SOMETIMES]
    return built


SOMETIMES = {("Job", "steering")}
"""Properties of an ALWAYS_COMPLETE object that only some answers carry."""


def _version() -> str:
    try:
        return metadata.version("agentq")
    except metadata.PackageNotFoundError:  # pragma: no cover - not installed
        return "0.0.0"


@bp.get("/openapi.json")
@operation(
    "openapi", "This document",
    tags=["meta"],
    security=[],
    responses={
        200: {"description": "The OpenAPI document.",
              "content": {"application/json": {"schema": {"type": "object"}}}},
    })
def openapi_json():
    with _lock:
        document = current_app.extensions.get("agentq_openapi")
        if document is None:
            document = current_app.extensions["agentq_openapi"] = build_spec(current_app)
    return jsonify(document)
