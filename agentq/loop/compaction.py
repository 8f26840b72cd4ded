"""Compaction: keeping a turn's context inside the model's window.

When the assembled context passes AGENTQ_COMPACTION_THRESHOLD of the window, the step plans
a compaction (`compaction_plan.next_round`) inside its first transaction:

  - a custom strategy (AGENTQ_COMPACTION_STRATEGY, `agentq.hooks.compact_with`) compacts
    the messages itself; when it fails, the built-in compaction runs;
  - the built-in one prunes old tool results to stubs and, when that is not enough, folds
    the older turns into the conversation's summary: a model call made outside any
    transaction (`summarize`), its summary, usage and `compaction_end` written in one
    transaction after it, kept through a database outage. A step makes at most
    MAX_COMPACTION_ROUNDS summary calls; a longer backlog is folded on by the next turns.

`compaction_start`/`compaction_end` events frame each round; `before_compaction` may skip
one, `after_compaction` hears each end.
"""
from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.errors import ProviderError
from agentq.hooks import compact_with, load_strategy
from agentq.llm.pricing import estimate_cost
from agentq.llm.types import LLMReply
from agentq.loop import compaction_plan as plans
from agentq.loop import context
from agentq.loop.rules import MAX_COMPACTION_ROUNDS
from agentq.loop.store import STORED_MESSAGE, record_usage
from agentq.loop.turn import Turn, Wired, hook_ctx, leased
from agentq.loop.uow import UnitOfWork, ride_out
from agentq.models import ConversationSummary, Job, Message

log = logging.getLogger(__name__)


class Compactor:
    """The compaction of one Stepper's turns (its wiring read from it at each call)."""

    def __init__(self, step: Wired):
        self.step = step
        self.strategy = load_strategy(step.settings.compaction_strategy)

    # -- in the step's first transaction ----------------------------------------------
    def plan(self, uow: UnitOfWork, job: Job, turn: Turn) -> None:
        """Plan this turn's compaction when its context passes the threshold (a hook may
        skip it; a custom strategy may do it now), announce it, and assemble the messages
        (the summary itself is asked for outside this transaction: `summarize`)."""
        hooks = self.step.hooks
        plan = self.next_round(turn)
        if plan is not None and hooks.loaded and not hooks.before_compaction(
                {**hook_ctx(job, job.iteration + 1), "tokens": plan.tokens_before,
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
            self._start(uow, job.id, turn, plan)
            if not plan.summarize:
                self._end(uow, job, turn, "prune")
        if (plan is None or not plan.summarize) and not turn.resumed:
            uow.event(job.id, "message_start", role="assistant", turn=job.iteration + 1)
        # what the custom strategy gave is sent, not assembled and compacted a second time
        turn.messages = compacted or self.assemble(turn)

    def assemble(self, turn: Turn) -> list[dict[str, Any]]:
        """The turn's messages from its layers. History fills the room up to the
        compaction threshold, not to the window's edge: the rest is headroom for what
        token estimates miss (message framing, tokenizers)."""
        settings = self.step.settings
        messages = context.assemble(turn.built,
                                    budget=int(turn.budget * settings.compaction_threshold),
                                    history_max_tokens=settings.context_max_tokens,
                                    max_tool_chars=settings.tool_result_max_chars,
                                    stub_before=turn.stub_before)
        if turn.compacted_by is not None:
            messages = self._strategy_messages(turn, messages) or messages
        return messages

    def backlog(self, session: Session, turn: Turn, through: int
                ) -> tuple[list[context.StoredMessage], bool]:
        """The oldest chunk of the backlog (unsummarised messages older than the history
        read), and whether more follows it."""
        if turn.backlog_end <= through:
            return [], False
        chunk = [context.StoredMessage(*row) for row in session.execute(
            select(*STORED_MESSAGE)
            .where(Message.conversation_id == turn.conversation_id, Message.seq > through,
                   Message.seq <= turn.backlog_end)
            .order_by(Message.seq).limit(self.step.settings.history_max_messages)).all()]
        return chunk, bool(chunk) and chunk[-1].seq < turn.backlog_end

    def next_round(self, turn: Turn) -> plans.Compaction | None:
        settings = self.step.settings
        return plans.next_round(turn.built, turn.budget, settings.compaction_threshold,
                                settings.tool_result_max_chars,
                                settings.compaction_keep_turns,
                                plans.summary_chars(turn.budget, turn.built))

    def overflow_tokens(self, turn: Turn) -> int | None:
        """The tokens of a context that, compacted as far as it goes, still passes the
        model's window; None when it fits (or a custom strategy compacted it: fitting
        the window is then its business)."""
        max_chars = self.step.settings.tool_result_max_chars
        if turn.layers is None or turn.compacted_by is not None or context.fits(
                turn.layers, turn.budget, max_chars, turn.stub_before):
            return None
        return context.tokens_of(turn.layers, max_chars, turn.stub_before, history=())

    # -- the custom strategy ------------------------------------------------------------
    def _strategy_messages(self, turn: Turn, messages: list[dict[str, Any]]
                           ) -> list[dict[str, Any]] | None:
        """The custom strategy's compaction of `messages` (None: the built-in one runs)."""
        settings = self.step.settings
        return compact_with(self.strategy, settings.compaction_strategy, {
            "job_id": turn.job_id, "turn": turn.turn, "messages": [dict(m) for m in messages],
            "tokens": context.wire_tokens(messages), "budget": turn.budget,
            "threshold": settings.compaction_threshold})

    def _compact_custom(self, uow: UnitOfWork, job: Job, turn: Turn,
                        plan: plans.Compaction) -> list[dict[str, Any]] | None:
        """The context passed the threshold: the custom strategy compacts it instead of the
        built-in one; the messages it gave (None when it failed: the built-in one runs)."""
        turn.job_id = str(job.id)
        after = self._strategy_messages(turn, self.assemble(turn))
        if after is None:
            return None
        turn.compacted_by = name = self.step.settings.compaction_strategy
        uow.event(job.id, "compaction_start", turn=turn.turn,
                  tokens_before=plan.tokens_before, messages_before=plan.messages_before,
                  window=turn.budget, threshold=self.step.settings.compaction_threshold,
                  summarize_messages=0, round=1)
        stats = {"strategy": name, "tokens_before": plan.tokens_before,
                 "tokens_after": context.wire_tokens(after),
                 "messages_before": plan.messages_before, "messages_after": len(after)}
        uow.event(job.id, "compaction_end", **stats)
        if self.step.hooks.loaded:
            self.step.hooks.after_compaction({**hook_ctx(job, job.iteration + 1), **stats})
        return after

    # -- the events of a round ----------------------------------------------------------
    def _start(self, uow: UnitOfWork, job_id: Any, turn: Turn,
               plan: plans.Compaction) -> None:
        turn.compaction = plan
        turn.stub_before = plan.stub_before_seq
        uow.event(job_id, "compaction_start", turn=turn.turn,
                  tokens_before=plan.tokens_before, messages_before=plan.messages_before,
                  window=turn.budget, threshold=self.step.settings.compaction_threshold,
                  summarize_messages=len(plan.summarize), round=turn.rounds + 1)

    def _end(self, uow: UnitOfWork, job: Job, turn: Turn, strategy: str,
             **extra: Any) -> None:
        plan = turn.compaction
        if plan is None:
            raise RuntimeError("a compaction ended that was not started")
        after = context.tokens_of(turn.built, self.step.settings.tool_result_max_chars,
                                  turn.stub_before)
        messages = plans.message_count(turn.built)
        uow.event(job.id, "compaction_end", strategy=strategy,
                  tokens_before=plan.tokens_before, tokens_after=after,
                  messages_before=plan.messages_before, messages_after=messages, **extra)
        if self.step.hooks.loaded:
            self.step.hooks.after_compaction({
                "job_id": str(job.id), "turn": turn.turn, "strategy": strategy,
                "tokens_before": plan.tokens_before, "tokens_after": after,
                "messages_before": plan.messages_before,
                "messages_after": messages, **extra})

    # -- the summary, outside any transaction -------------------------------------------
    def summarize(self, job_id: str, iteration: int, owner: str, turn: Turn) -> bool:
        """Fold the planned older turns into the conversation's summary: a model call outside
        any transaction, then the summary, its usage and `compaction_end` in one. False when
        the job's lease was lost meanwhile."""
        plan, layers, settings = turn.compaction, turn.built, self.step.settings
        if plan is None:
            raise RuntimeError("no compaction planned to summarize")
        request = plans.summary_request(
            layers.summary, layers.question, plan.summarize, settings.tool_result_max_chars,
            max_chars=plans.summary_chars(turn.budget, layers),
            stub_before=turn.stub_before)
        failure: dict[str, Any] | None = None
        reply: LLMReply | None
        try:
            reply = self.step.router.chat(request, [], model=turn.model,
                                          max_tokens=plans.summary_max_tokens(turn.budget))
        except ProviderError as exc:
            log.warning("summary call failed", extra={"job_id": job_id,
                                                      "error": exc.message})
            reply, failure = None, {"code": exc.code, "message": exc.message}
        # the summary was made: it is kept through a database outage (written when the
        # database answers, within a step deadline) rather than lost and asked for again;
        # each try starts from the turn as it was before the first
        before = dict(vars(turn))

        def write(uow: UnitOfWork) -> bool:
            vars(turn).update(before)
            return self._write_summary(uow, job_id, iteration, owner, turn, reply, failure)
        written, _ = ride_out(self.step.sessions, settings.step_deadline_s, "summary", write,
                              job_id=job_id)
        if not written:
            return False
        turn.messages = self.assemble(turn)
        return True

    def _write_summary(self, uow: UnitOfWork, job_id: str, iteration: int, owner: str,
                       turn: Turn, reply: LLMReply | None,
                       failure: dict[str, Any] | None) -> bool:
        """`summarize`'s transaction: the summary (or the prune when there is none), its
        usage, `compaction_end`, and the next round's start when one is planned; it advances
        `turn`. False when the job's lease was lost meanwhile."""
        job = leased(uow.session, job_id, iteration, owner)
        if job is None:
            return False
        following = None
        if reply is None or not reply.content.strip():
            failure = (failure if reply is None else
                       {"code": "empty_summary", "message": "The model gave no summary."})
            self._end(uow, job, turn, "prune", error=failure)
        else:
            following = self._fold(uow, job, turn, reply)
        if following is not None:  # one more summary call before the model's turn
            self._start(uow, job.id, turn, following)
        else:
            turn.compaction = None
            if not turn.resumed:
                uow.event(job.id, "message_start", role="assistant", turn=iteration + 1)
        return True

    def _fold(self, uow: UnitOfWork, job: Job, turn: Turn,
              reply: LLMReply) -> plans.Compaction | None:
        """The summary stored, its usage billed, the turn's layers folded; the next round
        when one more summary call is due."""
        session, plan, now = uow.session, turn.compaction, utcnow()
        if plan is None:
            raise RuntimeError("no compaction planned to fold")
        through = plan.summarize[-1].seq
        cost = estimate_cost(reply.model, reply.input_tokens, reply.output_tokens)
        # what is stored is cut to the summary's budget, whatever the server sent
        summary, cut = plans.cut_summary(reply.content.strip(),
                                         plans.summary_max_tokens(turn.budget))
        session.add(ConversationSummary(
            conversation_id=job.conversation_id, version=turn.summary_version + 1,
            content=summary, through_seq=through, messages_summarized=len(plan.summarize),
            job_id=job.id, model=reply.model, input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens, created_at=now))
        _bill(session, job, turn, reply, cost, now)
        turn.layers = plans.after_summary(turn.built, summary, through)
        if turn.layers.backlog_more and not turn.layers.backlog:
            backlog, more = self.backlog(session, turn, through)
            turn.layers = dataclasses.replace(turn.layers, backlog=backlog,
                                              backlog_more=more)
        turn.summary_version += 1
        turn.rounds += 1
        following = self.next_round(turn) if turn.rounds < MAX_COMPACTION_ROUNDS else None
        if following is not None and not following.summarize:
            turn.stub_before = following.stub_before_seq  # pruning is enough now
            following = None
        self._end(uow, job, turn, "summarize", summary_version=turn.summary_version,
                  through_seq=through, summary_input_tokens=reply.input_tokens,
                  summary_output_tokens=reply.output_tokens,
                  **({"summary_truncated": True} if cut else {}))
        return following


def _bill(session: Session, job: Job, turn: Turn, reply: LLMReply, cost: float,
          now: datetime) -> None:
    """A summary call's usage: a token log of its own (iteration -version), and the job's."""
    record_usage(session, user_id=job.user_id, conversation_id=job.conversation_id,
                 job_id=job.id, iteration=-(turn.summary_version + 1),
                 reply=reply, cost=cost, now=now)
    job.input_tokens += reply.input_tokens
    job.output_tokens += reply.output_tokens
    job.cost_estimate += cost
