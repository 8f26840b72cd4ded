"""What the sync and async clients share: typed results, typed errors, how each call is made
into a request and how each answer is read. No I/O here; `AgentQ` and `AsyncAgentQ` only send.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

from agentq.loop.states import BATCH_ENDED, ENDED_STATUSES

ENDED = frozenset(ENDED_STATUSES)
MAX_WAIT_S = 60  # API.md: ?wait=S, 0-60
RETRY_STATUSES = frozenset({502, 503, 504})


# --- errors -------------------------------------------------------------------------------
class AgentQError(Exception):
    """Anything the client raises."""


class ApiError(AgentQError):
    """The API answered with an error (API.md's error shape; an answer not in that shape,
    from a proxy say, has the code `http_error` and its body's start as the message).
    `method` and `path`: the request it answers."""

    def __init__(self, status: int, code: str, message: str, details: Mapping | None = None,
                 retry_after: float | None = None, method: str | None = None,
                 path: str | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.details = dict(details or {})
        self.retry_after = retry_after
        self.method, self.path = method, path


class NotFound(ApiError):
    """404: absent, or another tenant's (the API does not say which)."""


class Conflict(ApiError):
    """409: e.g. cancelling a job that has ended."""


class Unavailable(ApiError):
    """503: the database or the broker is away; `retry_after` says when to try again."""


class TransportError(AgentQError):
    """The API could not be reached, or the connection broke."""


class Timeout(AgentQError):
    """`wait` gave up before the job ended; the job goes on."""

    def __init__(self, job: "Job"):
        super().__init__(f"job {job.id} still {job.status}")
        self.job = job


class WebhookVerificationError(AgentQError):
    """A webhook whose signature, timestamp or body does not verify."""


_ERRORS = {404: NotFound, 409: Conflict, 503: Unavailable}


NOT_THE_ERROR_SHAPE = "http_error"


def error_from(status: int, headers: Mapping[str, str], body: bytes,
               method: str | None = None, path: str | None = None) -> ApiError:
    try:
        error = json.loads(body)["error"]
        code, message, details = error["code"], error["message"], error.get("details")
    except (ValueError, KeyError, TypeError):
        code, message = NOT_THE_ERROR_SHAPE, body[:500].decode("utf-8", "replace")
        details = None
    return _ERRORS.get(status, ApiError)(status, code, message, details,
                                         retry_after_s(headers), method, path)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    raw = headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


# --- typed results ------------------------------------------------------------------------
def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    cost_estimate: float


@dataclass(frozen=True)
class File:
    filename: str
    url: str


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a job's response (API.md 1.2): `arguments` and `result` are cut at
    2 KB (then a string, and `truncated` is True)."""
    name: str
    success: bool
    tool_use_id: str
    status: str | None = None
    arguments: Any = None
    result: Any = None
    error: dict | None = None
    truncated: bool = False


@dataclass(frozen=True)
class Response:
    content: str | None
    files: list[File]
    error: dict | None
    tool_calls: list[ToolCall]


@dataclass(frozen=True)
class Job:
    """The job object of API.md; `raw` keeps every field as the API sent it."""
    id: str
    status: str
    finish_reason: str | None
    conversation_id: str
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    iterations: int
    usage: Usage
    response: Response | None
    replay_of: str | None
    batch_id: str | None
    metadata: dict
    raw: dict = field(repr=False, compare=False)

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @property
    def content(self) -> str | None:
        return self.response.content if self.response else None

    @classmethod
    def parse(cls, raw: dict) -> "Job":
        response = raw.get("response")
        if response is not None:
            calls = ((response.get("metadata") or {}).get("tool_calls")) or []
            response = Response(
                content=response.get("content"),
                files=[File(f["filename"], f["url"]) for f in response.get("files") or []],
                error=response.get("error"),
                tool_calls=[ToolCall(c["name"], bool(c["success"]), c["tool_use_id"],
                                     c.get("status"), c.get("arguments"), c.get("result"),
                                     c.get("error"), bool(c.get("truncated")))
                            for c in calls])
        usage = raw.get("usage") or {}
        return cls(id=raw["id"], status=raw["status"], finish_reason=raw.get("finish_reason"),
                   conversation_id=raw["conversation_id"],
                   created_at=_time(raw.get("created_at")),
                   started_at=_time(raw.get("started_at")),
                   finished_at=_time(raw.get("finished_at")),
                   iterations=raw.get("iterations") or 0,
                   usage=Usage(usage.get("input_tokens") or 0, usage.get("output_tokens") or 0,
                               float(usage.get("cost_estimate") or 0.0)),
                   response=response, replay_of=raw.get("replay_of"),
                   batch_id=raw.get("batch_id"), metadata=raw.get("metadata") or {}, raw=raw)


@dataclass(frozen=True)
class Event:
    """A job event; `raw` keeps every field as the API sent it."""
    seq: int
    type: str
    data: dict
    created_at: datetime | None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, raw: dict) -> "Event":
        return cls(raw["seq"], raw["type"], raw.get("data") or {},
                   _time(raw.get("created_at")), raw)


@dataclass(frozen=True)
class BatchCounts:
    total: int
    queued: int
    running: int
    completed: int
    failed: int
    cancelled: int


@dataclass(frozen=True)
class Batch:
    id: str
    status: str
    counts: BatchCounts
    created_at: datetime | None
    finished_at: datetime | None
    raw: dict = field(repr=False, compare=False)

    @property
    def ended(self) -> bool:
        return self.status in BATCH_ENDED

    @classmethod
    def parse(cls, raw: dict) -> "Batch":
        c = raw.get("counts") or {}
        counts = BatchCounts(*(int(c.get(k) or 0) for k in
                               ("total", "queued", "running", "completed", "failed",
                                "cancelled")))
        return cls(raw["id"], raw["status"], counts, _time(raw.get("created_at")),
                   _time(raw.get("finished_at")), raw)


@dataclass(frozen=True)
class BatchResult:
    """One line of a batch's results: the job, and where it stood in the request."""
    batch_index: int
    custom_id: str | None
    job: Job


@dataclass(frozen=True)
class Delivery:
    id: str
    event_id: str
    event_type: str
    attempt: int
    status: str
    status_code: int | None
    raw: dict = field(repr=False, compare=False)

    @classmethod
    def parse(cls, raw: dict) -> "Delivery":
        return cls(raw["id"], raw["event_id"], raw["event_type"], raw["attempt"],
                   raw["status"], raw.get("status_code"), raw)


@dataclass(frozen=True)
class WebhookEvent:
    """A verified webhook: `type` is `job.completed|job.failed|job.cancelled|…`."""
    id: str
    type: str
    timestamp: str
    job: Job | None
    data: dict


# --- requests -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One HTTP request, before it is sent. `retry_safe`: sending it twice does no harm (a
    GET, or a POST with an Idempotency-Key), so transport errors and 5xx may retry it."""
    method: str
    path: str
    json: Any = None
    params: dict | None = None
    headers: dict | None = None
    content: bytes | None = None
    retry_safe: bool = False


def message_call(content: str, *, user: str, channel: str, platform: str = "api",
                 thread: str | None = None, server: str | None = None,
                 attachments: Iterable[dict] | None = None, callback_url: str | None = None,
                 on_busy: str | None = None, metadata: dict | None = None,
                 idempotency_key: str | None = None, wait_s: float | None = None,
                 **extra: Any) -> Call:
    body: dict[str, Any] = {"platform": platform, "platform_user_id": user,
                            "platform_channel_id": channel, "content": content}
    optional = {"platform_thread_id": thread, "platform_server_id": server,
                "attachments": list(attachments) if attachments is not None else None,
                "callback_url": callback_url, "on_busy": on_busy, "metadata": metadata}
    body.update({k: v for k, v in optional.items() if v is not None})
    body.update(extra)
    return Call("POST", "/v1/messages", json=body, params=_wait_param(wait_s),
                headers={"Idempotency-Key": idempotency_key} if idempotency_key else None,
                retry_safe=idempotency_key is not None)


def continue_call(conversation_id: str, content: str, *, idempotency_key: str | None = None,
                  **extra: Any) -> Call:
    return Call("POST", "/v1/continue",
                json={"conversation_id": conversation_id, "content": content, **extra},
                headers={"Idempotency-Key": idempotency_key} if idempotency_key else None,
                retry_safe=idempotency_key is not None)


def job_call(job_id: str, wait_s: float | None = None) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}", params=_wait_param(wait_s), retry_safe=True)


def events_call(job_id: str, after: int = 0) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/events", params={"after": after}, retry_safe=True)


def batch_call(requests: Iterable[dict] | bytes, callback_url: str | None = None,
               max_concurrency: int | None = None) -> Call:
    """A batch as JSONL: one request a line (the API takes JSON or JSONL; JSONL streams).
    `requests` as bytes: a JSONL body sent as it is (a file's contents; the API checks each
    line and names the first bad one)."""
    params = {k: v for k, v in (("callback_url", callback_url),
                                ("max_concurrency", max_concurrency)) if v is not None}
    body = (requests if isinstance(requests, bytes)
            else "".join(json.dumps(r) + "\n" for r in requests).encode())
    return Call("POST", "/v1/batches", params=params or None, content=body,
                headers={"Content-Type": "application/x-ndjson"})


def replay_call(job_id: str, mode: str = "recorded", model: str | None = None) -> Call:
    body: dict[str, Any] = {"mode": mode}
    if model:
        body["model"] = model
    return Call("POST", f"/v1/jobs/{job_id}/replay", json=body)


def replay_batch_call(job_ids: Iterable[str] | None, filter: dict | None,
                      mode: str = "recorded", model: str | None = None) -> Call:
    """POST /v1/batches/replay: the given jobs, or those a filter matches, replayed as a
    batch (`202`), with another model (live mode) if given."""
    body: dict[str, Any] = {"mode": mode}
    if model:
        body["model"] = model
    if job_ids is not None:
        body["job_ids"] = list(job_ids)
    if filter is not None:
        body["filter"] = filter
    return Call("POST", "/v1/batches/replay", json=body)


def decision_call(job_id: str, tool_use_id: str, decision: str, body: dict[str, Any]
                  ) -> Call:
    """POST /v1/jobs/<id>/tool_calls/<tool_use_id>/approve|deny (API.md 1.1): `202`."""
    return Call("POST", f"/v1/jobs/{job_id}/tool_calls/{tool_use_id}/{decision}",
                json={k: v for k, v in body.items() if v is not None})


def schedule_call(conversation_id: str, content: str, *, run_at: str | None = None,
                  delay_s: float | None = None, cron: str | None = None,
                  timezone: str | None = None, callback_url: str | None = None,
                  metadata: dict | None = None) -> Call:
    """POST /v1/schedules: exactly one of run_at (ISO 8601 with an offset), delay_s, cron."""
    optional = {"run_at": run_at, "delay_s": delay_s, "cron": cron, "timezone": timezone,
                "callback_url": callback_url, "metadata": metadata}
    return Call("POST", "/v1/schedules", json={
        "conversation_id": conversation_id, "content": content,
        **{k: v for k, v in optional.items() if v is not None}})


def schedules_call(conversation_id: str | None = None, status: str | None = None,
                   limit: int | None = None) -> Call:
    params = {k: v for k, v in (("conversation_id", conversation_id), ("status", status),
                                ("limit", limit)) if v is not None}
    return Call("GET", "/v1/schedules", params=params or None, retry_safe=True)


def sse_items(lines: Iterable[str]) -> Iterable[dict | None]:
    """Server-sent events' data, each parsed as JSON, from an event stream's lines; None for
    each comment (the API's keep-alive, every 15 s)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield json.loads("\n".join(data))
                data = []
        elif line.startswith(":"):
            yield None
        else:
            name, _, value = line.partition(":")
            if name == "data":
                data.append(value[1:] if value.startswith(" ") else value)


def _wait_param(wait_s: float | None) -> dict | None:
    if wait_s is None:
        return None
    return {"wait": int(max(0, min(MAX_WAIT_S, wait_s)))}


def results_lines(lines: Iterable[str]) -> Iterable[BatchResult]:
    for line in lines:
        if line.strip():
            raw = json.loads(line)
            yield BatchResult(raw.get("batch_index"), raw.get("custom_id"), Job.parse(raw))


def parse_webhook(payload: dict, webhook_id: str) -> WebhookEvent:
    data = payload.get("data") or {}
    job = Job.parse(data) if isinstance(data, dict) and "status" in data else None
    return WebhookEvent(webhook_id, payload.get("type", ""), payload.get("timestamp", ""),
                        job, data)
