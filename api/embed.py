"""POST /v1/embed: an embedding through the router's provider, paid from a user's monthly
token budget (API.md 1.2) as a job's model calls are.

The user is the one the body names (`platform`, `platform_user_id`: the same user a message
from there is), or else the key's own (platform `api_key`, its key id), made a guest with the
guest budget at first use like any new user. The text's tokens are counted before the call
(the tokenizer of AGENTQ_TOKENIZER, or characters / 4) and taken from the budget at once,
under the user's row lock, so concurrent requests cannot overspend it: a request that would
pass the budget is refused `429 budget_exceeded` (with `Retry-After`: when the period
resets) and no provider is called. A call that fails gives its tokens back. Each paid call
is a `token_logs` row (no job), so GET /v1/usage shows it under the embedding model.
"""
from __future__ import annotations

import math
import threading
import uuid
from typing import TYPE_CHECKING, Any

from flask import Blueprint, g, jsonify
from flask.typing import ResponseReturnValue
from sqlalchemy import delete, update

from agentq.config import Settings
from agentq.db import session_scope, utcnow
from agentq.errors import ClientError, ProviderError
from agentq.ids import new_id
from agentq.llm.pricing import estimate_cost
from agentq.llm.tokens import count_tokens
from agentq.loop.budget import roll_period
from agentq.loop.identity import Incoming, resolve_user
from agentq.models import TokenLog, User
from api.auth import require_key
from api.errors import error_response
from api.jobs import json_body
from api.openapi import json_response, operation
from api.schemas.common import ErrorSchema
from api.schemas.embed import EmbedRequest, EmbedRequestSchema, EmbedResponseSchema

if TYPE_CHECKING:  # the router's module imports the provider SDKs
    from agentq.llm.router import LLMRouter

bp = Blueprint("embed", __name__)
_router: LLMRouter | None = None
_lock = threading.Lock()
KEY_PLATFORM = "api_key"
"""The platform of a key's own user (its platform_user_id is the key's id)."""


def router(settings: Settings) -> LLMRouter:
    global _router
    with _lock:
        if _router is None:
            from agentq.llm.router import LLMRouter
            _router = LLMRouter(settings)
        return _router


class EmbedBudgetExceeded(ClientError):
    """The user's budget cannot pay for the text: 429 with Retry-After (when it resets)."""
    status = 429
    code = "budget_exceeded"

    def __init__(self, message: str, retry_after_s: int, **details: Any):
        super().__init__(message, **details)
        self.retry_after_s = retry_after_s


def _charge(settings: Settings, data: EmbedRequest, model: str,
            tokens: int) -> tuple[uuid.UUID, uuid.UUID]:
    """Take `tokens` from the user's budget and log them; EmbedBudgetExceeded when they do
    not fit (the user as resolved is kept). Returns (the token log's id, the user's id)."""
    platform, who = data["platform"], data["platform_user_id"]
    if platform is None or who is None:  # the schema lets through both or neither
        platform, who = KEY_PLATFORM, str(g.api_key_id)
    incoming = Incoming(platform=platform, platform_user_id=who, platform_channel_id="embed")
    with session_scope(settings) as session:
        user = resolve_user(session, g.tenant_id, incoming, settings)
        session.flush()
        user = session.get_one(User, user.id, with_for_update=True, populate_existing=True)
        now = utcnow()
        roll_period(user, now, settings.budget_period_days)
        budget = user.token_budget_monthly
        if budget is None or user.tokens_used_this_month + tokens <= budget:
            user.tokens_used_this_month += tokens
            log = TokenLog(id=new_id(), user_id=user.id, conversation_id=None,
                           job_id=None, iteration=0, model=model, input_tokens=tokens,
                           output_tokens=0, cost_estimate=estimate_cost(model, tokens, 0),
                           usage_estimated=True, created_at=now)
            session.add(log)
            return log.id, user.id
        left = max(0, budget - user.tokens_used_this_month)
        resets_at = user.budget_reset_at.isoformat()
        refusal = EmbedBudgetExceeded(
            f"The user's monthly token budget cannot pay for this text ({tokens} tokens; "
            f"{left} left until {resets_at}).",
            max(1, math.ceil((user.budget_reset_at - now).total_seconds())),
            tokens=tokens, tokens_left=left, budget=budget, resets_at=resets_at)
    raise refusal  # once the user (made or rolled to a new period) is committed


def _refund(settings: Settings, log_id: uuid.UUID, user_id: uuid.UUID, tokens: int) -> None:
    with session_scope(settings) as session:
        session.execute(update(User).where(User.id == user_id).values(
            tokens_used_this_month=User.tokens_used_this_month - tokens))
        session.execute(delete(TokenLog).where(TokenLog.id == log_id))


@bp.post("/v1/embed")
@operation(
    "embed", "Embed a text",
    tags=["embeddings"],
    body=EmbedRequestSchema,
    description="Paid from a user's monthly token budget: the user `platform` + "
                "`platform_user_id` name, or else the key's own (platform `api_key`). "
                "A text whose tokens the budget cannot pay is refused `429` "
                "`budget_exceeded` (`Retry-After`: when the budget resets) and no "
                "provider is called.",
    responses={
        200: json_response(EmbedResponseSchema, "The embedding."),
        429: json_response(ErrorSchema, "`budget_exceeded`: the user's monthly token "
                           "budget cannot pay for this text.",
                           headers={"Retry-After": {"schema": {"type": "integer"}}}),
    },
    errors=(401, 403, 415, 422, 502))
@require_key()
def embed() -> ResponseReturnValue:
    data: EmbedRequest = EmbedRequestSchema().load(json_body())
    settings = g.settings
    model = settings.embedding_model
    tokens = max(1, count_tokens(settings.tokenizer, [data["text"]]))
    charged = _charge(settings, data, model, tokens)
    try:
        vector = router(settings).embed(data["text"])
    except ProviderError as exc:
        _refund(settings, *charged, tokens)
        return error_response(502, exc.code, "The embedding provider failed.",
                              {"attempts": exc.attempts})
    except BaseException:
        _refund(settings, *charged, tokens)
        raise
    return jsonify({"embedding": vector})
