"""Row → JSON object, exactly as API.md gives it."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from agentq.models import Job, Message


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _id(value) -> str | None:
    return str(value) if value else None


def job_object(job: Job) -> dict[str, Any]:
    return {
        "id": str(job.id),
        "status": job.status,
        "finish_reason": job.finish_reason,
        "conversation_id": str(job.conversation_id),
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "iterations": job.iteration,
        "usage": {"input_tokens": job.input_tokens, "output_tokens": job.output_tokens,
                  "cost_estimate": round(job.cost_estimate or 0.0, 8)},
        "response": job.response,
        "replay_of": _id(job.replay_of),
        "batch_id": _id(job.batch_id),
        "metadata": job.meta or {},
    }


def message_object(message: Message) -> dict[str, Any]:
    return {"id": str(message.id), "seq": message.seq, "role": message.role,
            "content": message.content, "job_id": _id(message.job_id),
            "model_used": message.model_used, "created_at": _iso(message.created_at)}
