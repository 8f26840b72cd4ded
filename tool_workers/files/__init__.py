"""Documents stored in the database, served at GET /v1/files/<id>."""
from __future__ import annotations

import re
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from agentq import attachments
from agentq.errors import ToolError
from agentq.models import FileRecord, Job
from agentq.tools.manifest import ToolContext, define_module

MAX_DOCUMENT_BYTES = 1_000_000
FILE_ID_NAMESPACE = uuid.UUID("5b0f3e2a-9c1d-4f57-8a43-2f1d7c6e0b19")
"""A document's id is uuid5(this, tool_use_id): one file per tool call."""
READ_MAX_CHARS = 100_000
PAGE_CHARS = 6_000
"""A page of read_document by default: under AGENTQ_TOOL_RESULT_MAX_CHARS' default (8000)
with the result's other fields, so the model reads whole pages."""
FORMATS = {"md": "text/markdown", "txt": "text/plain", "json": "application/json",
           "csv": "text/csv", "html": "text/html"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._ -]+")


class FileToolError(ToolError):
    retryable = False


def _filename(title: str, fmt: str) -> str:
    base = _UNSAFE.sub("_", title).strip(" ._") or "document"
    base = base[:120]
    return base if base.lower().endswith(f".{fmt}") else f"{base}.{fmt}"


def create_document(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    fmt = args.get("format", "md")
    data = args["content"].encode("utf-8")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise FileToolError(f"document is {len(data)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
    if ctx.session_factory is None:
        raise ToolError("files tools need a database session")
    # at-least-once: a re-run of the same call (same idempotency key, its tool_use_id)
    # writes the same file once
    file_id = uuid.uuid5(FILE_ID_NAMESPACE, ctx.idempotency_key)
    filename = _filename(args["title"], fmt)
    url = f"{ctx.public_url}/v1/files/{file_id}"
    try:
        with ctx.session_factory() as session, session.begin():
            if session.get(FileRecord, file_id) is None:
                tenant_id = session.execute(select(Job.tenant_id).where(
                    Job.id == uuid.UUID(ctx.job_id))).scalar_one()
                session.add(FileRecord(id=file_id, tenant_id=tenant_id,
                                       user_id=uuid.UUID(ctx.user_id),
                                       job_id=uuid.UUID(ctx.job_id), filename=filename,
                                       mime_type=FORMATS[fmt], size_bytes=len(data),
                                       content=data, public_url=url))
    except IntegrityError:
        pass  # a concurrent run of this call wrote it
    return {"file_id": str(file_id), "filename": filename, "url": url,
            "size_bytes": len(data)}


def _settings(ctx: ToolContext):
    settings = ctx.extra.get("settings")
    if settings is None:
        from agentq.config import Settings
        settings = Settings.from_env()
    return settings


def read_document(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """A stored or attached file's text, `max_chars` at a time from `offset`; an attachment
    known only by its URL is fetched (SSRF-guarded, size-capped) and stored on first read."""
    if ctx.session_factory is None:
        raise ToolError("files tools need a database session")
    record = attachments.load(ctx.session_factory, _settings(ctx), args["file_id"],
                              ctx.user_id)
    if record.mime_type and not attachments.is_text_type(record.mime_type) \
            and not record.mime_type.startswith("application/octet-stream"):
        raise FileToolError(f"file {record.filename} is {record.mime_type}, not text; "
                            "name it in code.run_python's file_ids to work on it")
    try:
        text = (record.content or b"").decode("utf-8")  # load() returns it stored
    except UnicodeDecodeError:
        raise FileToolError(f"file {record.filename} is not UTF-8 text; name it in "
                            "code.run_python's file_ids to work on it") from None
    offset = int(args.get("offset", 0))
    max_chars = min(int(args.get("max_chars", PAGE_CHARS)), READ_MAX_CHARS)
    if offset > len(text):
        raise FileToolError(f"offset {offset} is past the end ({len(text)} characters)")
    page = text[offset:offset + max_chars]
    end = offset + len(page)
    return {"file_id": str(record.id), "filename": record.filename,
            "mime_type": record.mime_type, "content": page, "offset": offset,
            "total_chars": len(text), "truncated": end < len(text),
            "next_offset": end if end < len(text) else None}


MODULE = define_module({
    "module": "files",
    "description": "Create and read documents stored by agentq.",
    "tools": [
        {"name": "files.create_document",
         "description": "Store a text document and return its file_id, filename and url.",
         "parameters": {
             "type": "object",
             "properties": {
                 "title": {"type": "string", "minLength": 1, "maxLength": 200,
                           "description": "The document's name, without extension."},
                 "content": {"type": "string", "description": "The document's text."},
                 "format": {"type": "string", "enum": sorted(FORMATS),
                            "description": "File format; default md."},
             },
             "required": ["title", "content"],
             "additionalProperties": False,
         },
         "permission": "guest",
         "function": create_document,
         "time_limit_s": 10,
         "idempotent": True},
        {"name": "files.read_document",
         "description": ("Read a stored or attached text file by its file_id, a page at a "
                         "time: pass next_offset back as offset to read on."),
         "parameters": {
             "type": "object",
             "properties": {
                 "file_id": {"type": "string", "description": "The file's id."},
                 "offset": {"type": "integer", "minimum": 0, "default": 0,
                            "description": "Character to start at (default 0)."},
                 "max_chars": {"type": "integer", "minimum": 1, "maximum": READ_MAX_CHARS,
                               "default": PAGE_CHARS,
                               "description": f"Characters to return (default {PAGE_CHARS})."},
             },
             "required": ["file_id"],
             "additionalProperties": False,
         },
         "permission": "guest",
         "function": read_document,
         "time_limit_s": 30,
         "idempotent": True},
    ],
})
