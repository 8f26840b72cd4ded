"""The tool modules' admin routes (admin keys): GET|POST /v1/modules,
POST /v1/modules/<name>/refresh, DELETE /v1/modules/<name>.

Per tenant (API.md 1.2, agentq.modules): a tenant admin registers modules of its own
tenant, sees its own and the global ones, and another tenant's is 404 to it; only an
operator registers a global one (`"global": true`; a tenant admin asking gets 403) or
removes one, and sees every module."""
from __future__ import annotations

from flask import Blueprint, g, jsonify

from agentq.db import session_scope
from agentq.errors import Forbidden, ValidationFailed
from agentq.modules import add_module, list_modules, refresh_module, remove_module
from agentq.tools.registry import get_registry
from agentq.tools.remote import ModuleSpec
from api.auth import require_key
from api.jobs import json_body
from api.openapi import json_response, operation
from api.schemas.modules import ModulePageSchema, ModuleRequestSchema, ModuleSchema

bp = Blueprint("modules", __name__)


def _reach():
    """The tenant whose modules the key may reach: None (all) for an operator."""
    return None if getattr(g, "is_operator", False) else g.tenant_id


@bp.get("/v1/modules")
@operation(
    "listModules", "Every tool module with its tools and health",
    tags=["modules"],
    description="Admin keys only. `kind` is `python` (in-process), `http` or `mcp`; "
                "an unhealthy module's tools are not offered. Secrets are never shown "
                "(`signed` says whether there is one). A tenant admin sees its "
                "tenant's modules and the global ones; an operator every one.",
    responses={
        200: json_response(ModulePageSchema, "Every module, python ones first."),
    },
    errors=(401, 403))
@require_key(admin=True)
def get_modules():
    return jsonify({"data": list_modules(get_registry(g.settings), _reach())})


@bp.post("/v1/modules")
@operation(
    "addModule", "Register an HTTP module or an MCP server",
    tags=["modules"],
    description="Admin keys only. The module's manifest (`GET <url>/manifest`, or an "
                "MCP server's tools) is fetched and checked first: `422` with "
                "`details.fields.manifest` saying what to fix when it is refused; "
                "`409` when the name is taken. The URL passes the SSRF guard "
                "(private addresses only with AGENTQ_MODULE_ALLOW_PRIVATE). The "
                "module is the key's tenant's (offered only to its jobs); "
                "`global: true` (an operator only, else `403`) offers it to every "
                "tenant.",
    body=ModuleRequestSchema,
    responses={
        201: json_response(ModuleSchema, "The module, with its tools."),
    },
    errors=(401, 403, 409, 415, 422))
@require_key(admin=True)
def post_module():
    data = ModuleRequestSchema().load(json_body())
    if data.get("command") and not g.settings.module_allow_commands:
        raise ValidationFailed({"command": ["Commands are registered with `agentq modules "
                                            "add --command` on the machine, or through the "
                                            "API when AGENTQ_MODULE_ALLOW_COMMANDS=1."]},
                               "This deployment does not take MCP commands over the API.")
    if data.get("is_global") and not getattr(g, "is_operator", False):
        raise Forbidden("Only an operator registers a global module; leave out `global` "
                        "to register one for this tenant.", scope="operator")
    spec = ModuleSpec(name=data["name"], kind=data["kind"], url=data.get("url"),
                      command=tuple(data["command"]) if data.get("command") else None,
                      slow=data.get("slow", False), secret=data.get("secret"),
                      permission=data.get("permission"),
                      requires_approval=approval_of(data.get("requires_approval", False)),
                      timeout_s=data.get("timeout_s"),
                      tenant_id=None if data.get("is_global") else str(g.tenant_id))
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
@operation(
    "refreshModule", "Fetch a module's manifest now",
    tags=["modules"],
    description="The manifest is cached again for an hour; a module that does not "
                "answer is shown unhealthy. `409` for a python module; another "
                "tenant's module is `404`.",
    responses={
        200: json_response(ModuleSchema, "The module as it is now."),
    },
    errors=(401, 403, 404, 409))
@require_key(admin=True)
def post_refresh(name: str):
    with session_scope(g.settings) as session:
        return jsonify(refresh_module(session, get_registry(g.settings), name, _reach()))


@bp.delete("/v1/modules/<name>")
@operation(
    "removeModule", "Unregister a module",
    tags=["modules"],
    description="Its tools are no longer offered. `409` for a python module or one "
                "configured by AGENTQ_TOOL_MODULES; another tenant's module is `404`; "
                "a global one is removed by an operator only (`403`).",
    responses={
        204: {"description": "Removed."},
    },
    errors=(401, 403, 404, 409))
@require_key(admin=True)
def delete_module(name: str):
    with session_scope(g.settings) as session:
        remove_module(session, get_registry(g.settings), name, _reach())
    return "", 204
