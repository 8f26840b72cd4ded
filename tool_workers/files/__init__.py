"""Documents stored in the database, served at GET /v1/files/<id>."""
from __future__ import annotations

import re
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from agentq.errors import ToolError
from agentq.models import FileRecord, Job
from agentq.tools.manifest import ToolContext, define_module

MAX_DOCUMENT_BYTES = 1_000_000
FILE_ID_NAMESPACE = uuid.UUID("5b0f3e2a-9c1d-4f57-8a43-2f1d7c6e0b19")
"""A document's id is uuid5(this, tool_use_id): one file per tool call."""
READ_MAX_CHARS = 100_000
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
    # at-least-once: a re-run of the same call (same tool_use_id) writes the same file once
    file_id = uuid.uuid5(FILE_ID_NAMESPACE, ctx.tool_use_id)
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


def read_document(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    try:
        file_id = uuid.UUID(args["file_id"])
    except ValueError:
        raise FileToolError(f"file_id {args['file_id']!r} is not a UUID") from None
    if ctx.session_factory is None:
        raise ToolError("files tools need a database session")
    with ctx.session_factory() as session:
        record = session.get(FileRecord, file_id)
        # users belong to one tenant: this user's files are in the job's tenant
        if record is None or record.user_id is None or str(record.user_id) != ctx.user_id:
            raise FileToolError(f"no file {file_id} belongs to this user")
        if record.content is None:
            raise FileToolError(f"file {record.filename} has no stored content "
                                f"(it is at {record.public_url or 'an external address'})")
        text = record.content.decode("utf-8", errors="replace")
    truncated = len(text) > READ_MAX_CHARS
    return {"file_id": str(file_id), "filename": record.filename,
            "content": text[:READ_MAX_CHARS], "truncated": truncated}


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
         "time_limit_s": 10},
        {"name": "files.read_document",
         "description": "Read a stored text document by its file_id.",
         "parameters": {
             "type": "object",
             "properties": {"file_id": {"type": "string", "description": "The file's id."}},
             "required": ["file_id"],
             "additionalProperties": False,
         },
         "permission": "guest",
         "function": read_document,
         "time_limit_s": 10},
    ],
})
