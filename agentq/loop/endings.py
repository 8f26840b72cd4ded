"""How a step ends its turn and its job: stopped by a limit or a hook, finished, cut at the
output limit, cancelled while the model thought, failed by an error (a provider's, an
overflowing context, a bug of ours).

Every ending goes through `end_job` (the one writer of end state), then the `after_loop`
hook; a turn that fails tells `on_error` inside its transaction and `after_turn` after the
commit. What to say is decided by pure functions (`agentq.loop.rules`); this module writes it.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agentq.hooks import Hooks
from agentq.llm.types import LLMReply
from agentq.loop import rules
from agentq.loop.decision import CANCELLED, Stop
from agentq.loop.effects import Effect
from agentq.loop.lifecycle import LIVE_STATUSES, StopReason, end_job
from agentq.loop.store import append_messages
from agentq.loop.turn import Wired, hook_ctx, leased
from agentq.loop.uow import UnitOfWork
from agentq.models import Job, JobEvent, Message

log = logging.getLogger(__name__)


class Endings:
    """The endings of one Stepper's steps (its hooks read from it at each call)."""

    def __init__(self, step: Wired):
        self.step = step

    def stop_turn(self, uow: UnitOfWork, job: Job, turn_no: int, stop: Stop) -> None:
        """The turn ends stopped, no tool run, and the job with it."""
        uow.event(job.id, "turn_end", turn=turn_no, tool_results=[], stopped=stop.reason)
        self.stop(uow, job, stop)

    def stop(self, uow: UnitOfWork, job: Job, stop: Stop) -> None:
        """End the job for `stop`; an execution limit or a hook leaves a note in the
        conversation and answers with the last assistant text."""
        content = stop.message
        if rules.leaves_note(stop.reason):
            content = _last_assistant_text(uow.session, job) or stop.message
            note = f"[Agent stopped: {stop.reason}]"
            append_messages(uow.session, job.conversation_id, job.id, [("user", note, None)])
            uow.event(job.id, "message_start", role="user", kind="limit", content=note)
            uow.event(job.id, "message_end", role="user", kind="limit", content=note)
            uow.event(job.id, "limit_reached" if stop.reason != "hook" else "hook_stopped",
                      reason=stop.reason, message=stop.message, **stop.details)
        self.end(uow, job, stop.reason, content,
                 {"code": stop.reason, "message": stop.message, **stop.details})

    def end(self, uow: UnitOfWork, job: Job, reason: StopReason | str, content: str,
            error: dict[str, Any] | None,
            last: tuple[str, str, str | None] | None = None) -> None:
        """`end_job` (`last`: the job's last message, appended as it ends), then the
        `after_loop` hook: the job ended; the loop's whole usage."""
        end_job(uow, job, reason, content, error, last)
        hooks = self.step.hooks
        if hooks.loaded:
            hooks.after_loop({**hook_ctx(job, job.iteration), "status": job.status,
                              "finish_reason": job.finish_reason, "turns": job.iteration,
                              "usage": {"input_tokens": job.input_tokens,
                                        "output_tokens": job.output_tokens,
                                        "cost_estimate": job.cost_estimate}})

    def finish(self, uow: UnitOfWork, job: Job, turn_no: int, reply: LLMReply,
               content: str) -> None:
        """The model answered without tools: the job completes, its answer stored."""
        uow.event(job.id, "turn_end", turn=turn_no, tool_results=[])
        shown, error = rules.final_answer(content, reply.model)
        self.end(uow, job, StopReason.END_TURN, shown, error,
                 last=("assistant", content, reply.model))

    def cut_short(self, uow: UnitOfWork, job: Job, turn_no: int, reply: LLMReply,
                  content: str, not_run: tuple[str, ...], max_tokens: int | None) -> None:
        """The reply was cut at its output limit: the job ends `completed` with
        finish_reason `length` and the text there is; a cut reply's tool calls are not run
        (the last one's arguments are cut short), and the error says which were dropped."""
        error = rules.cut_short_error(reply.model, max_tokens, reply.output_tokens, not_run)
        uow.event(job.id, "turn_end", turn=turn_no, tool_results=[], stopped="length")
        self.end(uow, job, StopReason.LENGTH, content or error["message"], error,
                 last=("assistant", content, reply.model) if content else None)

    def failed_turn(self, uow: UnitOfWork, job: Job, iteration: int,
                    error: dict[str, Any]) -> dict[str, Any]:
        """The turn ends with `error` (`turn_end`), `on_error` hears it; returns the hook
        context `after_turn` gets after the commit (`after_failed_turn`)."""
        uow.event(job.id, "turn_end", turn=iteration + 1, tool_results=[], error=error)
        failed_ctx = {**hook_ctx(job, iteration + 1), "error": error}
        if self.step.hooks.loaded:
            self.step.hooks.on_error(failed_ctx)
        return failed_ctx

    def after_failed_turn(self, failed_ctx: dict[str, Any] | None) -> None:
        """After the commit of a turn that failed: `after_turn` hears it."""
        if failed_ctx is not None and self.step.hooks.loaded:
            self.step.hooks.after_turn(failed_turn_ctx(failed_ctx))

    def cancelled(self, job_id: str, iteration: int, owner: str) -> list[Effect]:
        """The job was cancelled while its model (or its summary) was asked: the call was
        aborted, or never made; the job ends `cancelled` now."""
        with UnitOfWork(self.step.sessions) as uow:
            job = leased(uow.session, job_id, iteration, owner)
            if job is None:
                return []
            log.info("model call stopped by a cancel", extra={"job_id": job_id})
            self.stop_turn(uow, job, iteration + 1, CANCELLED)
        return uow.sent

    def overflow(self, job_id: str, iteration: int, owner: str, *, tokens: int, budget: int,
                 model: str) -> list[Effect]:
        """Compacted as far as it goes, the context still passes the model's window (a
        huge question, system prompt or last turn): the job fails, saying so."""
        stop = rules.context_overflow(tokens, budget, model)
        error = {"code": "context_overflow", "message": stop.message}
        with UnitOfWork(self.step.sessions) as uow:
            job = leased(uow.session, job_id, iteration, owner)
            if job is None:
                return []
            log.warning("context overflow", extra={"job_id": job_id, "tokens": tokens,
                                                   "budget": budget})
            failed_ctx = self.failed_turn(uow, job, iteration, error)
            self.stop(uow, job, stop)
        self.after_failed_turn(failed_ctx)
        return uow.sent


def fail_job(sessions: sessionmaker[Session], job_id: str, exc: BaseException,
             hooks: Hooks | None = None) -> list[Effect]:
    """A bug in a step ends its job `failed` with a readable error, never a worker. A turn
    that had begun (its `turn_start` is stored) ends with a `turn_end` carrying the error,
    and the hooks hear it: `on_error`, then `after_turn` (after the commit)."""
    error = {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
    with UnitOfWork(sessions) as uow:
        job = uow.session.execute(select(Job).where(
            Job.id == uuid.UUID(job_id), Job.status.in_(LIVE_STATUSES))).scalar_one_or_none()
        if job is None:
            return []
        turn = open_turn(uow.session, job.id)
        if turn is not None:
            uow.event(job.id, "turn_end", turn=turn, tool_results=[], error=error)
        ctx = {**hook_ctx(job, turn if turn is not None else job.iteration + 1),
               "error": error}
        end_job(uow, job, StopReason.ERROR, "The job failed with an internal error.", error)
    if hooks is not None and hooks.loaded:
        hooks.on_error(ctx)
        if turn is not None:
            hooks.after_turn(failed_turn_ctx(ctx))
    return uow.sent


def open_turn(session: Session, job_id: uuid.UUID) -> int | None:
    """The turn whose `turn_start` is stored without a `turn_end` after it, if any."""
    def last(kind: str) -> Any:
        return session.execute(
            select(JobEvent.seq, JobEvent.data).where(JobEvent.job_id == job_id,
                                                      JobEvent.type == kind)
            .order_by(JobEvent.seq.desc()).limit(1)).one_or_none()
    started, ended = last("turn_start"), last("turn_end")
    if started is None or (ended is not None and ended.seq > started.seq):
        return None
    turn: int | None = (started.data or {}).get("turn")
    return turn


def failed_turn_ctx(ctx: dict[str, Any]) -> dict[str, Any]:
    """`after_turn`'s context for a turn that ended in an error: no reply, no usage."""
    return {**ctx, "model": None, "content": None, "tool_calls": [],
            "usage": {"input_tokens": 0, "output_tokens": 0}}


def _last_assistant_text(session: Session, job: Job) -> str:
    text: str | None = session.execute(
        select(Message.content).where(Message.job_id == job.id, Message.role == "assistant")
        .order_by(Message.seq.desc()).limit(1)).scalar_one_or_none()
    return text or ""
