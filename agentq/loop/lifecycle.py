"""A job's life, in one place: its states as enums, how it is created, how it ends.

    queued ──claim──▶ running ──▶ completed | failed | cancelled
      │                  │  ▲
      │ waiting_for:     │  │ approved / denied / timed out
      │  conversation    ▼  │
      │  batch         waiting (waiting_for = approval)
      │                running + waiting_for = provider (shown `waiting` by the API)
      └──cancel before start──▶ cancelled

Every job is made by `new_job` (a submission, a batch line, a follow-up of late steering, a
replay) and ended by `end_job`, the one writer of end state: status, finish reason, the
response object, `job_end`, the conversation handed on, the webhook's first delivery row,
the batch advanced. The stop reason maps to the end status by an exhaustive `match`.

The columns stay strings (the API and old rows speak them); the enums are `StrEnum`, so
`job.status == JobStatus.RUNNING` and `job.status = JobStatus.FAILED` work on them.
"""
from __future__ import annotations

import enum
import json
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, assert_never

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.loop.effects import AdmitBatch, JobEnded, NextStep, SendWebhooks
from agentq.models import Conversation, Job, ToolCall
from agentq.tenants import admit_quota_waiters, may_start

if TYPE_CHECKING:
    from agentq.loop.uow import UnitOfWork


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    """For a person's approval of a tool call (waiting_for = approval), holding no worker."""
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Phase(enum.StrEnum):
    LLM = "llm"
    """The next step calls the model."""
    TOOLS = "tools"
    """The turn's tool calls are out; the next step collects their results."""


class WaitingFor(enum.StrEnum):
    CONVERSATION = "conversation"
    """Another job owns the conversation; this one starts when it ends."""
    BATCH = "batch"
    """A batch line not admitted yet (the batch's concurrency is full)."""
    APPROVAL = "approval"
    """A tool call awaits a person (status `waiting`)."""
    PROVIDER = "provider"
    """Every model failed transiently; the step comes back at `provider_next_attempt_at`."""
    CHILDREN = "children"
    """Its sub-agents run (`agents.delegate`; status `waiting`); the last one's end wakes it."""


class ReplayMode(enum.StrEnum):
    LIVE = "live"
    """The model is called again on the original's question."""
    RECORDED = "recorded"
    """The original's replies are played back: no provider, nothing billed."""


class StopReason(enum.StrEnum):
    """Why a job ended (its `finish_reason`)."""
    END_TURN = "end_turn"
    LENGTH = "length"
    """The model's reply was cut at its output limit: an answer, but not a whole one."""
    MAX_ITERATIONS = "max_iterations"
    MAX_TOKENS = "max_tokens"
    MAX_TIME = "max_time"
    BUDGET_EXCEEDED = "budget_exceeded"
    CANCELLED = "cancelled"
    ERROR = "error"
    HOOK = "hook"


LIVE_STATUSES = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
"""A job that may still take a step (the column's values, for queries)."""
EXECUTION_LIMITS = (StopReason.MAX_ITERATIONS, StopReason.MAX_TOKENS, StopReason.MAX_TIME)
"""Stops that end a job `completed` with "[Agent stopped: <reason>]" in its conversation."""


def end_status(reason: StopReason | str) -> JobStatus:
    """The status a job ends in for `reason`: every reason named, none falls through."""
    match StopReason(reason):
        case (StopReason.END_TURN | StopReason.LENGTH | StopReason.MAX_ITERATIONS
              | StopReason.MAX_TOKENS | StopReason.MAX_TIME | StopReason.HOOK):
            return JobStatus.COMPLETED
        case StopReason.BUDGET_EXCEEDED | StopReason.ERROR:
            return JobStatus.FAILED
        case StopReason.CANCELLED:
            return JobStatus.CANCELLED
        case unreachable:
            assert_never(unreachable)


def new_job(*, tenant_id: uuid.UUID, conversation_id: uuid.UUID, user_id: uuid.UUID,
            content: str, now: datetime, persona_id: uuid.UUID | None = None,
            api_key_id: uuid.UUID | None = None, attachments: list[dict] | None = None,
            meta: dict | None = None, callback_url: str | None = None,
            on_busy: str = "queue", model: str | None = None, stream: bool = False,
            limits: dict[str, Any] | None = None,
            waiting_for: WaitingFor | None = None, **extra: Any) -> Job:
    """A queued job's row with every counter at its start (the caller adds it)."""
    waiting = WaitingFor(waiting_for).value if waiting_for is not None else None
    return Job(id=uuid.uuid4(), tenant_id=tenant_id, status=JobStatus.QUEUED.value,
               conversation_id=conversation_id, user_id=user_id, persona_id=persona_id,
               api_key_id=api_key_id, content=content, attachments=attachments or [],
               meta=meta or {}, callback_url=callback_url, on_busy=on_busy, model=model,
               stream=stream, iteration=0, phase=Phase.LLM.value, event_seq=0, redrives=0,
               input_tokens=0, output_tokens=0, cost_estimate=0.0, waiting_for=waiting,
               created_at=now, last_progress_at=now, limits=limits or None, **extra)


SHOWN_BYTES = 2048
"""A tool call's `arguments` and `result` in a job's response are cut at this many bytes
of their JSON (API.md 1.2, "Responses say what was done"); the events keep them whole."""


def response_object(content: str, error: dict[str, Any] | None,
                    calls: list) -> dict[str, Any]:
    """A job's `response`: its answer, the files its tools made, and what each call did:
    its name, arguments, result (or error), status and success."""
    ok_results = [c.result.get("result") for c in calls if tool_succeeded(c)]
    return {"content": content, "files": extract_files(ok_results), "error": error,
            "metadata": {"tool_calls": [_call_shown(c) for c in calls]}}


def _call_shown(call) -> dict[str, Any]:
    """One call as the response lists it: `arguments` and `result` as sent and returned,
    each cut at SHOWN_BYTES of JSON (then a string, and `truncated: true`)."""
    record = call.result or {}
    arguments, cut_arguments = _cut(call.arguments)
    result, cut_result = _cut(record.get("result"))
    return {"name": call.name, "tool_use_id": call.tool_use_id,
            "status": call.status, "success": tool_succeeded(call),
            "arguments": arguments, "result": result, "error": record.get("error"),
            "truncated": cut_arguments or cut_result}


def _cut(value: Any) -> tuple[Any, bool]:
    """`value` whole when it takes at most SHOWN_BYTES (UTF-8; an object or a list: its
    JSON), else its first SHOWN_BYTES as a string (never half a character), and True."""
    if value is None or isinstance(value, (bool, int, float)):
        return value, False
    encoded = (value if isinstance(value, str)
               else json.dumps(value, ensure_ascii=False, default=str)).encode()
    if len(encoded) <= SHOWN_BYTES:
        return value, False
    return encoded[:SHOWN_BYTES].decode("utf-8", "ignore"), True


def tool_succeeded(call) -> bool:
    """A tool result is stored as `{"ok", "result", "error"}` (`ToolResult.to_record`)."""
    return bool(call.result and call.result.get("ok"))


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


_conversations = Conversation.__table__
_CALLS_OF = (select(ToolCall.name, ToolCall.tool_use_id, ToolCall.result,
                    ToolCall.arguments, ToolCall.status)
             .where(ToolCall.job_id == bindparam("job_id"))
             .order_by(ToolCall.iteration, ToolCall.position))
"""A job's calls: the columns its response needs, not the calls' objects."""
_RELEASE = (update(_conversations)
            .where(_conversations.c.id == bindparam("conversation_id"),
                   _conversations.c.active_job_id == bindparam("job_id"))
            # idle from now: the memory digest's clock (agentq.memory_digest)
            .values(active_job_id=None, last_active_at=bindparam(
                "now", type_=_conversations.c.last_active_at.type))
            .returning(_conversations.c.id))
_HAND_ON = (update(_conversations).where(_conversations.c.id == bindparam("conversation_id"))
            .values(active_job_id=bindparam("next_id")))
"""Built once, with bind parameters: a job's end runs them on every job."""


def end_job(uow: "UnitOfWork", job: Job, reason: StopReason | str, content: str,
            error: dict[str, Any] | None) -> None:
    """End a live job: the one writer of end state. In the caller's unit of work: the
    status `end_status(reason)`, the response, the conversation handed to its next job,
    `job_end`, the webhook's first delivery row; after the commit `JobEnded` (and the
    batch's `AdmitBatch`) go out."""
    from agentq.webhooks.outbox import enqueue_job_event
    session = uow.session
    status, reason = end_status(reason).value, StopReason(reason).value
    if any(isinstance(o, ToolCall) for o in (*session.new, *session.dirty)):
        session.flush()  # results stored in this transaction (autoflush may be off)
    calls = session.execute(_CALLS_OF, {"job_id": job.id}).all()
    job.response = response_object(content, error, calls)
    job.status, job.finish_reason = status, reason
    job.finished_at = utcnow()
    job.step_owner = job.step_lease_until = None
    job.error = error["message"] if error else None
    # Lock order, everywhere: a job's row, then conversations, then the rows of jobs that
    # wait for them. A batch's row is only ever locked first, in its own transaction.
    # The conversation is handed on first, so a follow-up made from late steering is named
    # (`steering_deferred`, the job's `follow_up_job_id`) before `job_end` closes streams.
    release_conversation(uow, job)
    admit_quota_waiters(uow, job.tenant_id)  # its place in the tenant's running jobs
    uow.event(job.id, "job_end", status=status, finish_reason=reason,
              **({"follow_up_job_id": str(job.follow_up_job_id)}
                 if job.follow_up_job_id else {}))
    uow.effect(JobEnded(str(job.id), status, reason))
    if job.parent_job_id is not None:  # a sub-agent: its answer is its parent's tool result
        from agentq.agents import child_ended
        child_ended(uow, job)
    delivery = enqueue_job_event(session, job)  # its webhook's first delivery row
    if delivery is not None:
        uow.effect(SendWebhooks((str(delivery.id),)))
    if job.batch_id is not None:
        uow.effect(AdmitBatch(str(job.batch_id)))


def end_unstarted(session: Session, where: tuple, error: dict[str, Any],
                  now: datetime) -> None:
    """Cancel, in one statement, jobs that never started and hold nothing: a cancelled
    batch's lines not admitted yet (thousands at once). They hold no conversation and have
    no webhook (the caller ends those with `end_job`), so no event or effect is due."""
    session.execute(update(Job).where(*where)
                    .values(status=JobStatus.CANCELLED.value,
                            finish_reason=StopReason.CANCELLED.value, finished_at=now,
                            waiting_for=None, error=error["message"],
                            response=response_object("", error, []))
                    .execution_options(synchronize_session=False))


def release_conversation(uow: "UnitOfWork", job: Job) -> None:
    """The ended job's conversation goes to the next waiting job; steering that arrived
    too late for the job's last turn becomes a follow-up job first."""
    from agentq.loop.busy import next_waiting, pending_inputs
    from agentq.loop.store import sync_loaded
    session = uow.session
    # one statement checks that the job holds its conversation, locks the row and lets go
    # of it (a job that never held it locks nothing)
    now = utcnow()
    released = session.execute(_RELEASE, {"conversation_id": job.conversation_id,
                                          "job_id": job.id, "now": now}).scalar_one_or_none()
    if released is None:
        return
    sync_loaded(session, Conversation, job.conversation_id, active_job_id=None,
                last_active_at=now)
    late = pending_inputs(session, job.id) if job.pending_inputs else []
    if late:
        follow_up = new_job(tenant_id=job.tenant_id, conversation_id=job.conversation_id,
                            user_id=job.user_id, persona_id=job.persona_id,
                            api_key_id=job.api_key_id,
                            content="\n\n".join(i.content for i in late),
                            meta={"follow_up_of": str(job.id)},
                            callback_url=job.callback_url, model=job.model, now=now,
                            waiting_for=WaitingFor.CONVERSATION)
        session.add(follow_up)
        job.follow_up_job_id = follow_up.id
        for entry in late:
            entry.consumed_at = now
        uow.event(job.id, "steering_deferred", follow_up_job_id=str(follow_up.id),
                  inputs=len(late), input_ids=[str(i.id) for i in late])
        session.flush()
    nxt = next_waiting(session, job.conversation_id)
    if nxt is None:
        return
    nxt.waiting_for = None
    nxt.last_progress_at = now
    session.execute(_HAND_ON, {"conversation_id": job.conversation_id, "next_id": nxt.id})
    sync_loaded(session, Conversation, job.conversation_id, active_job_id=nxt.id)
    if may_start(session, nxt):  # else it holds the conversation, waiting for the quota
        uow.effect(NextStep(str(nxt.id), 0, "start"))
