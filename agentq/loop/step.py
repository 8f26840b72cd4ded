"""One step of a job: the loop's contract, top to bottom.

A job advances by steps, each keyed by (job id, iteration), where `iteration` counts the
model calls already made. `run_step(job_id, k)` does, in order:

  1. claim      compare-and-set on the job row (`agentq.loop.claim`): only if the job is
                live, still at iteration k, and no other step holds its lease. A
                duplicated or stale message claims nothing and does nothing.
  2. start      on the first step: status running, `job_start`, the user's message stored.
  3. collect    if the previous turn ran tools: their results (keyed by tool_use_id) become
                tool_result messages, in call order; a call without a result is answered
                with an error (or, when the sweeper re-drives, dispatched again).
  4. limits     cancel requested → cancelled; k == max_iterations → max_iterations;
                budget used up → budget_exceeded.
  5. context    system prompt + a window of the history (`agentq.loop.turn_context`); past
                the compaction threshold, older turns pruned or summarised
                (`agentq.loop.compaction`); the user's memories recalled
                (`agentq.loop.recall`).
     -- commit; no connection is held while the model thinks --
  6. model      the router's call, with retries and fallbacks. When every model fails
                with a transient error (429, 5xx, timeout, connection, circuit open), the
                job waits for its provider: `waiting_for = provider` (shown as `status:
                waiting`), a `waiting_provider` event with `next_attempt_at`, and this
                same step (k) sent again as a delayed message: no worker waits. Attempts
                back off (Retry-After honoured) for AGENTQ_PROVIDER_WAIT_S, then the job
                fails `provider_unavailable`. Any other provider error fails it at once
                (`agentq.loop.provider_wait`).
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
                                     callback is step k+1 (`agentq.loop.tool_turn`); a
                                     local module's run in this task after the commit,
                                     and a turn of local calls only goes on to step k+1
                                     here, no message sent (`run`)
                  Stop(reason)     → the job ends with that finish_reason
  8. effects    returned to the caller, who dispatches them only after the commit.

A job ends `completed` (end_turn, length, max_iterations), `failed` (budget_exceeded, error) or
`cancelled` (`agentq.loop.endings`). The smaller decisions on the way are pure functions in
`agentq.loop.rules`, the turn's in `agentq.loop.decision`. Nothing here knows Celery:
effects are plain values.
"""
from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, assert_never

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import ProviderError
from agentq.hooks import Hooks
from agentq.llm.cancel import CallCancelled, cancellable
from agentq.llm.pricing import estimate_cost
from agentq.llm.types import LLMReply
from agentq.loop import budget, context, replay, rules
from agentq.loop import layers as context_layers
from agentq.loop.busy import pending_inputs
from agentq.loop.cancel_watch import CancelWatch
from agentq.loop.claim import ADVANCE, ADVANCE_WITH_USAGE, Who, claim
from agentq.loop.compaction import Compactor
from agentq.loop.decision import (
    CANCELLED,
    Finish,
    Limits,
    RunTools,
    Stop,
    check_limits,
    decide,
    effective_limits,
    remaining_output_budget,
)
from agentq.loop.effects import Cause, Effect
from agentq.loop.endings import Endings, fail_job
from agentq.loop.leases import LeaseKeeper
from agentq.loop.lifecycle import (
    JobStatus,
    Phase,
    ReplayMode,
    StopReason,
    WaitingFor,
    resume_from_provider,
    start,
)
from agentq.loop.provider_wait import ProviderWaits
from agentq.loop.recall import Recall
from agentq.loop.store import (
    append_after,
    append_messages,
    append_with_history,
    is_branch_start,
    record_usage,
    usage_parameters,
)
from agentq.loop.streaming import delta_publisher
from agentq.loop.submit import describe_attachments
from agentq.loop.tool_turn import LocalTurn, ToolTurns
from agentq.loop.turn import Turn
from agentq.loop.turn_context import Asked, ContextBuilder
from agentq.loop.uow import UnitOfWork, ride_out
from agentq.models import Conversation, Job, JobEvent, Persona, User
from agentq.tenants import cached_quotas
from agentq.tools.registry import ToolRegistry

if TYPE_CHECKING:  # the router is passed in; its module imports the provider SDKs
    from agentq.llm.router import LLMRouter

log = logging.getLogger(__name__)


class Stepper:
    """Runs one step of a job (the module's contract). Its parts, each a module of its
    own, read its wiring (settings, router, registry, sessions, hooks) from it at each
    call: context, compaction, recall, tool turns, endings and provider waits."""

    def __init__(self, settings: Settings, router: LLMRouter, registry: ToolRegistry,
                 sessions: sessionmaker[Session], hooks: Hooks | None = None,
                 leases: LeaseKeeper | None = None, cancels: CancelWatch | None = None):
        self.settings = settings
        self.router = router
        self.registry = registry
        self.sessions = sessions
        self.hooks = hooks if hooks is not None else Hooks.load(settings.hooks_enabled)
        self.leases = leases or LeaseKeeper(sessions, settings.step_deadline_s)
        self.cancels = cancels or CancelWatch(sessions)
        self.endings = Endings(self)
        self.compaction = Compactor(self)
        self.context_builder = ContextBuilder(self, self.compaction)
        self.recall = Recall(self)
        self.tool_turns = ToolTurns(self)
        self.provider = ProviderWaits(self, self.endings)

    # -- the step ---------------------------------------------------------------------
    def run(self, job_id: str, iteration: int, cause: Cause = "continue") -> list[Effect]:
        """Step `iteration` of the job, and the steps after it while a turn's calls all
        run in the step (local tools, `agentq.loop.tool_turn.LocalTurn`): the next model
        call follows in this task, no message sent for it. The effects sent."""
        effects: list[Effect] = []
        going_on: int | None = iteration
        while going_on is not None:
            local: list[LocalTurn] = []
            effects += self._run(job_id, going_on, cause, local)
            going_on = None
            for turn in local:  # after the plan's commit
                sent, going_on = self.tool_turns.run_local(turn)
                effects += sent
            cause = "callback"
        return effects

    def _run(self, job_id: str, iteration: int, cause: Cause,
             local: list[LocalTurn]) -> list[Effect]:
        """One step; a turn planned with local calls is added to `local`."""
        owner = uuid.uuid4().hex
        self.registry.look()  # before the transaction: one pooled connection at a time
        # a claim lost in a database crash is re-done by the next delivery or the sweeper
        with UnitOfWork(self.sessions, durable=False, autoflush=False) as uow:
            claimed = claim(uow.session, uuid.UUID(job_id), iteration, owner,
                            self.settings.step_deadline_s, self.settings.history_max_messages)
            if claimed is None:
                log.info("step skipped", extra={"job_id": job_id, "iteration": iteration,
                                                "cause": cause})
                return []
            job, who = claimed
            uow.holds(job)  # the claim's UPDATE locked its row
            lease_until = job.step_lease_until
            outcome = self._prepare(uow, job, who, cause)
        if outcome is None:
            return uow.sent

        # the model may outlast one step deadline: the lease is renewed meanwhile; a
        # cancel recorded meanwhile stops the model calls (agentq.loop.cancel_watch)
        with self.leases.hold(job_id, owner, lease_until), \
                self.cancels.watch(job_id) as token, cancellable(token):
            try:
                reply = self._think(job_id, iteration, owner, outcome)
            except CallCancelled:
                return self.endings.cancelled(job_id, iteration, owner)
            except ProviderError as exc:
                return self.provider.failed(job_id, iteration, owner, exc)
            if not isinstance(reply, LLMReply):
                return reply  # the step ended before the model's call: its effects

        # the model answered: its reply is kept through a database outage (written when the
        # database answers, within a step deadline) rather than lost and asked for again
        planned, uow = ride_out(self.sessions, self.settings.step_deadline_s, "model reply",
                                lambda uow: self._persist(uow, uuid.UUID(job_id), iteration,
                                                          owner, reply, outcome),
                                autoflush=False, job_id=job_id)
        if planned is not None:
            local.append(planned)
        if self.hooks.loaded:
            self.hooks.after_turn({"job_id": job_id, "turn": iteration + 1,
                                   "model": reply.model, "content": reply.content,
                                   "tool_calls": [c.name for c in reply.tool_calls],
                                   "usage": {"input_tokens": reply.input_tokens,
                                             "output_tokens": reply.output_tokens}})
        return uow.sent

    def _think(self, job_id: str, iteration: int, owner: str,
               outcome: Turn) -> LLMReply | list[Effect]:
        """Steps 5-6 outside any transaction: the memories recalled, the summaries asked
        for, then the model's reply; or the effects of a step that ended before it."""
        self.recall(job_id, outcome, self.compaction.assemble)
        while outcome.compaction is not None and outcome.compaction.summarize:
            if not self.compaction.summarize(job_id, iteration, owner, outcome):
                return []
        tokens = self.compaction.overflow_tokens(outcome)
        if tokens is not None:
            return self.endings.overflow(job_id, iteration, owner, tokens=tokens,
                                         budget=outcome.budget, model=outcome.model)
        if outcome.recorded is not None:
            return outcome.recorded
        on_delta = delta_publisher(self, job_id, outcome.turn) if outcome.stream else None
        return self.router.chat(
            outcome.messages, outcome.tools, model=outcome.model,
            max_tokens=outcome.max_tokens, **({"on_delta": on_delta} if on_delta else {}))

    # -- 1. claim ---------------------------------------------------------------------
    def _claim(self, session: Session, job_id: uuid.UUID, iteration: int,
               owner: str) -> Job | None:
        """The claim alone (`agentq.loop.claim`) under this Stepper's step deadline: the
        job, or None when not claimed."""
        claimed = claim(session, job_id, iteration, owner, self.settings.step_deadline_s)
        return claimed[0] if claimed is not None else None

    # -- 2..5 -------------------------------------------------------------------------
    def _prepare(self, uow: UnitOfWork, job: Job, who: Who, cause: Cause) -> Turn | None:
        """The step's first transaction: None when the step ends here (its effects are on
        the unit of work), else the turn for the model call. `who`: what the claim read
        with it."""
        session, now = uow.session, utcnow()
        user, conversation, persona = who.user, who.conversation, who.persona
        # the turn's messages as the claim read them (Postgres), those this transaction
        # writes added as written; elsewhere the history is read as the question is written
        asked = who.context
        if job.status == JobStatus.QUEUED:
            asked = _begin(uow, job, conversation, now, self.settings.history_max_messages,
                           asked)

        resuming = job.waiting_for == WaitingFor.PROVIDER
        if resuming:  # the provider's turn again: the job runs (its turn began already)
            resume_from_provider(job)

        if job.phase == Phase.TOOLS and not isinstance(
                self.tool_turns.collect(uow, job, conversation, cause, who.calls, asked),
                rules.Collect):
            # the job waits (its sub-agents, another dispatch), or its lost calls went out
            job.step_owner = job.step_lease_until = None
            return None

        turn_no = job.iteration + 1
        # a turn resumed (after waiting for its provider, or re-driven) was announced already
        started = _turn_started(session, job, resuming)
        if _steer(uow, job, conversation, turn_no, started, now):
            asked = None  # read with the question: the same order whoever wrote them

        if budget.roll_period(user, now, self.settings.budget_period_days):
            log.info("budget period reset", extra={"user_id": str(user.id)})
        limits = self._limits(job, user, persona, now)
        stop = check_limits(limits)
        recorded = None
        if stop is None and job.replay_mode == ReplayMode.RECORDED:
            recorded = replay.recorded_reply(session, job, turn_no)
            if recorded is None:
                stop = Stop(StopReason.ERROR,
                            f"The original job made no model call {turn_no}; "
                            "a recorded replay cannot go further.")
        if stop is not None:
            self.endings.stop_turn(uow, job, turn_no, stop)
            return None

        allowed = self.registry.allowed_modules(persona.allowed_modules if persona else None,
                                                job.tenant_id)
        offered = self.registry.offered(user.permission_level, allowed)
        model = job.model or (persona.default_model if persona else None) or self.settings.model
        approval_tools = persona.approval_tools if persona is not None else None
        if recorded is not None:  # answered from the recording: no context to build
            for kind, data in replay.recorded_compactions(session, job, turn_no):
                uow.event(job.id, kind, **data)
            if not started:
                uow.event(job.id, "message_start", role="assistant", turn=turn_no)
            return Turn([], self.registry.specs(offered), model, None, recorded,
                        approval_tools=approval_tools)
        system = (persona.system_prompt if persona and persona.system_prompt
                  else self.settings.default_system_prompt)
        max_tokens = remaining_output_budget(
            limits, persona.max_tokens_per_request if persona else None)
        turn = Turn([], self.registry.specs(offered), model, max_tokens,
                    stream=bool(job.stream or (persona is not None and persona.stream)),
                    turn=job.iteration + 1, resumed=started, approval_tools=approval_tools)
        extras = context_layers.extras(persona, conversation, turn.tools,
                                       context_layers.TenantLayers(who.bootstrap, who.skills))
        stop = self.context_builder.build(uow, job, conversation, who.summary, system, turn,
                                          who.has_memories, extras, asked)
        if stop is not None:
            self.endings.stop_turn(uow, job, turn_no, stop)
            return None
        if self.settings.answer_after_tools and context.last_tools_succeeded(
                list(reversed(turn.built.inrun))):
            turn.tools = []  # the results are in: the model answers from them
        return turn

    def _limits(self, job: Job, user: User, persona: Persona | None,
                now: datetime) -> Limits:
        """The limits fixed when the job was made (the job object's `limits_applied`; a
        job made before they were recorded gets them now) and its user's budget."""
        own = effective_limits(self.settings.max_iterations, self.settings.max_job_tokens,
                               self.settings.max_seconds,
                               *((job.limits_applied,) if job.limits_applied else
                                 (persona.limits if persona else None, job.limits)))
        if job.limits_applied is None:
            job.limits_applied = own
        return rules.turn_limits(
            iteration=job.iteration, own=own,
            cancel_requested=job.cancel_requested_at is not None,
            recorded_replay=job.replay_mode == ReplayMode.RECORDED,  # no budget: costs nothing
            budget_limit=user.token_budget_monthly, budget_used=user.tokens_used_this_month,
            budget_reset_at=user.budget_reset_at,
            tokens_used=job.input_tokens + job.output_tokens, started_at=job.started_at,
            now=now)

    # -- 7. persist -------------------------------------------------------------------
    def _persist(self, uow: UnitOfWork, job_id: uuid.UUID, iteration: int, owner: str,
                 reply: LLMReply, turn: Turn) -> LocalTurn | None:
        session, now = uow.session, utcnow()
        turn_no = iteration + 1
        charged = turn.recorded is None
        cost = estimate_cost(reply.model, reply.input_tokens, reply.output_tokens) \
            if charged else 0.0
        advance = {
            "job_id": job_id, "at_iteration": iteration, "owner": owner, "turn_no": turn_no,
            "now": now, "add_input": reply.input_tokens, "add_output": reply.output_tokens,
            "cost": cost}
        together = session.get_bind().dialect.name == "postgresql"
        if together:  # the usage written by the compare-and-set's own statement
            advance.update(usage_parameters(iteration=turn_no, reply=reply, cost=cost,
                                            keep_reply=True, now=now))
        job: Job | None = session.execute(
            ADVANCE_WITH_USAGE[charged] if together else ADVANCE,
            advance).scalar_one_or_none()
        if job is None:
            log.warning("step lost its lease; reply discarded",
                        extra={"job_id": str(job_id), "iteration": iteration})
            return None
        uow.holds(job)  # the compare-and-set's UPDATE locked its row
        if not together:
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
            self.endings.stop_turn(uow, job, turn_no, CANCELLED)
            return None
        decision = decide(reply, [t.name for t in turn.tools],
                          cached_quotas(session, job.tenant_id,
                                        self.settings).tool_calls_per_turn)
        match decision:
            case Finish(content=content, cut=True, not_run=not_run):
                self.endings.cut_short(uow, job, turn_no, reply, content, not_run,
                                       turn.max_tokens)
            case Finish(content=content):
                self.endings.finish(uow, job, turn_no, reply, content)
            case RunTools(calls=calls, content=content):
                return self.tool_turns.plan(uow, job, turn_no, reply, calls, content, now,
                                            turn.approval_tools)
            case Stop() as stop:
                self.endings.stop(uow, job, stop)
            case _:
                assert_never(decision)
        return None

    def fail(self, job_id: str, exc: BaseException) -> list[Effect]:
        """A bug in this job's step: the job fails (`fail_job`), the hooks hear it."""
        return fail_job(self.sessions, job_id, exc, self.hooks)


def _begin(uow: UnitOfWork, job: Job, conversation: Conversation, now: datetime,
           history: int, read: Asked | None) -> Asked:
    """Step 2, a job's first step: it runs (`job_start`), its question is stored; the
    messages stored (the job's own, not read back) and the `history` messages before them,
    oldest first: `read`'s, the claim's (the question numbered after them and sent with
    the next statement, `store.append_after`), else read with the question's write
    (`store.append_with_history`)."""
    start(job, now)
    uow.event(job.id, "job_start", conversation_id=str(job.conversation_id))
    question = describe_attachments(job.content, job.attachments)
    if read is not None:
        asked = (append_after(uow.session, conversation, job.id, [("user", question, None)],
                              now), read[1])
    else:
        asked = append_with_history(uow.session, conversation.id, job.id,
                                    ("user", question, None), history, now)
    uow.event(job.id, "message_start", role="user", kind="question", content=question)
    uow.event(job.id, "message_end", role="user", kind="question", content=question)
    return asked


def _steer(uow: UnitOfWork, job: Job, conversation: Conversation, turn_no: int,
           started: bool, now: datetime) -> bool:
    """The turn announced (`turn_start`, unless an earlier run of its step did), and the
    steering input sent while the job ran joins it; whether there was any."""
    session = uow.session
    inputs = pending_inputs(session, job.id) if job.pending_inputs else []
    job.pending_inputs = 0
    if not started:
        uow.event(job.id, "turn_start", turn=turn_no, triggered_by=rules.turn_trigger(
            iteration=job.iteration, replay=job.replay_of is not None,
            branch=job.iteration == 0 and is_branch_start(session, job, conversation),
            sub_agent=job.parent_job_id is not None,
            follow_up=bool((job.meta or {}).get("follow_up_of")), steered=bool(inputs)))
    if not inputs:
        return False
    append_messages(session, conversation.id, job.id,
                    [("user", entry.content, None) for entry in inputs], now)
    for entry in inputs:
        entry.consumed_at = now
        uow.event(job.id, "message_start", role="user", kind="steering",
                  content=entry.content)
        uow.event(job.id, "message_end", role="user", kind="steering", content=entry.content)
        uow.event(job.id, "steering_injected", input_id=str(entry.id), turn=turn_no)
    return True


def _turn_started(session: Session, job: Job, resuming: bool) -> bool:
    """Whether this turn's `turn_start` was written by an earlier run of this step (it
    waited for its provider, or was re-driven while its model call ran): then the turn
    goes on and is not announced twice. A first run needs no query."""
    if not (resuming or job.provider_attempts or job.redrives):
        return False
    started: int = session.execute(
        select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job.id, JobEvent.type == "turn_start")).scalar_one()
    return started > job.iteration
