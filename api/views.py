"""Row → JSON object, exactly as API.md gives it."""
from __future__ import annotations

from typing import Any

from flask import Response, jsonify

from agentq.models import Message

# job_object lives in the library (webhook payloads carry it too); re-exported here.
from agentq.views import _id, _iso, job_object  # noqa: F401

SHORT_ID_CHARS = 8


def short_id(ident: object) -> str:
    """An id as the dashboard shows it: its last 8 hex digits. Row ids are time-ordered
    (agentq.ids, UUIDv7): their first digits are the time they were made, the same for
    rows made within a minute; their last are random."""
    return str(ident)[-SHORT_ID_CHARS:]


def message_object(message: Message) -> dict[str, Any]:
    return {"id": str(message.id), "seq": message.seq, "role": message.role,
            "content": message.content, "job_id": _id(message.job_id),
            "model_used": message.model_used, "created_at": _iso(message.created_at)}


def accepted(body: dict[str, Any], location: str | None = None) -> Response:
    """`202 Accepted` with the object, and where to follow it."""
    response = jsonify(body)
    response.status_code = 202
    if location:
        response.headers["Location"] = location
    return response
