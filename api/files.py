"""GET /v1/files/<id>: a stored document's bytes.

A file's name and type come from whoever made it (an attachment's sender, a model's tool
call), and it is served from the API's (and the dashboard's) origin, so:

- the name goes in `Content-Disposition` by werkzeug's RFC 6266/5987 encoding (`filename`
  ASCII, `filename*=UTF-8''…` for any other name), control characters (CR, LF, …) taken out
  first: no name can split the headers or fail the response;
- `X-Content-Type-Options: nosniff` and a CSP that allows nothing (`sandbox`) on every file;
- `inline` only for types a browser shows without running anything (raster images, plain
  text); every other type (HTML, SVG, XML, PDF, …) is an `attachment`.
"""
from __future__ import annotations

import io
import re

from flask import Blueprint, g, send_file

from agentq.db import session_scope
from agentq.errors import NotFound
from agentq.models import FileRecord, Job
from api.auth import can_see, require_key
from api.jobs import parse_uuid
from api.openapi import operation

bp = Blueprint("files", __name__)

INLINE_TYPES = frozenset({"text/plain", "image/png", "image/jpeg", "image/gif",
                          "image/webp"})
"""Shown in the browser (`inline`); anything else is downloaded (`attachment`). Never
text/html nor image/svg+xml (both run scripts)."""
FILE_CSP = "default-src 'none'; sandbox"
"""No script, style, frame or fetch from a file, even one a browser renders."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
FALLBACK_NAME = "file"


def download_name(name: str | None) -> str:
    """The file's name without control characters (CR/LF could split headers)."""
    cleaned = _CONTROL.sub("_", name or "").strip()
    return cleaned or FALLBACK_NAME


def _base_type(mime_type: str | None) -> str:
    return (mime_type or "").split(";", 1)[0].strip().lower()


@bp.get("/v1/files/<file_id>")
@operation(
    "getFile", "A stored file's bytes",
    tags=["files"],
    description="`Content-Disposition` names the file by RFC 6266 (`filename*` in "
                "UTF-8 for a name that is not ASCII; control characters replaced). "
                "`inline` only for plain text and raster images, else `attachment`; "
                "always `X-Content-Type-Options: nosniff` and "
                "`Content-Security-Policy: default-src 'none'; sandbox`.",
    responses={
        200: {"description": "The file, with its own media type when known.",
              "headers": {"Content-Disposition": {"schema": {"type": "string"}}},
              "content": {"application/octet-stream": {
                  "schema": {"type": "string", "format": "binary"}}}},
    },
    errors=(401, 403, 404))
@require_key()
def get_file(file_id: str):
    with session_scope(g.settings) as session:
        record = session.get(FileRecord, parse_uuid(file_id, "file"))
        job = session.get(Job, record.job_id) if record and record.job_id else None
        if record is None or record.tenant_id != g.tenant_id or not can_see(job):
            raise NotFound("file", file_id)
        if record.content is None:
            raise NotFound("file content", file_id)
        content, name = bytes(record.content), record.filename
        base = _base_type(record.mime_type)
    # a type as stored is whatever its sender said: only its base type is sent, and one
    # that is not a plain `type/subtype` is sent as bytes
    mimetype = base if re.fullmatch(r"[a-z0-9!#$&^_.+-]+/[a-z0-9!#$&^_.+-]+", base) \
        else "application/octet-stream"
    response = send_file(io.BytesIO(content), mimetype=mimetype,
                         as_attachment=base not in INLINE_TYPES,
                         download_name=download_name(name), conditional=False, etag=False,
                         max_age=0)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = FILE_CSP
    response.headers["Cache-Control"] = "private, no-store"
    return response
