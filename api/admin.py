"""The admin routes, the only ones that reach across tenants (admin keys only; any other
key gets 403): POST|GET /v1/admin/tenants, POST|GET /v1/admin/keys,
POST /v1/admin/keys/<id>/revoke."""
from __future__ import annotations

from flask import Blueprint, g, jsonify

from agentq.db import session_scope
from agentq.errors import NotFound, ValidationFailed
from agentq.keys import create_key, key_object, list_keys, revoke_key
from agentq.tenants import create_tenant, find_tenant, list_tenants, tenant_object
from api.auth import require_key
from api.jobs import json_body, parse_uuid
from api.schemas import KeyRequestSchema, TenantRequestSchema

bp = Blueprint("admin", __name__)


def _created(body: dict):
    response = jsonify(body)
    response.status_code = 201
    return response


@bp.post("/v1/admin/tenants")
@require_key(admin=True)
def post_tenant():
    data = TenantRequestSchema().load(json_body())
    with session_scope(g.settings) as session:
        return _created(tenant_object(create_tenant(session, data["name"])))


@bp.get("/v1/admin/tenants")
@require_key(admin=True)
def get_tenants():
    with session_scope(g.settings) as session:
        return jsonify({"data": [tenant_object(t) for t in list_tenants(session)]})


@bp.post("/v1/admin/keys")
@require_key(admin=True)
def post_key():
    data = KeyRequestSchema().load(json_body())
    with session_scope(g.settings) as session:
        try:
            tenant = find_tenant(session, data["tenant_id"])
        except NotFound:
            raise ValidationFailed({"tenant_id": ["No such tenant."]},
                                   "No tenant with that tenant_id.") from None
        row, key = create_key(session, data["name"], data["admin"], tenant.id)
        return _created({**key_object(row), "key": key})


@bp.get("/v1/admin/keys")
@require_key(admin=True)
def get_keys():
    with session_scope(g.settings) as session:
        return jsonify({"data": [key_object(k) for k in list_keys(session)]})


@bp.post("/v1/admin/keys/<key_id>/revoke")
@require_key(admin=True)
def post_revoke(key_id: str):
    with session_scope(g.settings) as session:
        row = revoke_key(session, parse_uuid(key_id, "key"))
        if row is None:
            raise NotFound("key", key_id)
        return jsonify(key_object(row))
