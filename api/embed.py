"""POST /v1/embed: an embedding through the router's provider."""
from __future__ import annotations

import threading

from flask import Blueprint, g, jsonify

from agentq.errors import ProviderError
from api.auth import require_key
from api.errors import error_response
from api.jobs import json_body
from api.schemas import EmbedRequestSchema

bp = Blueprint("embed", __name__)
_router = None
_lock = threading.Lock()


def router(settings):
    global _router
    with _lock:
        if _router is None:
            from agentq.llm.router import LLMRouter
            _router = LLMRouter(settings)
        return _router


@bp.post("/v1/embed")
@require_key()
def embed():
    data = EmbedRequestSchema().load(json_body())
    try:
        vector = router(g.settings).embed(data["text"])
    except ProviderError as exc:
        return error_response(502, exc.code, "The embedding provider failed.",
                              {"attempts": exc.attempts})
    return jsonify({"embedding": vector})
