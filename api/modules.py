"""The tool modules' admin routes (admin keys): GET|POST /v1/modules,
POST /v1/modules/<name>/refresh, DELETE /v1/modules/<name>."""
from __future__ import annotations

from flask import Blueprint, g, jsonify

from agentq.db import session_scope
from agentq.errors import ValidationFailed
from agentq.modules import add_module, list_modules, refresh_module, remove_module
from agentq.tools.registry import get_registry
from agentq.tools.remote import ModuleSpec
from api.auth import require_key
from api.jobs import json_body
from api.schemas import ModuleRequestSchema

bp = Blueprint("modules", __name__)


@bp.get("/v1/modules")
@require_key(admin=True)
def get_modules():
    return jsonify({"data": list_modules(get_registry(g.settings))})


@bp.post("/v1/modules")
@require_key(admin=True)
def post_module():
    data = ModuleRequestSchema().load(json_body())
    if data.get("command") and not g.settings.module_allow_commands:
        raise ValidationFailed({"command": ["Commands are registered with `agentq modules "
                                            "add --command` on the machine, or through the "
                                            "API when AGENTQ_MODULE_ALLOW_COMMANDS=1."]},
                               "This deployment does not take MCP commands over the API.")
    spec = ModuleSpec(name=data["name"], kind=data["kind"], url=data.get("url"),
                      command=tuple(data["command"]) if data.get("command") else None,
                      slow=data.get("slow", False), secret=data.get("secret"),
                      permission=data.get("permission"),
                      requires_approval=approval_of(data.get("requires_approval", False)),
                      timeout_s=data.get("timeout_s"))
    with session_scope(g.settings) as session:
        body = add_module(session, get_registry(g.settings), spec)
    response = jsonify(body)
    response.status_code = 201
    return response


def approval_of(value):
    """requires_approval as ModuleSpec takes it (a list becomes a tuple; check_spec says
    what is wrong with anything else)."""
    return tuple(value) if isinstance(value, list) else value


@bp.post("/v1/modules/<name>/refresh")
@require_key(admin=True)
def post_refresh(name: str):
    with session_scope(g.settings) as session:
        return jsonify(refresh_module(session, get_registry(g.settings), name))


@bp.delete("/v1/modules/<name>")
@require_key(admin=True)
def delete_module(name: str):
    with session_scope(g.settings) as session:
        remove_module(session, get_registry(g.settings), name)
    return "", 204
