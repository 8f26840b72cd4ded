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
  6. model      the router's call, with retries and fallbacks. When every model fails
                with a transient error (429, 5xx, timeout, connection, circuit open), the
                job waits for its provider: `waiting_for = provider` (shown as `status:
                waiting`), a `waiting_provider` event with `next_attempt_at`, and this
                same step (k) sent again as a delayed message: no worker waits. Attempts
                back off (Retry-After honoured) for AGENTQ_PROVIDER_WAIT_S, then the job
                fails `provider_unavailable`. Any other provider error fails it at once.
                While the model thinks, this process renews the step's lease
                (`agentq.loop.leases`): a call longer than a step deadline is not taken
                for a dead worker's and made a second time. A cancel recorded
                meanwhile stops the call (`agentq.loop.cancel_watch`): no further
                attempt or fallback, the call in flight aborted, the job `cancelled`.
  7. persist    compare-and-set again (iteration k → k+1, our lease), usage to token_logs
                and the user's monthly count, the reply as messages, then decide:
                  Finish(content)  → the job completes (end_turn; `length` when the
                                     reply was cut at its output limit: its tool
                                     calls, if any, are not run)
                  RunTools(calls)  → tool_call rows; the calls go out as a chord whose
                                     callback is step k+1
                  Stop(reason)     → the job ends with that finish_reason
  8. effects    returned to the caller, who dispatches them only after the commit.

A job ends `completed` (end_turn, length, max_iterations), `failed` (budget_exceeded, error) or
`cancelled`. Nothing here knows Celery: effects are plain values.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, or_, select, update
from sqlalchemy.orm import Session, aliased, sessionmaker

from agentq.config import Settings
from agentq.db import insert_all, riding_out, utcnow
from agentq.errors import ProviderError
from agentq.llm.cancel import CallCancelled, cancellable
from agentq.llm.pricing import estimate_cost
from agentq.llm.types import LLMReply, ToolSpec
from agentq import agents, memory
from agentq.loop import approvals, replay
from agentq import branches
from agentq.hooks import Hooks, compact_with, load_strategy
from agentq.loop import budget, context
from agentq.loop import layers as context_layers
from agentq.loop.lifecycle import (EXECUTION_LIMITS, LIVE_STATUSES, Phase, StopReason,
                                   WaitingFor, end_job)
from agentq.loop.decision import (CANCELLED, Finish, Limits, RunTools, Stop, WaitForProvider,
                                  check_limits, decide, effective_limits,
                                  remaining_output_budget, wait_for_provider)
from agentq.loop.effects import Cause, DispatchTools, Effect, NextStep
from agentq.loop.cancel_watch import CancelWatch
from agentq.loop.leases import LeaseKeeper
from agentq.loop.busy import CANCELLED_TOOL_RESULT, pending_inputs
from agentq.loop.store import STORED_MESSAGE, append_messages, recent_messages, record_usage
from agentq.loop.submit import describe_attachments
from agentq.models import (Conversation, ConversationSummary, Job, JobEvent, Message,
                           Persona, ToolCall, User)
from agentq.tenants import cached_quotas
from agentq.tools.registry import ToolRegistry
from agentq.loop.uow import UnitOfWork

log = logging.getLogger(__name__)

PROVIDER_EARLY_TOLERANCE_S = 2.0
MAX_COMPACTION_ROUNDS = 4
"""Most summary calls one step makes; a backlog longer than that is folded on by the next
turns (meanwhile those old messages wait for their summary, never lost)."""
"""A delayed step may claim its job this much before the job's next attempt time (clocks
of workers and of the process that parked it differ a little)."""
_WAIT = object()
"""_collect's answer when the turn's results are not all in yet (see _split_turn)."""
EMPTY_ANSWER = "The model gave no answer. Please try again or rephrase."
TOOL_LOST_ERROR = {"code": "tool_task_failed",
                   "message": "The tool task ended without a result (its worker was lost "
                              "or it hit its hard time limit)."}


def _param(name: str, column):
    return bindparam(name, type_=column.type)


_jobs = Job.__table__


def _loading(core_update):
    """`core_update` (an `UPDATE … RETURNING` every column of jobs) loading the job it
    changed as the session's Job, current (populate_existing). An ORM-enabled UPDATE
    (`update(Job)…returning(Job)`) does the same through the ORM's bulk-update machinery,
    which cost about twice the CPU (0.24 against 0.11 ms a claim above a bare transaction,
    1,000 claims each on Postgres: docs/benchmarks.md, the third pass)."""
    return (select(Job).from_statement(core_update.returning(*_jobs.c))
            .execution_options(populate_existing=True))


_CLAIM = _loading(
    update(_jobs).where(
        _jobs.c.id == bindparam("job_id"), _jobs.c.iteration == bindparam("at_iteration"),
        _jobs.c.status.in_(LIVE_STATUSES),
        or_(_jobs.c.step_lease_until.is_(None),
            _jobs.c.step_lease_until < _param("now", _jobs.c.step_lease_until)),
        # a job waiting for its provider is not tried before its time (a duplicate or
        # stray message claims nothing), unless it is to be cancelled
        or_(_jobs.c.waiting_for.is_distinct_from("provider"),
            _jobs.c.provider_next_attempt_at.is_(None),
            _jobs.c.provider_next_attempt_at <= _param("early", _jobs.c.provider_next_attempt_at),
            _jobs.c.cancel_requested_at.is_not(None)))
    .values(step_owner=bindparam("owner"),
            step_lease_until=_param("lease_until", _jobs.c.step_lease_until),
            last_progress_at=_param("now", _jobs.c.last_progress_at), redrive_after=None))
"""Step 1, the claim: compare-and-set on the job row (built once; its parameters per call)."""

_ADVANCE = _loading(
    update(_jobs).where(_jobs.c.id == bindparam("job_id"),
                        _jobs.c.iteration == bindparam("at_iteration"),
                        _jobs.c.step_owner == bindparam("owner"),
                        _jobs.c.status.in_(LIVE_STATUSES))
    .values(iteration=bindparam("turn_no"), step_owner=None, step_lease_until=None,
            last_progress_at=_param("now", _jobs.c.last_progress_at), redrives=0,
            waiting_for=None, provider_wait_since=None, provider_next_attempt_at=None,
            provider_attempts=0, claimed_attempts=0, redrive_after=None,
            input_tokens=_jobs.c.input_tokens + _param("add_input", _jobs.c.input_tokens),
            output_tokens=_jobs.c.output_tokens + _param("add_output", _jobs.c.output_tokens),
            cost_estimate=_jobs.c.cost_estimate + _param("cost", _jobs.c.cost_estimate)))
"""Step 7, the persist's compare-and-set: iteration k → k+1 under this step's lease, the
call's usage added."""

_versions = aliased(ConversationSummary)
_WHO = (select(User, Conversation, Persona, memory.has_memories_clause(User.id),
               ConversationSummary)
        .select_from(User)
        .join(Conversation, Conversation.id == bindparam("conversation_id"))
        .outerjoin(Persona, Persona.id == bindparam("persona_id"))
        .outerjoin(ConversationSummary, ConversationSummary.id == (
            select(_versions.id).where(_versions.conversation_id == Conversation.id)
            .order_by(_versions.version.desc()).limit(1).scalar_subquery()))
        .where(User.id == bindparam("user_id")))
"""Who, where, as whom, whether the user has memories, and the conversation's current
summary (its highest version; None before the first): one round trip."""
_OWN_MESSAGES = (select(*STORED_MESSAGE)
                 .where(Message.job_id == bindparam("job_id"),
                        or_(Message.seq > bindparam("through"), Message.role == "user"))
                 .order_by(Message.seq))
"""The job's question (its first message) and its messages after the summary."""
_TURN_CALLS = (select(ToolCall).where(ToolCall.job_id == bindparam("job_id"),
                                      ToolCall.iteration == bindparam("iteration"))
               .order_by(ToolCall.position))
"""A turn's calls, in call order (the step after its tools collects their results)."""


@dataclass
class _Turn:
    """What the claim transaction hands to the model call."""
    messages: list[dict[str, Any]]
    tools: list[ToolSpec]
    model: str
    max_tokens: int | None
    recorded: LLMReply | None = None
    """A recorded replay's answer for this turn: no provider is called, nothing billed."""
    layers: context.Layers | None = None
    budget: int = 0
    stub_before: int | None = None
    compaction: context.Compaction | None = None
    summary_version: int = 0
    resumed: bool = False
    """The turn was announced by an earlier run of its step (its provider was waited for)."""
    recall_user: uuid.UUID | None = None
    """Set when the user has memories: the top matches for the question join the context."""
    recall_key: uuid.UUID | None = None
    """The job's API key: a non-admin key recalls only its own conversations' memories."""
    stream: bool = False
    """Stream the reply: message_delta events through the hub as the text arrives."""
    turn: int = 0
    conversation_id: uuid.UUID | None = None
    backlog_end: int = 0
    """Messages up to this seq are left out of the history read: unsummarised, a backlog."""
    rounds: int = 0
    """Compaction rounds (summary calls) made in this step."""
    extras: dict[str, str | None] = dataclasses.field(default_factory=dict)
    """The persona's context layers and the active project, rendered (agentq.loop.layers)."""
    compacted_by: str | None = None
    """A custom compaction strategy (AGENTQ_COMPACTION_STRATEGY) compacted this turn: it
    compacts each assembly of it again, and fitting the window is its business."""
    job_id: str | None = None


class Stepper:
    def __init__(self, settings: Settings, router, registry: ToolRegistry,
                 sessions: sessionmaker, hooks: Hooks | None = None,
                 leases: LeaseKeeper | None = None, cancels: CancelWatch | None = None):
        self.settings = settings
        self.router = router
        self.registry = registry
        self.sessions = sessions
        self.hooks = hooks if hooks is not None else Hooks.load(settings.hooks_enabled)
        self.strategy = load_strategy(settings.compaction_strategy)
        self.leases = leases or LeaseKeeper(sessions, settings.step_deadline_s)
        self.cancels = cancels or CancelWatch(sessions)
        self._question_vectors: dict[tuple[str, str], list[float]] = {}

    # -- the step ---------------------------------------------------------------------
    def run(self, job_id: str, iteration: int, cause: Cause = "continue") -> list[Effect]:
        owner = uuid.uuid4().hex
        self.registry.look()  # before the transaction: one pooled connection at a time
        # a claim lost in a database crash is re-done by the next delivery or the sweeper
        with UnitOfWork(self.sessions, durable=False, autoflush=False) as uow:
            job = self._claim(uow.session, uuid.UUID(job_id), iteration, owner)
            if job is None:
                log.info("step skipped", extra={"job_id": job_id, "iteration": iteration,
                                                "cause": cause})
                return []
            uow.holds(job)  # the claim's UPDATE locked its row
            lease_until = job.step_lease_until
            outcome = self._prepare(uow, job, cause)
        if outcome is None:
            return uow.sent

        # the model may outlast one step deadline: the lease is renewed meanwhile; a
        # cancel recorded meanwhile stops the model calls (agentq.loop.cancel_watch)
        with self.leases.hold(job_id, owner, lease_until), \
                self.cancels.watch(job_id) as token, cancellable(token):
            try:
                reply = self._think(job_id, iteration, owner, outcome)
            except CallCancelled:
                return self._cancelled(job_id, iteration, owner)
            except ProviderError as exc:
                if exc.transient:
                    return self._wait_provider(job_id, iteration, owner, exc)
                return self._fail_provider(job_id, iteration, owner, exc)
            if not isinstance(reply, LLMReply):
                return reply  # the step ended before the model's call: its effects

        # the model answered: its reply is kept through a database outage (written when the
        # database answers, within a step deadline) rather than lost and asked for again
        for attempt in riding_out(self.settings.step_deadline_s, "model reply", job_id=job_id):
            with attempt, UnitOfWork(self.sessions, autoflush=False) as uow:
                self._persist(uow, uuid.UUID(job_id), iteration, owner, reply, outcome)
        if self.hooks.loaded:
            self.hooks.after_turn({"job_id": job_id, "turn": iteration + 1,
                                   "model": reply.model, "content": reply.content,
                                   "tool_calls": [c.name for c in reply.tool_calls],
                                   "usage": {"input_tokens": reply.input_tokens,
                                             "output_tokens": reply.output_tokens}})
        return uow.sent

    def _think(self, job_id: str, iteration: int, owner: str,
               outcome: _Turn) -> LLMReply | list[Effect]:
        """Steps 5-6 outside any transaction: the memories recalled, the summaries asked
        for, then the model's reply; or the effects of a step that ended before it."""
        if outcome.recall_user is not None:
            self._recall(job_id, outcome)
        while outcome.compaction is not None and outcome.compaction.summarize:
            if not self._summarize(job_id, iteration, owner, outcome):
                return []
        if outcome.layers is not None and outcome.compacted_by is None and not context.fits(
                outcome.layers, outcome.budget, self.settings.tool_result_max_chars,
                outcome.stub_before):
            return self._overflow(job_id, iteration, owner, outcome)
        on_delta = self._deltas(job_id, outcome.turn) if outcome.stream else None
        return outcome.recorded or self.router.chat(
            outcome.messages, outcome.tools, model=outcome.model,
            max_tokens=outcome.max_tokens, **({"on_delta": on_delta} if on_delta else {}))

    def _cancelled(self, job_id: str, iteration: int, owner: str) -> list[Effect]:
        """The job was cancelled while its model (or its summary) was asked: the call was
        aborted, or never made; the job ends `cancelled` now."""
        with UnitOfWork(self.sessions) as uow:
            job = _leased(uow.session, job_id, iteration, owner)
            if job is None:
                return []
            log.info("model call stopped by a cancel", extra={"job_id": job_id})
            self._stop_turn(uow, job, iteration + 1, CANCELLED)
        return uow.sent

    def _deltas(self, job_id: str, turn: int):
        """Publish each piece of streamed text to the job's live listeners (SSE), not to
        the database: the stored record is the whole message, written as without
        streaming. `attempt` changes when a cut stream was retried: drop earlier pieces."""
        from agentq.notify import hub_for
        hub = hub_for(self.settings)
        counter = iter(range(1 << 62))

        def on_delta(text_: str, attempt: int) -> None:
            try:
                hub.publish(job_id, [{"type": "message_delta", "seq": None,
                                      "data": {"turn": turn, "attempt": attempt,
                                               "index": next(counter), "delta": text_},
                                      "created_at": utcnow().isoformat()}])
            except Exception:  # a listener's loss never fails the step
                log.warning("delta not published", exc_info=True)
        return on_delta

    # -- 1. claim ---------------------------------------------------------------------
    def _claim(self, session: Session, job_id: uuid.UUID, iteration: int,
               owner: str) -> Job | None:
        now = utcnow()
        return session.execute(_CLAIM, {
            "job_id": job_id, "at_iteration": iteration, "now": now,
            "early": now + timedelta(seconds=PROVIDER_EARLY_TOLERANCE_S), "owner": owner,
            "lease_until": now + timedelta(seconds=self.settings.step_deadline_s)}
        ).scalar_one_or_none()

    # -- 2..5 -------------------------------------------------------------------------
    def _prepare(self, uow: UnitOfWork, job: Job, cause: Cause) -> _Turn | None:
        """The step's first transaction: None when the step ends here (its effects are on
        the unit of work), else the turn for the model call."""
        session, now = uow.session, utcnow()
        # who, where, as whom, whether the user has memories, the conversation's summary:
        # one round trip
        user, conversation, persona, has_memories, summary = session.execute(_WHO, {
            "user_id": job.user_id, "conversation_id": job.conversation_id,
            "persona_id": job.persona_id}).one()
        # the job's own messages, when this step wrote every one (its first): not read back
        asked: list[context.StoredMessage] | None = None
        if job.status == "queued":
            job.status, job.started_at = "running", now
            uow.event(job.id, "job_start", conversation_id=str(job.conversation_id))
            question = _user_content(job)
            asked = append_messages(session, conversation.id, job.id,
                                    [("user", question, None)], now)
            uow.event(job.id, "message_start", role="user", kind="question", content=question)
            uow.event(job.id, "message_end", role="user", kind="question", content=question)

        resuming = job.waiting_for == "provider"
        if resuming:  # the provider's turn again: the job runs (its turn began already)
            job.waiting_for = None
            job.provider_next_attempt_at = None

        if job.phase == "tools":
            redispatch = self._collect(uow, job, conversation, cause)
            if redispatch is _WAIT:  # another dispatch of this turn (an approved call) runs
                job.step_owner = job.step_lease_until = None
                return None
            if redispatch:
                job.step_owner = job.step_lease_until = None
                uow.effect(redispatch)
                return None

        inputs = pending_inputs(session, job.id) if job.pending_inputs else []
        job.pending_inputs = 0
        turn_no = job.iteration + 1
        # a turn resumed (after waiting for its provider, or re-driven) was announced already
        started = _turn_started(session, job, resuming)
        if not started:
            uow.event(job.id, "turn_start", turn=turn_no,
                       triggered_by=_trigger(job, bool(inputs), job.iteration == 0 and (
                           branches.is_branch_start(session, job, conversation))))
        if inputs:
            asked = None  # read with the question: the same order whoever wrote them
            append_messages(session, conversation.id, job.id,
                            [("user", entry.content, None) for entry in inputs], now)
            for entry in inputs:
                entry.consumed_at = now
                uow.event(job.id, "message_start", role="user", kind="steering",
                           content=entry.content)
                uow.event(job.id, "message_end", role="user", kind="steering",
                           content=entry.content)
                uow.event(job.id, "steering_injected", input_id=str(entry.id),
                           turn=turn_no)

        if budget.roll_period(user, now, self.settings.budget_period_days):
            log.info("budget period reset", extra={"user_id": str(user.id)})
        recorded_replay = job.replay_mode == "recorded"  # costs nothing: no budget applies
        # the limits fixed when the job was made (the job object's `limits_applied`); a
        # job made before they were recorded gets them now
        own = effective_limits(self.settings.max_iterations, self.settings.max_job_tokens,
                               self.settings.max_seconds,
                               *((job.limits_applied,) if job.limits_applied else
                                 (persona.limits if persona else None, job.limits)))
        if job.limits_applied is None:
            job.limits_applied = own
        limits = Limits(iteration=job.iteration, max_iterations=own["max_iterations"],
                        cancel_requested=job.cancel_requested_at is not None,
                        budget_limit=None if recorded_replay else user.token_budget_monthly,
                        budget_used=user.tokens_used_this_month,
                        budget_reset_at=user.budget_reset_at,
                        max_tokens=own["max_tokens"],
                        tokens_used=job.input_tokens + job.output_tokens,
                        max_seconds=own["max_seconds"],
                        elapsed_s=(now - job.started_at).total_seconds()
                        if job.started_at else 0.0)
        stop = check_limits(limits)
        recorded = None
        if stop is None and recorded_replay:
            recorded = replay.recorded_reply(session, job, turn_no)
            if recorded is None:
                stop = Stop("error", f"The original job made no model call {turn_no}; "
                                     "a recorded replay cannot go further.")
        if stop is not None:
            self._stop_turn(uow, job, turn_no, stop)
            return None

        allowed = self.registry.allowed_modules(persona.allowed_modules if persona else None,
                                                job.tenant_id)
        offered = self.registry.offered(user.permission_level, allowed)
        model = job.model or (persona.default_model if persona else None) or self.settings.model
        if recorded is not None:  # answered from the recording: no context to build
            for kind, data in replay.recorded_compactions(session, job, turn_no):
                uow.event(job.id, kind, **data)
            if not started:
                uow.event(job.id, "message_start", role="assistant", turn=turn_no)
            return _Turn([], self.registry.specs(offered), model, None, recorded)
        system = (persona.system_prompt if persona and persona.system_prompt
                  else self.settings.default_system_prompt)
        max_tokens = remaining_output_budget(
            limits, persona.max_tokens_per_request if persona else None)
        turn = _Turn([], self.registry.specs(offered), model, max_tokens,
                     stream=bool(job.stream or (persona is not None and persona.stream)),
                     turn=job.iteration + 1, resumed=started)
        turn.extras = context_layers.extras(persona, conversation, turn.tools)
        stop = self._build_context(uow, job, conversation, summary, system, turn,
                                   has_memories, asked)
        if stop is not None:
            self._stop_turn(uow, job, turn_no, stop)
            return None
        if self.settings.answer_after_tools and context.last_tools_succeeded(
                list(reversed(turn.layers.inrun))):
            turn.tools = []  # the results are in: the model answers from them
        return turn

    # -- 5. context -------------------------------------------------------------------
    def _build_context(self, uow: UnitOfWork, job: Job, conversation: Conversation,
                       summary: ConversationSummary | None, system: str, turn: "_Turn",
                       has_memories: bool,
                       asked: list[context.StoredMessage] | None = None) -> Stop | None:
        """The layers of this turn's context; a compaction planned when they pass the
        threshold (the summary itself is asked for outside this transaction). A
        `before_turn` hook may stop the job here. `asked`: the job's messages, when this
        transaction wrote all of them (its question, on its first step)."""
        session = uow.session
        through = summary.through_seq if summary else 0
        # the job's question (its first message) and what this run added since the summary:
        # one read (the job's user messages come with it; those summarised are dropped)
        own = asked if asked is not None else [context.StoredMessage(*row) for row in (
            session.execute(_OWN_MESSAGES, {"job_id": job.id, "through": through}).all())]
        question = own[0] if own else None
        top = question.seq if question else conversation.message_seq + 1
        history = [m for m in reversed(recent_messages(
            session, conversation.id, self.settings.history_max_messages, top - 1))
            if m.seq > through and m.seq < top]
        # older messages than that read, not in the summary yet: summarised, never dropped
        turn.conversation_id = conversation.id
        turn.backlog_end = top - 1 - self.settings.history_max_messages
        backlog, backlog_more = self._backlog(session, turn, through)
        inrun = ([m for m in own[1:] if m.seq > through] if question is not None else [])
        budget = context.input_budget(context.context_window(turn.model, self.settings),
                                      turn.max_tokens)
        recalls = question is not None and has_memories
        # the recall runs later (its embedding is a network call): its room is kept now
        layers = context.Layers(system, summary.content if summary else None, history,
                                question, inrun,
                                memory_reserve=context.memory_reserve(
                                    memory.RECALL_K, memory.MAX_MEMORY_CHARS, budget)
                                if recalls else 0,
                                backlog=backlog, backlog_more=backlog_more, **turn.extras)
        turn.layers, turn.budget = layers, budget
        turn.summary_version = summary.version if summary else 0
        if recalls:
            turn.recall_user, turn.recall_key = job.user_id, job.api_key_id
        # once per turn: not again when its step runs again (after waiting for the
        # provider, or re-driven), since an earlier run of it already asked the hook
        if self.hooks.loaded and not turn.resumed:
            stopped = self.hooks.before_turn({**_hook_ctx(job, job.iteration + 1),
                                              "messages": self._assemble(turn)})
            if stopped is not None:
                hook_name, reason = stopped
                return Stop("hook", reason, {"hook": hook_name})
        plan = self._next_round(turn)
        if plan is not None and self.hooks.loaded and not self.hooks.before_compaction(
                {**_hook_ctx(job, job.iteration + 1), "tokens": plan.tokens_before,
                 "messages": plan.messages_before}):
            log.info("compaction skipped by a hook", extra={"job_id": str(job.id)})
            plan = None
        compacted = None
        if plan is not None and self.strategy is not None:
            compacted = self._compact_custom(uow, job, turn, plan)
            if compacted is not None:
                plan = None
        turn.compaction = plan
        if plan is not None:
            self._compaction_start(uow, job.id, turn, plan)
            if not plan.summarize:
                self._compaction_end(uow, job.id, turn, "prune")
        if (plan is None or not plan.summarize) and not turn.resumed:
            uow.event(job.id, "message_start", role="assistant", turn=job.iteration + 1)
        # what the custom strategy gave is sent, not assembled and compacted a second time
        turn.messages = compacted or self._assemble(turn)
        return None

    def _assemble(self, turn: "_Turn") -> list[dict[str, Any]]:
        # history fills the room up to the compaction threshold, not to the window's edge:
        # the rest is headroom for what token estimates miss (message framing, tokenizers)
        messages = context.assemble(turn.layers,
                                    budget=int(turn.budget * self.settings.compaction_threshold),
                                    history_max_tokens=self.settings.context_max_tokens,
                                    max_tool_chars=self.settings.tool_result_max_chars,
                                    stub_before=turn.stub_before)
        if turn.compacted_by is not None:
            messages = self._strategy_messages(turn, messages) or messages
        return messages

    def _strategy_messages(self, turn: "_Turn", messages: list[dict[str, Any]]
                           ) -> list[dict[str, Any]] | None:
        """The custom strategy's compaction of `messages` (None: the built-in one runs)."""
        return compact_with(self.strategy, self.settings.compaction_strategy, {
            "job_id": turn.job_id, "turn": turn.turn, "messages": [dict(m) for m in messages],
            "tokens": context.wire_tokens(messages), "budget": turn.budget,
            "threshold": self.settings.compaction_threshold})

    def _compact_custom(self, uow: UnitOfWork, job: Job, turn: "_Turn",
                        plan: context.Compaction) -> list[dict[str, Any]] | None:
        """The context passed the threshold: the custom strategy compacts it instead of the
        built-in one; the messages it gave (None when it failed: the built-in one runs)."""
        turn.job_id = str(job.id)
        after = self._strategy_messages(turn, self._assemble(turn))
        if after is None:
            return None
        turn.compacted_by = name = self.settings.compaction_strategy
        uow.event(job.id, "compaction_start", turn=turn.turn,
                  tokens_before=plan.tokens_before, messages_before=plan.messages_before,
                  window=turn.budget, threshold=self.settings.compaction_threshold,
                  summarize_messages=0, round=1)
        stats = {"strategy": name, "tokens_before": plan.tokens_before,
                 "tokens_after": context.wire_tokens(after),
                 "messages_before": plan.messages_before, "messages_after": len(after)}
        uow.event(job.id, "compaction_end", **stats)
        if self.hooks.loaded:
            self.hooks.after_compaction({**_hook_ctx(job, job.iteration + 1), **stats})
        return after

    def _backlog(self, session: Session, turn: "_Turn", through: int
                 ) -> tuple[list[context.StoredMessage], bool]:
        """The oldest chunk of the backlog (unsummarised messages older than the history
        read), and whether more follows it."""
        if turn.backlog_end <= through:
            return [], False
        chunk = [context.StoredMessage(*row) for row in session.execute(
            select(*STORED_MESSAGE)
            .where(Message.conversation_id == turn.conversation_id, Message.seq > through,
                   Message.seq <= turn.backlog_end)
            .order_by(Message.seq).limit(self.settings.history_max_messages)).all()]
        return chunk, bool(chunk) and chunk[-1].seq < turn.backlog_end

    def _next_round(self, turn: "_Turn") -> context.Compaction | None:
        return context.next_round(turn.layers, turn.budget, self.settings.compaction_threshold,
                                  self.settings.tool_result_max_chars,
                                  self.settings.compaction_keep_turns,
                                  context.summary_chars(turn.budget, turn.layers))

    def _compaction_start(self, uow: UnitOfWork, job_id: uuid.UUID, turn: "_Turn",
                          plan: context.Compaction) -> None:
        turn.compaction = plan
        turn.stub_before = plan.stub_before_seq
        uow.event(job_id, "compaction_start", turn=turn.turn,
                   tokens_before=plan.tokens_before, messages_before=plan.messages_before,
                   window=turn.budget, threshold=self.settings.compaction_threshold,
                   summarize_messages=len(plan.summarize), round=turn.rounds + 1)

    def _compaction_end(self, uow: UnitOfWork, job_id: uuid.UUID, turn: "_Turn",
                        strategy: str, **extra: Any) -> None:
        layers = turn.layers
        after = context.tokens_of(layers, self.settings.tool_result_max_chars,
                                  turn.stub_before)
        messages = context.message_count(layers)
        uow.event(job_id, "compaction_end", strategy=strategy,
                   tokens_before=turn.compaction.tokens_before, tokens_after=after,
                   messages_before=turn.compaction.messages_before, messages_after=messages,
                   **extra)
        if self.hooks.loaded:
            self.hooks.after_compaction({
                "job_id": str(job_id), "turn": turn.turn, "strategy": strategy,
                "tokens_before": turn.compaction.tokens_before, "tokens_after": after,
                "messages_before": turn.compaction.messages_before,
                "messages_after": messages, **extra})

    def _recall(self, job_id: str, turn: "_Turn") -> None:
        """The user's memories most like the question join the context (seed 000: top 5).
        The question's embedding is kept per job; a failed embedding recalls nothing."""
        question = turn.layers.question.content[:8000]
        key = (job_id, question)
        vector = self._question_vectors.get(key)
        if vector is None:
            try:
                vector = self.router.embed(question)
            except ProviderError as exc:
                log.warning("memory recall skipped: embedding failed",
                            extra={"job_id": job_id, "error": exc.message})
                return
            if len(self._question_vectors) > 1024:
                self._question_vectors.clear()
            self._question_vectors[key] = vector
        with UnitOfWork(self.sessions) as uow:
            found = memory.recall(uow.session, turn.recall_user, vector,
                                  self.settings.embedding_model,
                                  ef_search=self.settings.memory_ef_search,
                                  api_key_id=memory.recall_scope(uow.session,
                                                                 turn.recall_key))
            if found:
                uow.event(uuid.UUID(job_id), "memory_recalled", count=len(found),
                          similarities=[round(score, 4) for _, score in found])
        kept = context.fit_memories([m.content for m, _ in found], turn.layers.memory_reserve)
        if kept:
            turn.layers = dataclasses.replace(turn.layers, memories=tuple(kept))
            turn.messages = self._assemble(turn)

    def _summarize(self, job_id: str, iteration: int, owner: str, turn: "_Turn") -> bool:
        """Fold the planned older turns into the conversation's summary: a model call outside
        any transaction, then the summary, its usage and `compaction_end` in one. False when
        the job's lease was lost meanwhile."""
        plan = turn.compaction
        layers = turn.layers
        request = context.summary_request(
            layers.summary, layers.question, plan.summarize,
            self.settings.tool_result_max_chars,
            max_chars=context.summary_chars(turn.budget, layers),
            stub_before=turn.stub_before)
        failure: dict[str, Any] | None = None
        try:
            reply = self.router.chat(request, [], model=turn.model,
                                     max_tokens=context.summary_max_tokens(turn.budget))
        except ProviderError as exc:
            log.warning("summary call failed", extra={"job_id": job_id,
                                                      "error": exc.message})
            reply, failure = None, {"code": exc.code, "message": exc.message}
        # the summary was made: it is kept through a database outage (written when the
        # database answers, within a step deadline) rather than lost and asked for again;
        # each try starts from the turn as it was before the first
        before = dict(vars(turn))
        for attempt in riding_out(self.settings.step_deadline_s, "summary", job_id=job_id):
            vars(turn).update(before)
            with attempt, UnitOfWork(self.sessions) as uow:
                written = self._write_summary(uow, job_id, iteration, owner, turn, reply,
                                              failure)
        if not written:
            return False
        turn.messages = self._assemble(turn)
        return True

    def _write_summary(self, uow: UnitOfWork, job_id: str, iteration: int, owner: str,
                       turn: "_Turn", reply: LLMReply | None,
                       failure: dict[str, Any] | None) -> bool:
        """`_summarize`'s transaction: the summary (or the prune when there is none), its
        usage, `compaction_end`, and the next round's start when one is planned; it advances
        `turn`. False when the job's lease was lost meanwhile."""
        plan, layers = turn.compaction, turn.layers
        next_round = False
        session = uow.session
        job = _leased(session, job_id, iteration, owner)
        if job is None:
            return False
        if reply is None or not reply.content.strip():
            failure = (failure if reply is None else
                       {"code": "empty_summary", "message": "The model gave no summary."})
            self._compaction_end(uow, job.id, turn, "prune", error=failure)
        else:
            now = utcnow()
            through = plan.summarize[-1].seq
            cost = estimate_cost(reply.model, reply.input_tokens, reply.output_tokens)
            # what is stored is cut to the summary's budget, whatever the server sent
            summary, cut = context.cut_summary(reply.content.strip(),
                                               context.summary_max_tokens(turn.budget))
            session.add(ConversationSummary(
                conversation_id=job.conversation_id, version=turn.summary_version + 1,
                content=summary, through_seq=through,
                messages_summarized=len(plan.summarize), job_id=job.id,
                model=reply.model, input_tokens=reply.input_tokens,
                output_tokens=reply.output_tokens, created_at=now))
            record_usage(session, user_id=job.user_id, conversation_id=job.conversation_id,
                         job_id=job.id, iteration=-(turn.summary_version + 1),
                         reply=reply, cost=cost, now=now)
            job.input_tokens += reply.input_tokens
            job.output_tokens += reply.output_tokens
            job.cost_estimate += cost
            turn.layers = context.after_summary(layers, summary, through)
            if turn.layers.backlog_more and not turn.layers.backlog:
                backlog, more = self._backlog(session, turn, through)
                turn.layers = dataclasses.replace(turn.layers, backlog=backlog,
                                                  backlog_more=more)
            turn.summary_version += 1
            turn.rounds += 1
            following = (self._next_round(turn)
                         if turn.rounds < MAX_COMPACTION_ROUNDS else None)
            if following is not None and not following.summarize:
                turn.stub_before = following.stub_before_seq  # pruning is enough now
                following = None
            self._compaction_end(uow, job.id, turn, "summarize",
                                 summary_version=turn.summary_version,
                                 through_seq=through,
                                 summary_input_tokens=reply.input_tokens,
                                 summary_output_tokens=reply.output_tokens,
                                 **({"summary_truncated": True} if cut else {}))
            if following is not None:  # one more summary call before the model's turn
                self._compaction_start(uow, job.id, turn, following)
                next_round = True
        if not next_round:
            turn.compaction = None
            if not turn.resumed:
                uow.event(job.id, "message_start", role="assistant", turn=iteration + 1)
        return True

    def _overflow(self, job_id: str, iteration: int, owner: str,
                  turn: "_Turn") -> list[Effect]:
        """Compacted as far as it goes, the context still passes the model's window (a
        huge question, system prompt or last turn): the job fails, saying so."""
        tokens = context.tokens_of(turn.layers, self.settings.tool_result_max_chars,
                                   turn.stub_before, history=())
        error = {"code": "context_overflow",
                 "message": f"The context needs {tokens} tokens after compaction; the model "
                            f"{turn.model} takes {turn.budget}."}
        with UnitOfWork(self.sessions) as uow:
            job = _leased(uow.session, job_id, iteration, owner)
            if job is None:
                return []
            log.warning("context overflow", extra={"job_id": job_id, "tokens": tokens,
                                                   "budget": turn.budget})
            failed_ctx = self._failed_turn(uow, job, iteration, error)
            self._stop(uow, job, Stop("error", error["message"], {
                "code": "context_overflow", "tokens": tokens, "budget": turn.budget}))
        if self.hooks.loaded:
            self.hooks.after_turn(_failed_turn_ctx(failed_ctx))
        return uow.sent

    def _collect(self, uow: UnitOfWork, job: Job, conversation: Conversation,
                 cause: Cause) -> DispatchTools | None:
        """Tool results of the last turn → tool_result messages, in call order; the lost
        calls of a re-driven turn to dispatch again; or `_WAIT`."""
        session = uow.session
        calls = session.execute(_TURN_CALLS, {"job_id": job.id, "iteration": job.iteration}
                                ).scalars().all()
        pending = [c for c in calls if c.status == "pending"]
        if (pending and job.cancel_requested_at is None
                and agents.awaits_children(session, pending)):
            # its sub-agents still run: the last one's end sends this step again
            job.status, job.waiting_for = "waiting", WaitingFor.CHILDREN.value
            return _WAIT
        if (pending and cause == "callback" and job.cancel_requested_at is None
                and self._split_turn(calls)):
            return _WAIT
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
            uow.event(job.id, "tool_execution_end", tool_use_id=call.tool_use_id,
                       name=call.name, ok=False, error=record["error"]["code"])
        append_messages(session, conversation.id, job.id, [
            ("tool_result", json.dumps({"name": c.name, "tool_use_id": c.tool_use_id,
                                        **(c.result or {})}), None)
            for c in calls], now)
        job.phase = "llm"
        if job.replay_mode == "recorded":
            for diverged in replay.divergences(session, job, calls):
                uow.event(job.id, "replay_diverged", **diverged)
        uow.event(job.id, "turn_end", turn=job.iteration,
                   tool_results=[{"tool_use_id": c.tool_use_id, "name": c.name,
                                  "ok": bool((c.result or {}).get("ok"))} for c in calls])
        return None

    @staticmethod
    def _split_turn(calls) -> bool:
        """The turn's calls went out in more than one dispatch (some were held for
        approval): a callback can come while another dispatch's calls still run."""
        return any(c.approval_expires_at is not None for c in calls)

    def _limit(self, name: str) -> float:
        return (self.registry.time_limit_for(name) if name in self.registry.tools
                else self.settings.tool_time_limit_s)

    # -- 7. persist -------------------------------------------------------------------
    def _persist(self, uow: UnitOfWork, job_id: uuid.UUID, iteration: int, owner: str,
                 reply: LLMReply, turn: _Turn) -> None:
        session, now = uow.session, utcnow()
        turn_no = iteration + 1
        charged = turn.recorded is None
        cost = estimate_cost(reply.model, reply.input_tokens, reply.output_tokens) \
            if charged else 0.0
        job = session.execute(_ADVANCE, {
            "job_id": job_id, "at_iteration": iteration, "owner": owner, "turn_no": turn_no,
            "now": now, "add_input": reply.input_tokens, "add_output": reply.output_tokens,
            "cost": cost}).scalar_one_or_none()
        if job is None:
            log.warning("step lost its lease; reply discarded",
                        extra={"job_id": str(job_id), "iteration": iteration})
            return
        uow.holds(job)  # the compare-and-set's UPDATE locked its row
        record_usage(session, user_id=job.user_id, conversation_id=job.conversation_id,
                     job_id=job.id, iteration=turn_no, reply=reply, cost=cost,
                     charged=charged, keep_reply=True, now=now)
        uow.event(job.id, "message_end", turn=turn_no, role="assistant", model=reply.model,
                   content=reply.content, tool_calls=[c.name for c in reply.tool_calls],
                   input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                   fallback_attempts=list(reply.attempts))

        if job.cancel_requested_at is not None:
            # cancelled while the model was thinking: the call is billed once (above), its
            # tool calls are not run, and the job ends here
            if reply.content:
                append_messages(session, job.conversation_id, job.id,
                                [("assistant", reply.content, reply.model)], now)
            self._stop_turn(uow, job, turn_no, CANCELLED)
            return
        decision = decide(reply, [t.name for t in turn.tools],
                          cached_quotas(session, job.tenant_id,
                                        self.settings).tool_calls_per_turn)
        match decision:
            case Finish(content=content, cut=True, not_run=not_run):
                self._cut_short(uow, job, turn_no, reply, content, not_run, turn, now)
            case Finish(content=content):
                append_messages(session, job.conversation_id, job.id,
                                [("assistant", content, reply.model)], now)
                uow.event(job.id, "turn_end", turn=turn_no, tool_results=[])
                error = None
                if not content.strip():  # small models do this; the client still reads text
                    content = EMPTY_ANSWER
                    error = {"code": "empty_answer",
                             "message": f"Model {reply.model} answered with no text."}
                self._end(uow, job, StopReason.END_TURN, content, error)
            case RunTools(calls=calls, content=content):
                self._plan_tools(uow, job, turn_no, reply, calls, content, now)
            case Stop() as stop:
                self._stop(uow, job, stop)
            case _:
                raise TypeError(f"unknown decision {decision!r}")

    def _cut_short(self, uow: UnitOfWork, job: Job, turn_no: int, reply: LLMReply,
                   content: str, not_run: tuple[str, ...], turn: _Turn,
                   now: datetime) -> None:
        """The reply was cut at its output limit: the job ends `completed` with
        finish_reason `length` and the text there is; a cut reply's tool calls are not run
        (the last one's arguments are cut short), and the error says which were dropped."""
        if content:
            append_messages(uow.session, job.conversation_id, job.id,
                            [("assistant", content, reply.model)], now)
        limit = f" of {turn.max_tokens} tokens" if turn.max_tokens else ""
        message = (f"The reply of model {reply.model} was cut at its output limit{limit}: "
                   "the answer is incomplete.")
        if not_run:
            message += f" Its tool calls were not run ({', '.join(not_run)})."
        error: dict[str, Any] = {"code": "length", "message": message,
                                 "output_tokens": reply.output_tokens,
                                 "max_tokens": turn.max_tokens}
        if not_run:
            error["tool_calls_not_run"] = list(not_run)
        uow.event(job.id, "turn_end", turn=turn_no, tool_results=[], stopped="length")
        self._end(uow, job, StopReason.LENGTH, content or message, error)

    def _plan_tools(self, uow: UnitOfWork, job: Job, turn_no: int, reply: LLMReply,
                    calls, content: str, now: datetime) -> None:
        session = uow.session
        rows: list[tuple[str, str, str | None]] = []
        if content:
            rows.append(("assistant", content, reply.model))
        dispatch = []
        held: list[ToolCall] = []
        records: list[ToolCall] = []
        persona = session.get(Persona, job.persona_id) if job.persona_id else None
        persona_tools = persona.approval_tools if persona is not None else None
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
                # rejected before it ran (no tool_execution_start): its arguments go here
                uow.event(job.id, "tool_execution_end", tool_use_id=tool_use_id,
                           name=call.name, ok=False, error=call.error["code"],
                           arguments=(call.arguments if call.arguments is not None
                                      else call.raw_arguments))
            elif approvals.needs_approval(self.registry, call.name, persona_tools):
                held.append(record)
            else:
                dispatch.append((tool_use_id, queue, self._limit(call.name)))
                uow.event(job.id, "tool_execution_start", tool_use_id=tool_use_id,
                           name=call.name, arguments=call.arguments, queue=queue,
                           idempotent=getattr(self.registry.tools.get(call.name),
                                              "idempotent", False))
            records.append(record)
            rows.append(("tool_call", json.dumps({"name": call.name,
                                                  "arguments": call.arguments,
                                                  "tool_use_id": tool_use_id}), reply.model))
        insert_all(session, records)  # not flushed: the job's row then goes with its events
        append_messages(session, job.conversation_id, job.id, rows, now)
        job.phase = Phase.TOOLS.value
        if dispatch:
            uow.effect(DispatchTools(str(job.id), turn_no, tuple(dispatch)))
        for record in held:  # they wait for a person; the job holds no worker meanwhile
            approvals.hold(uow, job, record, approvals.deadline(
                self.registry, self.settings, record.name, now))
        if not dispatch and not held:
            uow.effect(NextStep(str(job.id), turn_no, "continue"))

    # -- endings ----------------------------------------------------------------------
    def _stop_turn(self, uow: UnitOfWork, job: Job, turn_no: int, stop: Stop) -> None:
        """The turn ends stopped, no tool run, and the job with it."""
        uow.event(job.id, "turn_end", turn=turn_no, tool_results=[], stopped=stop.reason)
        self._stop(uow, job, stop)

    def _stop(self, uow: UnitOfWork, job: Job, stop: Stop) -> None:
        """End the job for `stop`; an execution limit or a hook leaves a note in the
        conversation and answers with the last assistant text."""
        content = stop.message
        if stop.reason in EXECUTION_LIMITS or stop.reason == StopReason.HOOK:
            content = _last_assistant_text(uow.session, job) or stop.message
            note = f"[Agent stopped: {stop.reason}]"
            append_messages(uow.session, job.conversation_id, job.id, [("user", note, None)])
            uow.event(job.id, "message_start", role="user", kind="limit", content=note)
            uow.event(job.id, "message_end", role="user", kind="limit", content=note)
            uow.event(job.id, "limit_reached" if stop.reason != "hook" else "hook_stopped",
                      reason=stop.reason, message=stop.message, **stop.details)
        self._end(uow, job, stop.reason, content,
                  {"code": stop.reason, "message": stop.message, **stop.details})

    def _end(self, uow: UnitOfWork, job: Job, reason: StopReason | str, content: str,
             error: dict[str, Any] | None) -> None:
        """`end_job`, then the `after_loop` hook: the job ended; the loop's whole usage."""
        end_job(uow, job, reason, content, error)
        if self.hooks.loaded:
            self.hooks.after_loop({**_hook_ctx(job, job.iteration), "status": job.status,
                                   "finish_reason": job.finish_reason, "turns": job.iteration,
                                   "usage": {"input_tokens": job.input_tokens,
                                             "output_tokens": job.output_tokens,
                                             "cost_estimate": job.cost_estimate}})

    def _wait_provider(self, job_id: str, iteration: int, owner: str,
                       exc: ProviderError) -> list[Effect]:
        """Every model failed with a transient error: park the job and send this step again
        later, or end it once the wait window has passed."""
        failed_ctx = None
        with UnitOfWork(self.sessions) as uow:
            job = _leased(uow.session, job_id, iteration, owner)
            if job is None:
                return []
            now = utcnow()
            last_error = exc.attempts[-1]["error"] if exc.attempts else exc.message
            plan = wait_for_provider(
                now=now, waiting_since=job.provider_wait_since,
                attempts=job.provider_attempts, window_s=self.settings.provider_wait_s,
                base_s=self.settings.provider_retry_base_s,
                max_s=self.settings.provider_retry_max_s, jitter=random.random(),
                retry_after_s=exc.retry_after_s, last_error=last_error)
            match plan:
                case Stop():
                    log.warning("provider unavailable for the whole wait; failing the job",
                                extra={"job_id": job_id, "error": last_error})
                    error = {"code": "provider_unavailable", "message": plan.message}
                    failed_ctx = self._failed_turn(uow, job, iteration, error)
                    self._end(uow, job, StopReason.ERROR,
                              "The model provider could not be reached for too long; "
                              "please try again later.",
                              {**error, **{k: v for k, v in plan.details.items()
                                           if k != "code"}, "attempts": exc.attempts})
                case WaitForProvider():
                    self._park(uow, job, plan, exc, last_error, now)
                case _:
                    raise TypeError(f"unknown provider wait plan {plan!r}")
        if failed_ctx is not None and self.hooks.loaded:
            self.hooks.after_turn(_failed_turn_ctx(failed_ctx))
        return uow.sent

    def _park(self, uow: UnitOfWork, job: Job, plan: WaitForProvider, exc: ProviderError,
              last_error: str, now: datetime) -> None:
        job.waiting_for = WaitingFor.PROVIDER.value
        job.provider_wait_since = plan.waiting_since
        job.provider_attempts = plan.attempt
        job.provider_next_attempt_at = plan.next_attempt_at
        job.step_owner = job.step_lease_until = None
        job.last_progress_at = now
        job.redrives = 0  # the step ended in a known state: parking is progress
        log.warning("waiting for the model provider", extra={
            "job_id": str(job.id), "attempt": plan.attempt, "delay_s": round(plan.delay_s, 3),
            "error": last_error})
        uow.event(job.id, "waiting_provider", turn=job.iteration + 1,
                  next_attempt_at=plan.next_attempt_at.isoformat(),
                  attempt=plan.attempt, delay_s=round(plan.delay_s, 3),
                  retry_after_s=exc.retry_after_s, error=last_error,
                  waiting_since=plan.waiting_since.isoformat())
        uow.effect(NextStep(str(job.id), job.iteration, "provider", plan.next_attempt_at))

    def _fail_provider(self, job_id: str, iteration: int, owner: str,
                       exc: ProviderError) -> list[Effect]:
        with UnitOfWork(self.sessions) as uow:
            job = _leased(uow.session, job_id, iteration, owner)
            if job is None:
                return []
            log.warning("model call failed", extra={"job_id": job_id, "error": exc.message})
            error = {"code": exc.code, "message": exc.message}
            failed_ctx = self._failed_turn(uow, job, iteration, error)
            self._end(uow, job, StopReason.ERROR,
                      "The model could not be reached; please try again.",
                      {**error, "attempts": exc.attempts})
        if self.hooks.loaded:
            self.hooks.after_turn(_failed_turn_ctx(failed_ctx))
        return uow.sent

    def _failed_turn(self, uow: UnitOfWork, job: Job, iteration: int,
                     error: dict[str, Any]) -> dict[str, Any]:
        """The turn ends with `error` (`turn_end`), `on_error` hears it; returns the hook
        context `after_turn` gets after the commit."""
        uow.event(job.id, "turn_end", turn=iteration + 1, tool_results=[], error=error)
        failed_ctx = {**_hook_ctx(job, iteration + 1), "error": error}
        if self.hooks.loaded:
            self.hooks.on_error(failed_ctx)
        return failed_ctx

    def fail(self, job_id: str, exc: BaseException) -> list[Effect]:
        """A bug in this job's step: the job fails (`fail_job`), the hooks hear it."""
        return fail_job(self.sessions, job_id, exc, self.hooks)


def _leased(session: Session, job_id: str, iteration: int, owner: str) -> Job | None:
    """The job, if it is still live at `iteration` under this step's lease."""
    return session.execute(
        select(Job).where(Job.id == uuid.UUID(job_id), Job.iteration == iteration,
                          Job.step_owner == owner, Job.status.in_(LIVE_STATUSES))
    ).scalar_one_or_none()


def _trigger(job: Job, steered: bool, branch: bool = False) -> str:
    """What started this turn (seed 001's TurnTrigger)."""
    if job.iteration == 0:
        if job.replay_of is not None:
            return "replay"
        if branch:
            return "branch"
        if job.parent_job_id is not None:
            return "sub_agent"
        if (job.meta or {}).get("follow_up_of"):
            return "follow_up"
        return "user"
    return "steering" if steered else "continuation"


def _hook_ctx(job: Job, turn: int) -> dict[str, Any]:
    return {"job_id": str(job.id), "conversation_id": str(job.conversation_id),
            "user_id": str(job.user_id), "turn": turn}


def fail_job(sessions: sessionmaker, job_id: str, exc: BaseException,
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
        ctx = {**_hook_ctx(job, turn if turn is not None else job.iteration + 1),
               "error": error}
        end_job(uow, job, StopReason.ERROR, "The job failed with an internal error.", error)
    if hooks is not None and hooks.loaded:
        hooks.on_error(ctx)
        if turn is not None:
            hooks.after_turn(_failed_turn_ctx(ctx))
    return uow.sent


def open_turn(session: Session, job_id: uuid.UUID) -> int | None:
    """The turn whose `turn_start` is stored without a `turn_end` after it, if any."""
    def last(kind: str):
        return session.execute(
            select(JobEvent.seq, JobEvent.data).where(JobEvent.job_id == job_id,
                                                      JobEvent.type == kind)
            .order_by(JobEvent.seq.desc()).limit(1)).one_or_none()
    started, ended = last("turn_start"), last("turn_end")
    if started is None or (ended is not None and ended.seq > started.seq):
        return None
    return (started.data or {}).get("turn")


def _failed_turn_ctx(ctx: dict[str, Any]) -> dict[str, Any]:
    """`after_turn`'s context for a turn that ended in an error: no reply, no usage."""
    return {**ctx, "model": None, "content": None, "tool_calls": [],
            "usage": {"input_tokens": 0, "output_tokens": 0}}


def _turn_started(session: Session, job: Job, resuming: bool) -> bool:
    """Whether this turn's `turn_start` was written by an earlier run of this step (it
    waited for its provider, or was re-driven while its model call ran): then the turn
    goes on and is not announced twice. A first run needs no query."""
    if not (resuming or job.provider_attempts or job.redrives):
        return False
    started = session.execute(
        select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job.id, JobEvent.type == "turn_start")).scalar_one()
    return started > job.iteration


def _tool_use_id(job_id: uuid.UUID, turn: int, position: int) -> str:
    """Stable per (job, turn, position): a duplicated persist cannot make a second call."""
    return "tool_" + uuid.uuid5(job_id, f"{turn}:{position}").hex[:24]


def _user_content(job: Job) -> str:
    return describe_attachments(job.content, job.attachments)


def _last_assistant_text(session: Session, job: Job) -> str:
    return session.execute(
        select(Message.content).where(Message.job_id == job.id, Message.role == "assistant")
        .order_by(Message.seq.desc()).limit(1)).scalar_one_or_none() or ""
