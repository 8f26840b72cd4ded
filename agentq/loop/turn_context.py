"""A turn's context, built in the step's first transaction (step 5 of `agentq.loop.step`).

The layers (`agentq.loop.context.Layers`): the system prompt, the persona's and tenant's
layers (`agentq.loop.layers`), the conversation's summary, the history before the job's
question (the newest AGENTQ_HISTORY_MAX_MESSAGES after the summary), the question, what the
run added since, and the backlog of older messages not summarised yet. The room the
memories will take is kept (the recall runs outside the transaction: `agentq.loop.recall`),
a `before_turn` hook may stop the job, and past the threshold a compaction is planned
(`agentq.loop.compaction`).

The job's own messages and the history before its question are one read: on Postgres the
step's claim's (`agentq.loop.claim`, `Who.context`), the messages the step writes before
the context is built (the question, the tools' results) added as written; elsewhere
`_OWN_AND_HISTORY` here, or on a job's first step the question's write.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Select, bindparam, false, func, or_, select, text, true, union_all

from agentq import memory
from agentq.loop import context
from agentq.loop.compaction import Compactor
from agentq.loop.decision import Stop
from agentq.loop.layers import Extras
from agentq.loop.lifecycle import StopReason
from agentq.loop.store import STORED_MESSAGE
from agentq.loop.turn import Turn, Wired, hook_ctx
from agentq.loop.uow import UnitOfWork
from agentq.models import Conversation, ConversationSummary, Job, Message

Asked = context.TurnMessages
"""A turn's messages known before its context is built (the claim read them, and those
this transaction wrote were added as written), or a first step's as its question's write
returned them."""

_OWN_MESSAGES = (select(*STORED_MESSAGE)
                 .where(Message.job_id == bindparam("job_id"),
                        or_(Message.seq > bindparam("through"), Message.role == "user"))
                 .order_by(Message.seq))
"""The job's question (its first message) and its messages after the summary."""


def _own_and_history() -> Select[Any]:
    """`_OWN_MESSAGES` and the history before the job's question (the `limit` messages
    before it; before the conversation's next seq when the job has none), in
    one statement: (own, seq, role, content, token_count) rows, the job's own first, each
    part in seq order. What `recent_messages` reads bounded by the question's seq, without
    waiting for the first read's answer to bound the second."""
    own = _OWN_MESSAGES.order_by(None).cte("own")
    next_seq = (select(Conversation.message_seq + 1)
                .where(Conversation.id == bindparam("conversation_id")).scalar_subquery())
    top = func.coalesce(select(func.min(own.c.seq)).scalar_subquery(), next_seq)
    limit = bindparam("limit", type_=Message.seq.type)
    history = (select(*STORED_MESSAGE)
               .where(Message.conversation_id == bindparam("conversation_id"),
                      Message.seq < top, Message.seq >= top - limit)
               .order_by(Message.seq.desc()).limit(limit).subquery("history"))
    parts = union_all(select(true().label("own"), *own.c), select(false(), *history.c))
    return select(parts.subquery("parts")).order_by(text("own DESC"), text("seq"))


_OWN_AND_HISTORY = _own_and_history()


class ContextBuilder:
    """The contexts of one Stepper's turns (its wiring read from it at each call; the
    compaction is the Stepper's)."""

    def __init__(self, step: Wired, compaction: Compactor):
        self.step = step
        self.compaction = compaction

    def build(self, uow: UnitOfWork, job: Job, conversation: Conversation,
              summary: ConversationSummary | None, system: str, turn: Turn,
              has_memories: bool, extras: Extras, asked: Asked | None = None) -> Stop | None:
        """The layers of this turn's context; a compaction planned when they pass the
        threshold (the summary itself is asked for outside this transaction). A
        `before_turn` hook may stop the job here. `asked`: the job's messages, when this
        transaction wrote all of them (its question, on its first step), and the history
        before them, read as they were written."""
        session, settings, hooks = uow.session, self.step.settings, self.step.hooks
        through = summary.through_seq if summary else 0
        # the job's question (its first message) and what this run added since the summary:
        # one read (the job's user messages come with it; those summarised are dropped)
        if asked is not None:
            own, recent = asked
        else:  # the history before its question read with them, in the same statement
            own, recent = [], []
            for mine, *row in session.execute(_OWN_AND_HISTORY, {
                    "job_id": job.id, "through": through, "conversation_id": conversation.id,
                    "limit": settings.history_max_messages}):
                (own if mine else recent).append(context.StoredMessage(*row))
        question = own[0] if own else None
        top = question.seq if question else conversation.message_seq + 1
        history = [m for m in recent if m.seq > through and m.seq < top]
        # older messages than that read, not in the summary yet: summarised, never dropped
        turn.conversation_id = conversation.id
        turn.backlog_end = top - 1 - settings.history_max_messages
        backlog, backlog_more = self.compaction.backlog(session, turn, through)
        inrun = ([m for m in own[1:] if m.seq > through] if question is not None else [])
        room = context.input_budget(context.context_window(turn.model, settings),
                                    turn.max_tokens)
        recalls = question is not None and has_memories
        # the recall runs later (its embedding is a network call): its room is kept now
        turn.layers = context.Layers(
            system, summary.content if summary else None, history, question, inrun,
            memory_reserve=context.memory_reserve(memory.RECALL_K, memory.MAX_MEMORY_CHARS,
                                                  room) if recalls else 0,
            backlog=backlog, backlog_more=backlog_more, **extras)
        turn.budget = room
        turn.summary_version = summary.version if summary else 0
        if recalls:
            turn.recall_user, turn.recall_key = job.user_id, job.api_key_id
        # once per turn: not again when its step runs again (after waiting for the
        # provider, or re-driven), since an earlier run of it already asked the hook
        if hooks.loaded and not turn.resumed:
            stopped = hooks.before_turn({**hook_ctx(job, job.iteration + 1),
                                         "messages": self.compaction.assemble(turn)})
            if stopped is not None:
                hook_name, reason = stopped
                return Stop(StopReason.HOOK, reason, {"hook": hook_name})
        self.compaction.plan(uow, job, turn)
        return None
