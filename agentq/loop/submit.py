"""A message in: resolve who and where, register attachments, and create the queued job.

The caller commits, then enqueues the first step (`NextStep(job, 0, "start")`): a worker
never reads a job row that is not there yet.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import utcnow
from agentq.loop.identity import (Incoming, resolve_conversation, resolve_persona,
                                  resolve_user)
from agentq.models import FileRecord, Job


@dataclass
class Submission:
    incoming: Incoming
    content: str
    attachments: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    callback_url: str | None = None
    on_busy: str = "queue"
    api_key_id: uuid.UUID | None = None
    model: str | None = None


def create_job(session: Session, settings: Settings, sub: Submission) -> Job:
    now = utcnow()
    user = resolve_user(session, sub.incoming, settings, now)
    persona = resolve_persona(session, sub.incoming)
    conversation = resolve_conversation(session, user, sub.incoming, persona, now)
    attachments = []
    for att in sub.attachments:
        record = FileRecord(id=uuid.uuid4(), user_id=user.id,
                            filename=att.get("filename") or "file",
                            mime_type=att.get("mime_type"), size_bytes=att.get("size_bytes"),
                            minio_key=att.get("minio_key"), public_url=att.get("url"),
                            created_at=now)
        session.add(record)
        attachments.append({**att, "file_id": str(record.id)})
    job = Job(id=uuid.uuid4(), status="queued", conversation_id=conversation.id,
              user_id=user.id, persona_id=persona.id if persona else None,
              api_key_id=sub.api_key_id, content=sub.content, attachments=attachments,
              meta=sub.metadata or {}, callback_url=sub.callback_url, on_busy=sub.on_busy,
              model=sub.model, iteration=0, phase="llm", event_seq=0, redrives=0,
              input_tokens=0, output_tokens=0, cost_estimate=0.0,
              created_at=now, last_progress_at=now)
    session.add(job)
    session.flush()
    return job
