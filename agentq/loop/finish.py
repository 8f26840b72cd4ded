"""Ending a job: its response object (content, files, tool calls, error) and `job_end`."""
from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.loop.store import EventBuffer
from agentq.models import TERMINAL_STATUSES, Job, ToolCall


def extract_files(results: list[Any]) -> list[dict[str, str]]:
    """File URLs in tool results (seed 000): a top-level `url`, or a `files` list."""
    files: list[dict[str, str]] = []
    seen: set[str] = set()

    def add(entry: dict[str, Any]) -> None:
        url = entry.get("url")
        if isinstance(url, str) and url and url not in seen:
            seen.add(url)
            files.append({"filename": str(entry.get("filename") or "file"), "url": url})

    for result in results:
        if not isinstance(result, dict):
            continue
        add(result)
        for entry in result.get("files") or []:
            if isinstance(entry, dict):
                add(entry)
    return files


def finish_job(session: Session, job: Job, status: str, reason: str, content: str,
               error: dict[str, Any] | None, events: EventBuffer) -> None:
    """Set the job's end state and response; the caller's transaction commits it."""
    assert status in TERMINAL_STATUSES, status
    calls = session.execute(
        select(ToolCall).where(ToolCall.job_id == job.id)
        .order_by(ToolCall.iteration, ToolCall.position)).scalars().all()
    ok_results = [(c.result or {}).get("result") for c in calls
                  if c.result and c.result.get("ok")]
    job.response = {
        "content": content,
        "files": extract_files(ok_results),
        "error": error,
        "metadata": {"tool_calls": [
            {"name": c.name, "success": bool(c.result and c.result.get("ok")),
             "tool_use_id": c.tool_use_id} for c in calls]},
    }
    job.status, job.finish_reason = status, reason
    job.finished_at = utcnow()
    job.step_owner = job.step_lease_until = None
    job.error = error["message"] if error else None
    events.add(job.id, "job_end", status=status, finish_reason=reason)
