"""Ending a job: its response object (content, files, tool calls, error) and `job_end`."""
from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.loop.busy import lock_conversation, next_waiting, pending_inputs
from agentq.loop.effects import AdmitBatch, Effect, JobEnded, NextStep
from agentq.loop.store import EventBuffer
from agentq.models import TERMINAL_STATUSES, Conversation, Job, ToolCall
from agentq.webhooks.delivery import enqueue_job_event


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
               error: dict[str, Any] | None, events: EventBuffer) -> list[Effect]:
    """Set the job's end state and response, hand its conversation to the next job; the
    caller's transaction commits it and dispatches the returned effects after."""
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
    # Lock order, everywhere: a job's row, then conversations, then the rows of jobs that
    # wait for them. A batch's row is only ever locked first, in its own transaction.
    # The conversation is handed on first, so a follow-up made from late steering is named
    # (`steering_deferred`, the job's `follow_up_job_id`) before `job_end` closes streams.
    handed_on = release_conversation(session, job, events)
    events.add(job.id, "job_end", status=status, finish_reason=reason,
               **({"follow_up_job_id": str(job.follow_up_job_id)}
                  if job.follow_up_job_id else {}))
    enqueue_job_event(session, job)  # its webhook's first delivery, in this transaction
    effects: list[Effect] = [JobEnded(str(job.id), status, reason), *handed_on]
    if job.batch_id is not None:
        effects.append(AdmitBatch(str(job.batch_id)))
    return effects


def release_conversation(session: Session, job: Job, events: EventBuffer) -> list[Effect]:
    """The ended job's conversation goes to the next waiting job; steering that arrived
    too late for the job's last turn becomes a follow-up job first."""
    owner = session.execute(select(Conversation.active_job_id).where(
        Conversation.id == job.conversation_id)).scalar_one()
    if owner != job.id:
        return []  # it never held the conversation: nothing to hand on, nothing to lock
    conversation = lock_conversation(session, job.conversation_id)
    if conversation.active_job_id != job.id:
        return []
    conversation.active_job_id = None
    late = pending_inputs(session, job.id) if job.pending_inputs else []
    now = utcnow()
    if late:
        follow_up = Job(id=uuid.uuid4(), tenant_id=job.tenant_id, status="queued",
                        conversation_id=job.conversation_id,
                        user_id=job.user_id, persona_id=job.persona_id,
                        api_key_id=job.api_key_id,
                        content="\n\n".join(i.content for i in late), attachments=[],
                        meta={"follow_up_of": str(job.id)}, callback_url=job.callback_url,
                        on_busy="queue", model=job.model, iteration=0, phase="llm",
                        event_seq=0, redrives=0, input_tokens=0, output_tokens=0,
                        cost_estimate=0.0, waiting_for="conversation", created_at=now,
                        last_progress_at=now)
        session.add(follow_up)
        job.follow_up_job_id = follow_up.id
        for entry in late:
            entry.consumed_at = now
        events.add(job.id, "steering_deferred", follow_up_job_id=str(follow_up.id),
                   inputs=len(late), input_ids=[str(i.id) for i in late])
        session.flush()
    nxt = next_waiting(session, conversation.id)
    if nxt is None:
        return []
    nxt.waiting_for = None
    nxt.last_progress_at = now
    conversation.active_job_id = nxt.id
    return [NextStep(str(nxt.id), 0, "start")]
