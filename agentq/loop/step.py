"""One step of a job: the loop's contract, top to bottom.

A job advances by steps, each keyed by (job id, iteration), where `iteration` counts the
model calls already made. `run_step(job_id, k)` does, in order:

  1. claim      compare-and-set on the job row: only if the job is live, still at
                iteration k, and no other step holds its lease. A duplicated or stale
                message claims nothing and does nothing.
  2. start      on the first step: status running, `job_start`, the user's message stored.
  3. collect    if the previous turn ran tools: their results (keyed by tool_use_id) become
                tool_result messages, in call order; a call without a result is answered
                with an error (or, when the sweeper re-drives, dispatched again).
  4. limits     cancel requested → cancelled; k == max_iterations → max_iterations;
                budget used up → budget_exceeded.
  5. context    system prompt + a window of the history (`agentq.loop.context`).
     -- commit; no connection is held while the model thinks --
  6. model      the router's call, with retries and fallbacks.
  7. persist    compare-and-set again (iteration k → k+1, our lease), usage to token_logs
                and the user's monthly count, the reply as messages, then decide:
                  Finish(content)  → the job completes (end_turn)
                  RunTools(calls)  → tool_call rows; the calls go out as a chord whose
                                     callback is step k+1
                  Stop(reason)     → the job ends with that finish_reason
  8. effects    returned to the caller, who dispatches them only after the commit.

A job ends `completed` (end_turn, max_iterations), `failed` (budget_exceeded, error) or
`cancelled`. Nothing here knows Celery: effects are plain values.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import ProviderError
from agentq.llm.pricing import estimate_cost
from agentq.llm.types import LLMReply, ToolSpec
from agentq import replay
from agentq.loop import budget, context
from agentq.loop.decision import (Finish, Limits, RunTools, Stop, check_limits, decide,
                                  remaining_output_budget)
from agentq.loop.effects import Cause, DispatchTools, Effect, NextStep
from agentq.loop.finish import finish_job
from agentq.loop.busy import CANCELLED_TOOL_RESULT, pending_inputs
from agentq.loop.store import EventBuffer, append_messages, recent_messages
from agentq.models import Conversation, Job, Message, Persona, TokenLog, ToolCall, User
from agentq.tools.registry import ToolRegistry

log = logging.getLogger(__name__)

LIVE = ("queued", "running")
EMPTY_ANSWER = "The model gave no answer. Please try again or rephrase."
TOOL_LOST_ERROR = {"code": "tool_task_failed",
                   "message": "The tool task ended without a result (its worker was lost "
                              "or it hit its hard time limit)."}


@dataclass
class _Turn:
    """What the claim transaction hands to the model call."""
    messages: list[dict[str, Any]]
    tools: list[ToolSpec]
    model: str
    max_tokens: int | None
    recorded: LLMReply | None = None
    """A recorded replay's answer for this turn: no provider is called, nothing billed."""


class Stepper:
    def __init__(self, settings: Settings, router, registry: ToolRegistry,
                 sessions: sessionmaker):
        self.settings = settings
        self.router = router
        self.registry = registry
        self.sessions = sessions

    # -- the step ---------------------------------------------------------------------
    def run(self, job_id: str, iteration: int, cause: Cause = "continue") -> list[Effect]:
        owner = uuid.uuid4().hex
        events = EventBuffer()
        with self.sessions() as session, session.begin():
            job = self._claim(session, uuid.UUID(job_id), iteration, owner)
            if job is None:
                log.info("step skipped", extra={"job_id": job_id, "iteration": iteration,
                                                "cause": cause})
                return []
            outcome = self._prepare(session, job, cause, events)
            events.flush(session)
        events.announce()
        if not isinstance(outcome, _Turn):
            return outcome

        try:
            reply = outcome.recorded or self.router.chat(
                outcome.messages, outcome.tools, model=outcome.model,
                max_tokens=outcome.max_tokens)
        except ProviderError as exc:
            return self._fail_provider(job_id, iteration, owner, exc)

        with self.sessions() as session, session.begin():
            effects = self._persist(session, uuid.UUID(job_id), iteration, owner, reply,
                                    outcome, events)
            events.flush(session)
        events.announce()
        return effects

    # -- 1. claim ---------------------------------------------------------------------
    def _claim(self, session: Session, job_id: uuid.UUID, iteration: int,
               owner: str) -> Job | None:
        now = utcnow()
        relax_durability(session)
        return session.execute(
            update(Job).where(
                Job.id == job_id, Job.iteration == iteration, Job.status.in_(LIVE),
                or_(Job.step_lease_until.is_(None), Job.step_lease_until < now))
            .values(step_owner=owner,
                    step_lease_until=now + timedelta(seconds=self.settings.step_deadline_s),
                    last_progress_at=now)
            .returning(Job)
            .execution_options(synchronize_session=False, populate_existing=True)
        ).scalar_one_or_none()

    # -- 2..5 -------------------------------------------------------------------------
    def _prepare(self, session: Session, job: Job, cause: Cause,
                 events: EventBuffer) -> _Turn | list[Effect]:
        now = utcnow()
        user, conversation, persona = session.execute(
            select(User, Conversation, Persona).select_from(User)
            .join(Conversation, Conversation.id == job.conversation_id)
            .outerjoin(Persona, Persona.id == job.persona_id)
            .where(User.id == job.user_id)).one()
        if job.status == "queued":
            job.status, job.started_at = "running", now
            events.add(job.id, "job_start", conversation_id=str(job.conversation_id))
            append_messages(session, conversation.id, job.id,
                            [("user", _user_content(job), None)], now)

        if job.phase == "tools":
            redispatch = self._collect(session, job, conversation, cause, events)
            if redispatch:
                job.step_owner = job.step_lease_until = None
                return [redispatch]

        inputs = pending_inputs(session, job.id) if job.pending_inputs else []
        job.pending_inputs = 0
        if inputs:
            append_messages(session, conversation.id, job.id,
                            [("user", entry.content, None) for entry in inputs], now)
            for entry in inputs:
                entry.consumed_at = now
                events.add(job.id, "steering_injected", input_id=str(entry.id),
                           turn=job.iteration + 1)

        if budget.roll_period(user, now, self.settings.budget_period_days):
            log.info("budget period reset", extra={"user_id": str(user.id)})
        recorded_replay = job.replay_mode == "recorded"  # costs nothing: no budget applies
        limits = Limits(iteration=job.iteration, max_iterations=self.settings.max_iterations,
                        cancel_requested=job.cancel_requested_at is not None,
                        budget_limit=None if recorded_replay else user.token_budget_monthly,
                        budget_used=user.tokens_used_this_month,
                        budget_reset_at=user.budget_reset_at)
        stop = check_limits(limits)
        if stop is not None:
            return self._stop(session, job, stop, events)
        recorded = None
        if recorded_replay:
            recorded = replay.recorded_reply(session, job, job.iteration + 1)
            if recorded is None:
                return self._stop(session, job, Stop(
                    "error", f"The original job made no model call {job.iteration + 1}; "
                             "a recorded replay cannot go further."), events)

        events.add(job.id, "turn_start", turn=job.iteration + 1)
        allowed = self.registry.allowed_modules(persona.allowed_modules if persona else None)
        offered = self.registry.offered(user.permission_level, allowed)
        model = job.model or (persona.default_model if persona else None) or self.settings.model
        if recorded is not None:  # answered from the recording: no context to build
            return _Turn([], self.registry.specs(offered), model, None, recorded)
        system = (persona.system_prompt if persona and persona.system_prompt
                  else self.settings.default_system_prompt)
        messages = context.build(
            system, recent_messages(session, conversation.id,
                                    self.settings.history_max_messages,
                                    conversation.message_seq),
            max_tokens=self.settings.context_max_tokens,
            max_tool_chars=self.settings.tool_result_max_chars)
        max_tokens = remaining_output_budget(
            limits, persona.max_tokens_per_request if persona else None)
        return _Turn(messages, self.registry.specs(offered), model, max_tokens)

    def _collect(self, session: Session, job: Job, conversation: Conversation, cause: Cause,
                 events: EventBuffer) -> DispatchTools | None:
        """Tool results of the last turn → tool_result messages, in call order."""
        calls = session.execute(
            select(ToolCall).where(ToolCall.job_id == job.id,
                                   ToolCall.iteration == job.iteration)
            .order_by(ToolCall.position)).scalars().all()
        pending = [c for c in calls if c.status == "pending"]
        if pending and cause == "sweeper" and job.cancel_requested_at is None:
            log.warning("re-dispatching lost tool calls",
                        extra={"job_id": str(job.id), "count": len(pending)})
            return DispatchTools(str(job.id), job.iteration, tuple(
                (c.tool_use_id, c.queue, self._limit(c.name)) for c in pending))
        now = utcnow()
        cancelled = job.cancel_requested_at is not None
        for call in pending:
            record = CANCELLED_TOOL_RESULT if cancelled else {
                "ok": False, "result": None, "error": TOOL_LOST_ERROR}
            call.status = "cancelled" if cancelled else "failed"
            call.result, call.finished_at = record, now
            events.add(job.id, "tool_execution_end", tool_use_id=call.tool_use_id,
                       name=call.name, ok=False, error=record["error"]["code"])
        append_messages(session, conversation.id, job.id, [
            ("tool_result", json.dumps({"name": c.name, "tool_use_id": c.tool_use_id,
                                        **(c.result or {})}), None)
            for c in calls], now)
        job.phase = "llm"
        if job.replay_mode == "recorded":
            for diverged in replay.divergences(session, job, calls):
                events.add(job.id, "replay_diverged", **diverged)
        events.add(job.id, "turn_end", turn=job.iteration,
                   tool_results=[{"tool_use_id": c.tool_use_id, "name": c.name,
                                  "ok": bool((c.result or {}).get("ok"))} for c in calls])
        return None

    def _limit(self, name: str) -> float:
        return (self.registry.time_limit_for(name) if name in self.registry.tools
                else self.settings.tool_time_limit_s)

    # -- 7. persist -------------------------------------------------------------------
    def _persist(self, session: Session, job_id: uuid.UUID, iteration: int, owner: str,
                 reply: LLMReply, turn: _Turn, events: EventBuffer) -> list[Effect]:
        now = utcnow()
        turn_no = iteration + 1
        charged = turn.recorded is None
        cost = estimate_cost(reply.model, reply.input_tokens, reply.output_tokens) \
            if charged else 0.0
        job = session.execute(
            update(Job).where(Job.id == job_id, Job.iteration == iteration,
                              Job.step_owner == owner, Job.status.in_(LIVE))
            .values(iteration=turn_no, step_owner=None, step_lease_until=None,
                    last_progress_at=now, redrives=0,
                    input_tokens=Job.input_tokens + reply.input_tokens,
                    output_tokens=Job.output_tokens + reply.output_tokens,
                    cost_estimate=Job.cost_estimate + cost)
            .returning(Job)
            .execution_options(synchronize_session=False, populate_existing=True)
        ).scalar_one_or_none()
        if job is None:
            log.warning("step lost its lease; reply discarded",
                        extra={"job_id": str(job_id), "iteration": iteration})
            return []
        tokens = reply.input_tokens + reply.output_tokens
        session.add(TokenLog(user_id=job.user_id, conversation_id=job.conversation_id,
                             job_id=job.id, iteration=turn_no, model=reply.model,
                             input_tokens=reply.input_tokens,
                             output_tokens=reply.output_tokens, cost_estimate=cost,
                             usage_estimated=reply.usage_estimated,
                             reply=reply.to_record(), created_at=now))
        if charged:
            session.execute(update(User).where(User.id == job.user_id).values(
                tokens_used_this_month=User.tokens_used_this_month + tokens))
        events.add(job.id, "message_end", turn=turn_no, role="assistant", model=reply.model,
                   content=reply.content, tool_calls=[c.name for c in reply.tool_calls],
                   input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                   fallback_attempts=list(reply.attempts))

        if job.cancel_requested_at is not None:
            # cancelled while the model was thinking: the call is billed once (above), its
            # tool calls are not run, and the job ends here
            if reply.content:
                append_messages(session, job.conversation_id, job.id,
                                [("assistant", reply.content, reply.model)], now)
            return self._stop(session, job, Stop("cancelled", "The job was cancelled."),
                              events)
        decision = decide(reply, [t.name for t in turn.tools])
        match decision:
            case Finish(content=content):
                append_messages(session, job.conversation_id, job.id,
                                [("assistant", content, reply.model)], now)
                events.add(job.id, "turn_end", turn=turn_no, tool_results=[])
                error = None
                if not content.strip():  # small models do this; the client still reads text
                    content = EMPTY_ANSWER
                    error = {"code": "empty_answer",
                             "message": f"Model {reply.model} answered with no text."}
                return self._end(session, job, "completed", "end_turn", content, error, events)
            case RunTools(calls=calls, content=content):
                return self._plan_tools(session, job, turn_no, reply, calls, content, events,
                                        now)
            case Stop() as stop:
                return self._stop(session, job, stop, events)
            case _:
                raise TypeError(f"unknown decision {decision!r}")

    def _plan_tools(self, session: Session, job: Job, turn_no: int, reply: LLMReply,
                    calls, content: str, events: EventBuffer, now: datetime) -> list[Effect]:
        rows: list[tuple[str, str, str | None]] = []
        if content:
            rows.append(("assistant", content, reply.model))
        dispatch = []
        for position, call in enumerate(calls):
            tool_use_id = _tool_use_id(job.id, turn_no, position)
            queue = (self.registry.queue_for(call.name) if call.name in self.registry.tools
                     else "")
            record = ToolCall(job_id=job.id, iteration=turn_no, position=position,
                              tool_use_id=tool_use_id, provider_call_id=call.provider_call_id,
                              name=call.name, arguments=call.arguments, queue=queue,
                              created_at=now)
            if call.error is not None:
                record.status, record.finished_at = "failed", now
                record.result = {"ok": False, "result": None, "error": call.error}
                events.add(job.id, "tool_execution_end", tool_use_id=tool_use_id,
                           name=call.name, ok=False, error=call.error["code"])
            else:
                dispatch.append((tool_use_id, queue, self._limit(call.name)))
                events.add(job.id, "tool_execution_start", tool_use_id=tool_use_id,
                           name=call.name, arguments=call.arguments, queue=queue)
            session.add(record)
            rows.append(("tool_call", json.dumps({"name": call.name,
                                                  "arguments": call.arguments,
                                                  "tool_use_id": tool_use_id}), reply.model))
        append_messages(session, job.conversation_id, job.id, rows, now)
        job.phase = "tools"
        if dispatch:
            return [DispatchTools(str(job.id), turn_no, tuple(dispatch))]
        return [NextStep(str(job.id), turn_no, "continue")]

    # -- endings ----------------------------------------------------------------------
    def _stop(self, session: Session, job: Job, stop: Stop,
              events: EventBuffer) -> list[Effect]:
        status = {"max_iterations": "completed", "cancelled": "cancelled"}.get(
            stop.reason, "failed")
        content = stop.message
        if stop.reason == "max_iterations":
            content = _last_assistant_text(session, job) or stop.message
        return self._end(session, job, status, stop.reason, content,
                         {"code": stop.reason, "message": stop.message, **stop.details},
                         events)

    def _end(self, session: Session, job: Job, status: str, reason: str, content: str,
             error: dict[str, Any] | None, events: EventBuffer) -> list[Effect]:
        return finish_job(session, job, status, reason, content, error, events)

    def _fail_provider(self, job_id: str, iteration: int, owner: str,
                       exc: ProviderError) -> list[Effect]:
        events = EventBuffer()
        with self.sessions() as session, session.begin():
            job = session.execute(
                select(Job).where(Job.id == uuid.UUID(job_id), Job.iteration == iteration,
                                  Job.step_owner == owner, Job.status.in_(LIVE))
            ).scalar_one_or_none()
            if job is None:
                return []
            log.warning("model call failed", extra={"job_id": job_id, "error": exc.message})
            effects = self._end(session, job, "failed", "error",
                                "The model could not be reached; please try again.",
                                {"code": exc.code, "message": exc.message,
                                 "attempts": exc.attempts}, events)
            events.flush(session)
        events.announce()
        return effects


def relax_durability(session: Session) -> None:
    """This transaction may be lost in a database crash without harm: what it records is
    re-done by the next delivery or the sweeper (a claim, a tool's start). Skipping its
    disk flush saves a sync per step on Postgres."""
    if session.bind.dialect.name == "postgresql":
        session.execute(text("SET LOCAL synchronous_commit = off"))


def fail_job(sessions: sessionmaker, job_id: str, exc: BaseException) -> list[Effect]:
    """A bug in a step ends its job `failed` with a readable error, never a worker."""
    events = EventBuffer()
    with sessions() as session, session.begin():
        job = session.execute(select(Job).where(Job.id == uuid.UUID(job_id),
                                                Job.status.in_(LIVE))).scalar_one_or_none()
        if job is None:
            return []
        effects = finish_job(session, job, "failed", "error",
                             "The job failed with an internal error.",
                             {"code": "internal_error",
                              "message": f"{type(exc).__name__}: {exc}"}, events)
        events.flush(session)
    events.announce()
    return effects


def _tool_use_id(job_id: uuid.UUID, turn: int, position: int) -> str:
    """Stable per (job, turn, position): a duplicated persist cannot make a second call."""
    return "tool_" + uuid.uuid5(job_id, f"{turn}:{position}").hex[:24]


def _user_content(job: Job) -> str:
    return describe_attachments(job.content, job.attachments)


def describe_attachments(content: str, attachments: list[dict]) -> str:
    """The message text with its attachments listed for the model (seed 000)."""
    if not attachments:
        return content
    lines = [content, "", "[Attached files:]"]
    for att in attachments:
        lines.append(f"- {att.get('filename', 'file')} (file_id: {att.get('file_id', '')}, "
                     f"{att.get('size_bytes') or 0} bytes, {att.get('mime_type') or ''})")
    lines.append("Use files.read_document(file_id) to read stored text files.")
    return "\n".join(lines)


def _last_assistant_text(session: Session, job: Job) -> str:
    return session.execute(
        select(Message.content).where(Message.job_id == job.id, Message.role == "assistant")
        .order_by(Message.seq.desc()).limit(1)).scalar_one_or_none() or ""
