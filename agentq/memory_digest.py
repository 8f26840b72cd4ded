"""Idle conversations summarised into memories (seeds 000/003), on the maintenance queue.

A conversation with no job running whose last message is older than AGENTQ_MEMORY_IDLE_S,
and with messages after the last one summarised this way (`memory_summarized_seq`), is
summarised by the model (the router, as any call) into one memory of its user
(`source: conversation`), embedded like any memory, in the conversation's tenant.

Idempotent: the memory's id is derived from (conversation, last message seq), and the
conversation's `memory_summarized_seq` is advanced by a compare-and-set in the same
transaction as the insert, so a task delivered twice, or two beat workers looking at once,
store one memory per conversation and message seq. A model or embedding failure leaves the
conversation for the next look.
"""
from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import sessionmaker

from agentq import memory
from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import ProviderError
from agentq.llm.pricing import estimate_cost
from agentq.loop.context import render_tool_result, truncate
from agentq.loop.store import record_usage
from agentq.loop.uow import UnitOfWork, ride_out
from agentq.models import Conversation, ConversationSummary, Memory, Message

log = logging.getLogger(__name__)

SOURCE = "conversation"
MAX_MESSAGES = 200
"""Newest messages of the unsummarised stretch a digest reads (older ones through the
conversation summary, when there is one)."""
MAX_TRANSCRIPT_CHARS = 24_000
NOTHING = "NOTHING"
DIGEST_SYSTEM_PROMPT = (
    "You read a conversation between a user and an AI assistant and write what is worth "
    "remembering about the user for later conversations: facts they stated, preferences, "
    "goals, decisions and what is still open. Keep names, numbers and identifiers exactly. "
    "Write a short paragraph, in the third person. If nothing is worth remembering, reply "
    f"with {NOTHING} only.")


def digest_id(conversation_id: uuid.UUID, seq: int) -> uuid.UUID:
    """The memory one digest writes: the same for every delivery of it."""
    return uuid.uuid5(conversation_id, f"memory-digest:{seq}")


def idle_conversations(sessions: sessionmaker, settings: Settings,
                       now: datetime) -> list[uuid.UUID]:
    cutoff = now - timedelta(seconds=settings.memory_idle_s)
    with sessions() as session:
        return list(session.execute(
            select(Conversation.id).where(
                Conversation.active_job_id.is_(None),
                Conversation.last_active_at < cutoff,
                Conversation.message_seq > Conversation.memory_summarized_seq)
            .order_by(Conversation.last_active_at)
            .limit(settings.memory_digest_batch)).scalars())


def summarize_idle(settings: Settings, sessions: sessionmaker, router,
                   now: datetime | None = None) -> int:
    """Summarise the idle conversations due (at most AGENTQ_MEMORY_DIGEST_BATCH); the
    number of memories written."""
    now = now or utcnow()
    written = 0
    for conversation_id in idle_conversations(sessions, settings, now):
        try:
            written += digest(settings, sessions, router, conversation_id, now)
        except ProviderError as exc:
            log.warning("conversation not summarised into memory; tried again later",
                        extra={"conversation_id": str(conversation_id), "error": exc.message})
    return written


def digest(settings: Settings, sessions: sessionmaker, router, conversation_id: uuid.UUID,
           now: datetime) -> int:
    """One conversation into one memory (1), or nothing (0: not due any more, done by
    another delivery, or nothing worth remembering)."""
    cutoff = now - timedelta(seconds=settings.memory_idle_s)
    with sessions() as session:
        conversation = session.get(Conversation, conversation_id)
        if (conversation is None or conversation.active_job_id is not None
                or conversation.last_active_at >= cutoff
                or conversation.message_seq <= conversation.memory_summarized_seq):
            return 0
        seq, since = conversation.message_seq, conversation.memory_summarized_seq
        tenant_id, user_id = conversation.tenant_id, conversation.user_id
        rows = list(reversed(session.execute(
            select(Message.seq, Message.role, Message.content)
            .where(Message.conversation_id == conversation_id, Message.seq > since,
                   Message.seq <= seq)
            .order_by(Message.seq.desc()).limit(MAX_MESSAGES)).all()))
        earlier = None
        if rows and rows[0].seq > since + 1:  # older unsummarised ones: their summary
            earlier = session.execute(
                select(ConversationSummary.content).where(
                    ConversationSummary.conversation_id == conversation_id)
                .order_by(ConversationSummary.version.desc()).limit(1)).scalar_one_or_none()
    reply = None
    if rows:
        reply = router.chat(digest_request(rows, earlier, settings.tool_result_max_chars), [],
                            model=settings.model, max_tokens=512)
    content = (reply.content.strip() if reply is not None else "")
    worth = bool(content) and content.strip(" .").upper() != NOTHING
    vector = router.embed(content[:8000]) if worth else None

    def keep(uow: UnitOfWork) -> int:
        session = uow.session
        advanced = cast("CursorResult[Any]", session.execute(  # an UPDATE's: it has rowcount
            update(Conversation).where(Conversation.id == conversation_id,
                                       Conversation.memory_summarized_seq < seq)
            .values(memory_summarized_seq=seq))).rowcount
        if not advanced:  # another delivery wrote it first
            return 0
        if reply is not None:
            cost = estimate_cost(reply.model, reply.input_tokens, reply.output_tokens)
            record_usage(session, user_id=user_id, conversation_id=conversation_id,
                         job_id=None, iteration=0, reply=reply, cost=cost, now=now)
        if vector is None:  # not worth remembering: nothing was embedded
            log.info("idle conversation had nothing to remember",
                     extra={"conversation_id": str(conversation_id), "through_seq": seq})
            return 0
        if session.get(Memory, digest_id(conversation_id, seq)) is not None:
            return 0
        stored = memory.remember(session, tenant_id=tenant_id, user_id=user_id,
                                 content=content, embedding=vector,
                                 model=settings.embedding_model, source=SOURCE,
                                 conversation_id=conversation_id)
        stored.id = digest_id(conversation_id, seq)
        return 1

    # the model digested it: the memory is kept through a database outage (written when
    # the database answers, within a step deadline) rather than lost and asked for again
    kept, _ = ride_out(sessions, settings.step_deadline_s, "memory", keep,
                       conversation_id=str(conversation_id))
    if not kept:
        return 0
    log.info("idle conversation summarised into memory",
             extra={"conversation_id": str(conversation_id), "through_seq": seq,
                    "messages": len(rows)})
    return 1


def digest_request(rows, earlier: str | None, max_tool_chars: int) -> list[dict[str, Any]]:
    lines = []
    for _seq, role, content in rows:
        if role == "tool_result":
            data = json.loads(content)
            lines.append(f"[tool result {data.get('name')}] "
                         f"{render_tool_result(data, min(max_tool_chars, 1000))}")
        elif role == "tool_call":
            data = json.loads(content)
            lines.append(f"[tool call {data.get('name')}] "
                         f"{json.dumps(data.get('arguments') or {})}")
        else:
            lines.append(f"[{role}] {content}")
    text = "\n".join(lines)
    if len(text) > MAX_TRANSCRIPT_CHARS:  # the newest part matters most
        text = "[... earlier messages cut]\n" + text[-MAX_TRANSCRIPT_CHARS:]
    parts = []
    if earlier:
        parts.append("A summary of the earlier conversation:\n" + truncate(earlier, 8000))
    parts.append("The conversation:\n" + text)
    return [{"role": "system", "content": DIGEST_SYSTEM_PROMPT},
            {"role": "user", "content": "\n\n".join(parts)}]
