"""GET /v1/files/<id>: a stored document's bytes."""
from __future__ import annotations

from flask import Blueprint, Response, g

from agentq.db import session_scope
from agentq.errors import NotFound
from agentq.models import FileRecord, Job
from api.auth import can_see, require_key
from api.jobs import parse_uuid

bp = Blueprint("files", __name__)


@bp.get("/v1/files/<file_id>")
@require_key()
def get_file(file_id: str):
    with session_scope(g.settings) as session:
        record = session.get(FileRecord, parse_uuid(file_id, "file"))
        job = session.get(Job, record.job_id) if record and record.job_id else None
        if record is None or record.tenant_id != g.tenant_id or not can_see(job):
            raise NotFound("file", file_id)
        if record.content is None:
            raise NotFound("file content", file_id)
        response = Response(record.content, mimetype=record.mime_type or
                            "application/octet-stream")
        safe_name = record.filename.replace('"', "")
        response.headers["Content-Disposition"] = f'inline; filename="{safe_name}"'
        return response
