"""GET /v1/conversations/<id>/messages: the stored history, oldest first, paginated."""
from __future__ import annotations

from flask import Blueprint, g, jsonify, request
from sqlalchemy import select

from agentq.db import session_scope
from agentq.errors import ValidationFailed
from agentq.models import Message
from api.auth import require_key
from api.jobs import load_conversation, parse_uuid
from api.views import message_object

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
@require_key()
def list_messages(conversation_id: str):
    limit = _int_arg("limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    after = _int_arg("after", 0, 0, 2**62)
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
