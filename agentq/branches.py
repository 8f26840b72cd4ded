"""Branching: a conversation continued from an earlier point of another, with new content
(POST /v1/conversations/<id>/branch; seed 001's `TurnTrigger::Branch`).

The branch is a new conversation of the same tenant and user holding a copy of the
source's history before the branch point (a message, or a job's first message), and the
latest summary that covers only messages before it; the source's rows are never touched.
Its first job is an ordinary submission into the new conversation (quotas, persona, limits
as for `/v1/continue`), and its first turn says `triggered_by: "branch"`.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import NotFound
from agentq.ids import new_id
from agentq.loop.submit import Submission, Submitted, submit
from agentq.loop.uow import UnitOfWork
from agentq.models import Conversation, ConversationSummary, Job, Message


@dataclass
class BranchPoint:
    message_id: uuid.UUID | None
    """The source's first message the branch does not hold (None: a job that wrote none)."""
    before_seq: int | None
    """Messages with a smaller seq are copied (None: by `before_time`)."""
    before_time: object | None = None


def branch_point(session: Session, source: Conversation, *,
                 at_message_id: uuid.UUID | None = None,
                 at_job_id: uuid.UUID | None = None) -> BranchPoint:
    """Where the branch leaves the source: 404 for a message or job not in it."""
    if at_message_id is not None:
        message = session.get(Message, at_message_id)
        if message is None or message.conversation_id != source.id:
            raise NotFound("message", str(at_message_id))
        return BranchPoint(message.id, message.seq)
    job = session.get(Job, at_job_id)
    if job is None or job.conversation_id != source.id or job.tenant_id != source.tenant_id:
        raise NotFound("job", str(at_job_id))
    first = session.execute(select(Message.id, Message.seq).where(
        Message.conversation_id == source.id, Message.job_id == job.id)
        .order_by(Message.seq).limit(1)).first()
    if first is None:  # the job wrote nothing yet: what came before it was made
        return BranchPoint(None, None, job.created_at)
    return BranchPoint(first.id, first.seq)


def create_branch(uow: UnitOfWork, settings: Settings, source: Conversation,
                  point: BranchPoint, sub: Submission) -> Submitted:
    """The branch conversation and its first job (`sub` without a conversation: it gets
    the new one). A non-admin key's branch is that key's own conversation."""
    session, now = uow.session, utcnow()
    branch_id = new_id()
    owner = str(sub.api_key_id) if sub.own_conversations and sub.api_key_id else None
    conversation = Conversation(
        id=branch_id, tenant_id=source.tenant_id, user_id=source.user_id,
        persona_id=source.persona_id, platform=source.platform,
        platform_channel_id=source.platform_channel_id,
        platform_thread_id=source.platform_thread_id,
        scope_key=json.dumps(["branch", str(branch_id), str(source.id),
                              str(point.message_id), owner]),
        message_seq=0, started_at=now, last_active_at=now, is_summarized=False,
        active_project=source.active_project,
        branched_from_conversation_id=source.id, branched_from_message_id=point.message_id)
    session.add(conversation)
    query = select(Message).where(Message.conversation_id == source.id)
    if point.before_seq is not None:
        query = query.where(Message.seq < point.before_seq)
    else:
        query = query.where(Message.created_at < point.before_time)
    copied = session.execute(query.order_by(Message.seq)).scalars().all()
    for m in copied:  # the same seq numbers: a copied summary's through_seq still holds
        session.add(Message(id=new_id(), conversation_id=branch_id, job_id=None,
                            seq=m.seq, role=m.role, content=m.content,
                            token_count=m.token_count, model_used=m.model_used,
                            created_at=m.created_at))
    conversation.message_seq = copied[-1].seq if copied else 0
    summary = session.execute(select(ConversationSummary).where(
        ConversationSummary.conversation_id == source.id,
        ConversationSummary.through_seq <= conversation.message_seq)
        .order_by(ConversationSummary.version.desc()).limit(1)).scalar_one_or_none()
    if summary is not None and copied:
        session.add(ConversationSummary(
            conversation_id=branch_id, version=1, content=summary.content,
            through_seq=summary.through_seq, messages_summarized=summary.messages_summarized,
            job_id=None, model=summary.model, input_tokens=0, output_tokens=0,
            created_at=now))
    session.flush()
    sub.incoming, sub.conversation_id = None, branch_id
    return submit(uow, settings, sub)
