"""GET /v1/conversations/<id>/messages: the stored history, oldest first, paginated;
GET /v1/conversations/<id>: the conversation; POST /v1/conversations/<id>/branch: a new
conversation continued from an earlier point (agentq.branches)."""
from __future__ import annotations

from flask import Blueprint, g, jsonify, request
from sqlalchemy import select

from agentq import branches
from agentq.db import session_factory, session_scope
from agentq.errors import ValidationFailed
from agentq.loop import replay
from agentq.loop.submit import Submission
from agentq.loop.uow import UnitOfWork
from agentq.models import Message
from agentq.views import conversation_object, job_object
from api.auth import require_key
from api.jobs import json_body, load_conversation, parse_uuid
from api.openapi import MAX_SEQ, job_links, json_response, operation
from api.schemas.conversations import (
    BranchRequestSchema,
    ConversationSchema,
    ConversationUpdateSchema,
    MessagePageSchema,
)
from api.schemas.jobs import JobSchema
from api.views import accepted, message_object

bp = Blueprint("conversations", __name__)
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


def _int_arg(name: str, default: int, lo: int, hi: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationFailed({name: ["Must be an integer."]}) from None
    if not lo <= value <= hi:
        raise ValidationFailed({name: [f"Must be between {lo} and {hi}."]})
    return value


@bp.get("/v1/conversations/<conversation_id>/messages")
@operation(
    "listConversationMessages", "A conversation's history",
    tags=["conversations"],
    parameters=["messages_after", "limit"],
    responses={
        200: json_response(MessagePageSchema, "Stored messages, oldest first."),
    },
    errors=(401, 403, 404, 422))
@require_key()
def list_messages(conversation_id: str):
    limit = _int_arg("limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    after = _int_arg("after", 0, 0, MAX_SEQ)
    ident = parse_uuid(conversation_id, "conversation")
    with session_scope(g.settings) as session:
        load_conversation(session, ident)
        rows = session.execute(
            select(Message).where(Message.conversation_id == ident, Message.seq > after)
            .order_by(Message.seq).limit(limit + 1)).scalars().all()
        page = rows[:limit]
        return jsonify({"data": [message_object(m) for m in page],
                        "has_more": len(rows) > limit,
                        "next_after": page[-1].seq if len(rows) > limit else None})


@bp.get("/v1/conversations/<conversation_id>")
@operation(
    "getConversation", "A conversation",
    tags=["conversations"],
    description="`branched_from` names a branch's source conversation and the "
                "source's first message it does not hold.",
    responses={
        200: json_response(ConversationSchema, "The conversation."),
    },
    errors=(401, 403, 404))
@require_key()
def get_conversation(conversation_id: str):
    ident = parse_uuid(conversation_id, "conversation")
    with session_scope(g.settings) as session:
        return jsonify(conversation_object(load_conversation(session, ident)))


@bp.patch("/v1/conversations/<conversation_id>")
@operation(
    "updateConversation", "Set a conversation's active project",
    tags=["conversations"],
    description="`active_project` is sent in the context of the conversation's next "
                "turns (after the persona's system prompt, bootstrap, memories, "
                "skills and tool documentation); null or blank clears it.",
    body=ConversationUpdateSchema,
    responses={
        200: json_response(ConversationSchema, "The conversation."),
    },
    errors=(401, 403, 404, 415, 422))
@require_key()
def update_conversation(conversation_id: str):
    """The active project (a context layer of the conversation's next turns)."""
    data = ConversationUpdateSchema().load(json_body())
    ident = parse_uuid(conversation_id, "conversation")
    with session_scope(g.settings) as session:
        conversation = load_conversation(session, ident)
        project = data["active_project"]
        conversation.active_project = project if project and project.strip() else None
        session.flush()
        return jsonify(conversation_object(conversation))


@bp.post("/v1/conversations/<conversation_id>/branch")
@operation(
    "branchConversation", "Continue from an earlier point",
    tags=["conversations"],
    description="A job in a new conversation holding a copy of this one's history "
                "before `at_message_id` (or before `at_job_id`'s first message), "
                "asking `content`; its first turn's `triggered_by` is `branch`. This "
                "conversation is not changed. A message or job not in it is `404`; a "
                "non-admin key's `model` must be the persona's default model or a "
                "configured one (`422` naming `model` otherwise).",
    body=BranchRequestSchema,
    responses={
        202: json_response(JobSchema, "The branch's job.",
                           headers={"Location": "Location"},
                           links=job_links()),
    },
    errors=(401, 403, 404, 415, 422))
@require_key()
def branch_conversation(conversation_id: str):
    data = BranchRequestSchema().load(json_body())
    ident = parse_uuid(conversation_id, "conversation")
    with UnitOfWork(session_factory(g.settings)) as uow:
        source = load_conversation(uow.session, ident)
        point = branches.branch_point(uow.session, source, at_message_id=data["at_message_id"],
                                      at_job_id=data["at_job_id"])
        if not g.is_admin:  # a non-admin key picks only a model the persona allows
            replay.check_model(uow.session, g.settings, data["model"],
                               [data["persona_id"] or source.persona_id], g.tenant_id,
                               action="branch")
        submitted = branches.create_branch(uow, g.settings, source, point, Submission(
            incoming=None, content=data["content"], metadata=data["metadata"],
            callback_url=data["callback_url"], limits=data["limits"],
            persona_id=data["persona_id"], model=data["model"], stream=data["stream"],
            api_key_id=g.api_key_id, tenant_id=g.tenant_id, own_conversations=not g.is_admin))
        body = job_object(submitted.job)
    return accepted(body, f"/v1/jobs/{body['id']}")
