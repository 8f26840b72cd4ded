"""Replaying a past job: the same input again, in a fresh conversation that holds the
original's history up to that message, never touching the original's rows.

- `recorded`: each model call is answered from the original's stored replies (token_logs),
  in order, calling no provider; the tools run again, and a tool whose result differs from
  the original's records a `replay_diverged` event (the replay goes on with the recordings).
- `live`: the model is called again, optionally another model or persona.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Iterable, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import NotFound, ValidationFailed
from agentq.ids import new_id
from agentq.llm.types import LLMReply
from agentq.loop.decision import applied_limits
from agentq.loop.effects import NextStep
from agentq.loop.lifecycle import ReplayMode, WaitingFor, new_job, take_conversation
from agentq.loop.states import REPLAY_MODES
from agentq.loop.uow import UnitOfWork
from agentq.models import Conversation, Job, Message, Persona, TokenLog, ToolCall


def allowed_models(settings: Settings, persona: Persona | None) -> list[str]:
    """The models a live replay by a non-admin key may pick: the persona's default model
    and the configured ones (AGENTQ_MODEL, AGENTQ_FALLBACK_MODELS, the model catalogue)."""
    names = [persona.default_model] if persona is not None and persona.default_model else []
    names += [settings.model, *settings.fallback_models, *settings.models]
    return list(dict.fromkeys(names))


def check_model(session: Session, settings: Settings, model: str | None,
                persona_ids: Iterable[uuid.UUID | None], tenant_id: uuid.UUID,
                action: str = "replay") -> None:
    """Raise ValidationFailed unless `model` (None: the original's) is one a non-admin key
    may pick for a replay under each of the personas: an admin key may pick any."""
    if model is None:
        return
    for persona_id in set(persona_ids):
        persona = session.get(Persona, persona_id) if persona_id is not None else None
        if persona is not None and persona.tenant_id != tenant_id:
            persona = None  # another tenant's: absent (create_replay answers 404)
        allowed = allowed_models(settings, persona)
        if model not in allowed:
            raise ValidationFailed(
                {"model": [f"This key may {action} with {', '.join(allowed)} only (the "
                           "persona's default model and the configured ones); an admin key "
                           "may pick any model."]},
                "The model is not one this key may pick.")


def create_replay(uow: UnitOfWork, settings: Settings, original: Job, mode: str, *,
                  model: str | None = None, persona_id: uuid.UUID | None = None,
                  api_key_id: uuid.UUID | None = None,
                  batch_id: uuid.UUID | None = None) -> Job:
    """A new job asking the original's question again in a copy of its conversation (up
    to the question); a batch's replays wait for admission, a single one starts after
    the commit."""
    session = uow.session
    if mode not in REPLAY_MODES:
        raise ValidationFailed({"mode": [f"Must be one of {', '.join(REPLAY_MODES)}."]})
    if mode == ReplayMode.RECORDED and (model or persona_id):
        raise ValidationFailed({"mode": ["A recorded replay answers from the original's "
                                         "replies; model and persona_id need mode live."]})
    persona = session.get(Persona, persona_id) if persona_id is not None else None
    if persona_id is not None and (persona is None or persona.tenant_id != original.tenant_id):
        raise NotFound("persona", str(persona_id))
    now = utcnow()
    source = session.get(Conversation, original.conversation_id)
    if source is None:  # deleted since the caller read the original
        raise NotFound("conversation", str(original.conversation_id))
    answers_as = persona or (session.get(Persona, original.persona_id)
                             if original.persona_id else None)
    job = new_job(tenant_id=original.tenant_id, conversation_id=new_id(),
                  user_id=original.user_id, persona_id=persona_id or original.persona_id,
                  api_key_id=api_key_id, content=original.content,
                  attachments=original.attachments, meta=dict(original.meta or {}),
                  model=model or original.model, limits=original.limits, now=now,
                  limits_applied=applied_limits(
                      settings, answers_as.limits if answers_as else None, original.limits),
                  waiting_for=WaitingFor.BATCH if batch_id else None,
                  replay_of=original.id, replay_mode=ReplayMode(mode),
                  batch_id=batch_id)
    conversation = Conversation(
        id=job.conversation_id, tenant_id=original.tenant_id, user_id=original.user_id,
        persona_id=persona_id or original.persona_id, platform=source.platform,
        platform_channel_id=source.platform_channel_id,
        platform_thread_id=source.platform_thread_id,
        scope_key=json.dumps(["replay", str(job.id)]), message_seq=0, started_at=now,
        last_active_at=now, is_summarized=False)
    session.add(conversation)
    history = _history_before(session, original, settings.history_max_messages)
    for seq, (role, content, tokens, model_used, created_at) in enumerate(history, start=1):
        session.add(Message(id=new_id(), conversation_id=conversation.id, job_id=None,
                            seq=seq, role=role, content=content, token_count=tokens,
                            model_used=model_used, created_at=created_at))
    conversation.message_seq = len(history)
    session.add(job)
    session.flush()
    if batch_id is None:
        take_conversation(conversation, job)
        uow.effect(NextStep(str(job.id), 0, "start"))
    return job


def _history_before(session: Session, original: Job,
                    limit: int) -> Sequence[tuple[str, str, int, str | None, datetime]]:
    """The original conversation's last `limit` messages before the original job's own."""
    first = session.execute(select(func.min(Message.seq)).where(
        Message.job_id == original.id)).scalar()
    query = select(Message.role, Message.content, Message.token_count, Message.model_used,
                   Message.created_at).where(
        Message.conversation_id == original.conversation_id)
    if first is not None:
        query = query.where(Message.seq < first)
    else:
        query = query.where(Message.created_at < original.created_at)
    rows = session.execute(query.order_by(Message.seq.desc()).limit(limit)).all()
    return list(reversed(rows))


def recorded_reply(session: Session, job: Job, turn: int) -> LLMReply | None:
    """The original's reply for model call `turn` (1-based), or None if it made fewer."""
    record = session.execute(select(TokenLog.reply).where(
        TokenLog.job_id == job.replay_of, TokenLog.iteration == turn)).scalar_one_or_none()
    return LLMReply.from_record(record) if record else None


def divergences(session: Session, job: Job, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """Tool results of this turn that differ from the original's at the same position."""
    if not calls:
        return []
    original = {c.position: c for c in session.execute(select(ToolCall).where(
        ToolCall.job_id == job.replay_of, ToolCall.iteration == calls[0].iteration)).scalars()}
    out = []
    for call in calls:
        before = original.get(call.position)
        if before is None or before.name != call.name or _outcome(before) != _outcome(call):
            out.append({"turn": call.iteration, "position": call.position, "tool": call.name,
                        "original": _outcome(before) if before else None,
                        "replay": _outcome(call)})
    return out


def _outcome(call: ToolCall) -> dict[str, Any]:
    record = call.result or {}
    if record.get("ok"):
        return {"ok": True, "result": record.get("result")}
    return {"ok": False, "error": (record.get("error") or {}).get("code")}


def compare(session: Session, replay: Job) -> dict[str, Any]:
    """The original's and the replay's answers, tool calls and usage side by side."""
    original = session.get(Job, replay.replay_of)

    def side(job: Job | None) -> dict[str, Any] | None:
        if job is None:
            return None
        calls = session.execute(select(ToolCall).where(ToolCall.job_id == job.id)
                                .order_by(ToolCall.iteration, ToolCall.position)).scalars()
        return {"job_id": str(job.id), "status": job.status,
                "finish_reason": job.finish_reason,
                "content": (job.response or {}).get("content"),
                "tool_calls": [{"turn": c.iteration, "name": c.name, "arguments": c.arguments,
                                **_outcome(c)} for c in calls],
                "usage": {"input_tokens": job.input_tokens,
                          "output_tokens": job.output_tokens,
                          "cost_estimate": job.cost_estimate},
                "model": job.model}
    a, b = side(original), side(replay)
    return {"original": a, "replay": b, "mode": replay.replay_mode,
            "same_answer": bool(a and b and a["content"] == b["content"]),
            "same_tool_calls": bool(a and b and [
                (c["name"], c["arguments"]) for c in a["tool_calls"]] == [
                (c["name"], c["arguments"]) for c in b["tool_calls"]])}


def recorded_compactions(session: Session, job: Job, turn: int
                         ) -> list[tuple[str, dict[str, Any]]]:
    """The original's compaction at model call `turn`, reproduced in a recorded replay: its
    `compaction_start`/`compaction_end` events (marked `replayed`) to emit, and its summary
    copied into the replay's conversation, mapped onto the replay's message numbers (the
    replay holds the same history and in-run messages, shifted by the question's seq)."""
    from agentq.models import ConversationSummary, JobEvent
    events = session.execute(
        select(JobEvent.seq, JobEvent.type, JobEvent.data).where(
            JobEvent.job_id == job.replay_of,
            JobEvent.type.in_(("compaction_start", "compaction_end")))
        .order_by(JobEvent.seq)).all()
    out: list[tuple[str, dict[str, Any]]] = []
    started = False
    for _seq, kind, data in events:
        if kind == "compaction_start":
            started = data.get("turn") == turn
            if started:
                out.append((kind, {**data, "replayed": True}))
        elif started:
            out.append((kind, {**data, "replayed": True}))
            started = False
            version = data.get("summary_version")
            if version is None:
                continue
            original = session.get(Job, job.replay_of)
            if original is None:  # deleted since its events were read: nothing to copy
                continue
            summary = session.execute(select(ConversationSummary).where(
                ConversationSummary.conversation_id == original.conversation_id,
                ConversationSummary.version == version)).scalar_one_or_none()
            if summary is None:
                continue
            q_orig = _question_seq(session, original.id)
            q_new = _question_seq(session, job.id)
            current = session.execute(select(func.max(ConversationSummary.version)).where(
                ConversationSummary.conversation_id == job.conversation_id)).scalar() or 0
            if q_orig is None or q_new is None:
                continue
            session.add(ConversationSummary(
                conversation_id=job.conversation_id, version=current + 1,
                content=summary.content,
                through_seq=max(0, summary.through_seq - q_orig + q_new),
                messages_summarized=summary.messages_summarized, job_id=job.id,
                model=summary.model, input_tokens=0, output_tokens=0, created_at=utcnow()))
    return out


def _question_seq(session: Session, job_id: uuid.UUID) -> int | None:
    return session.execute(select(func.min(Message.seq)).where(
        Message.job_id == job_id, Message.role == "user")).scalar()
