"""The admin routes (admin keys only; any other key gets 403).

Operators only (a tenant admin gets 403): POST|GET /v1/admin/tenants,
PATCH /v1/admin/tenants/<id> (quotas).

Any admin key, each inside what it reaches (`api.auth.admin_reach`: every tenant for an
operator, its own for a tenant admin; another tenant's key or tenant is 404 as if absent):
GET /v1/admin/tenants/<id> (a tenant admin: its own, to read its quotas),
GET|PATCH /v1/admin/tenants/<id>/context_layers (its default bootstrap text and skills),
POST|GET /v1/admin/keys, POST /v1/admin/keys/<id>/revoke, POST /v1/admin/keys/<id>/rotate.
Operators are never made here: an admin key made through the API is its tenant's admin.

In the admin key's tenant (API.md 1.1 "Admin of the tenant"; agentq.admin, the same as
the `agentq` subcommands): personas (GET|POST /v1/personas, GET|PATCH|DELETE
/v1/personas/<id>), users (GET /v1/users, GET|PATCH /v1/users/<id>,
POST /v1/users/<id>/links) and GET /v1/usage. Another tenant's persona or user is 404."""
from __future__ import annotations

from datetime import timedelta

from flask import Blueprint, g, jsonify, request

from agentq import admin
from agentq.db import session_scope, utcnow
from agentq.errors import NotFound, ValidationFailed
from agentq.keys import create_key, key_object, list_keys, revoke_key
from agentq.tenants import (
    create_tenant,
    find_tenant,
    layers_object,
    list_tenants,
    tenant_object,
    update_layers,
    update_quotas,
)
from api.auth import admin_reach, require_key
from api.jobs import json_body, parse_uuid
from api.openapi import json_response, operation
from api.schemas.admin import (
    ApiKeyPageSchema,
    ApiKeySchema,
    ContextLayersSchema,
    ContextLayersUpdateSchema,
    DeletedSchema,
    IdentityRequestSchema,
    KeyRequestSchema,
    NewApiKeySchema,
    PageQuerySchema,
    PersonaPageSchema,
    PersonaRequestSchema,
    PersonaSchema,
    PersonaUpdateSchema,
    TenantPageSchema,
    TenantRequestSchema,
    TenantSchema,
    TenantUpdateSchema,
    UsageQuerySchema,
    UsageReportSchema,
    UserDetailSchema,
    UserPageSchema,
    UserSchema,
    UserUpdateSchema,
)

bp = Blueprint("admin", __name__)


def _created(body: dict):
    response = jsonify(body)
    response.status_code = 201
    return response


@bp.post("/v1/admin/tenants")
@operation(
    "createTenant", "Make a tenant",
    tags=["admin"],
    description="Operator keys only (a tenant admin gets `403`). `409` when the name "
                "is taken.",
    body=TenantRequestSchema,
    responses={
        201: json_response(TenantSchema, "The new tenant."),
    },
    errors=(401, 403, 409, 415, 422))
@require_key(operator=True)
def post_tenant():
    data = TenantRequestSchema().load(json_body())
    with session_scope(g.settings) as session:
        return _created(tenant_object(create_tenant(session, data["name"]), g.settings))


@bp.get("/v1/admin/tenants")
@operation(
    "listTenants", "Every tenant",
    tags=["admin"],
    description="Operator keys only (a tenant admin gets `403`).",
    responses={
        200: json_response(TenantPageSchema, "Every tenant, oldest first."),
    },
    errors=(401, 403))
@require_key(operator=True)
def get_tenants():
    with session_scope(g.settings) as session:
        return jsonify({"data": [tenant_object(t, g.settings) for t in list_tenants(session)]})


def _reachable_tenant(session, tenant_id: str):
    """The tenant by id, if this admin key reaches it; else 404 as if absent."""
    ident = parse_uuid(tenant_id, "tenant")
    reach = admin_reach()
    if reach is not None and ident != reach:
        raise NotFound("tenant", tenant_id)
    try:
        return find_tenant(session, ident)
    except NotFound:
        raise NotFound("tenant", tenant_id) from None


@bp.get("/v1/admin/tenants/<tenant_id>")
@operation(
    "getTenant", "A tenant and its quotas",
    tags=["admin"],
    description="An operator: any tenant; a tenant admin: its own (another tenant is "
                "`404`). Each quota is the tenant's own or the settings' default "
                "(`quotas_set` names those set); 0 is no limit.",
    responses={
        200: json_response(TenantSchema, "The tenant."),
    },
    errors=(401, 403, 404))
@require_key(admin=True)
def get_tenant(tenant_id: str):
    with session_scope(g.settings) as session:
        return jsonify(tenant_object(_reachable_tenant(session, tenant_id), g.settings))


@bp.patch("/v1/admin/tenants/<tenant_id>")
@operation(
    "updateTenant", "Set a tenant's quotas",
    tags=["admin"],
    description="Operator keys only (a tenant admin gets `403`, even for its own "
                "tenant). Each quota given is set (a whole number 0..1,000,000; 0 is "
                "no limit) or, with `null`, back to the settings' default "
                "(`AGENTQ_QUOTA_*`); the others stay.",
    body=TenantUpdateSchema,
    responses={
        200: json_response(TenantSchema, "The tenant, with its quotas now."),
    },
    errors=(401, 403, 404, 415, 422))
@require_key(operator=True)
def patch_tenant(tenant_id: str):
    data = TenantUpdateSchema().load(json_body())
    with session_scope(g.settings) as session:
        tenant = update_quotas(session, _reachable_tenant(session, tenant_id), data["quotas"])
        return jsonify(tenant_object(tenant, g.settings))


@bp.get("/v1/admin/tenants/<tenant_id>/context_layers")
@operation(
    "getTenantContextLayers", "A tenant's default context layers",
    tags=["admin"],
    description="An operator: any tenant; a tenant admin: its own (another tenant is "
                "`404`). The bootstrap text and skills its jobs get under their persona's "
                "own (`null`: none).",
    responses={
        200: json_response(ContextLayersSchema, "The tenant's default layers."),
    },
    errors=(401, 403, 404))
@require_key(admin=True)
def get_context_layers(tenant_id: str):
    with session_scope(g.settings) as session:
        return jsonify(layers_object(_reachable_tenant(session, tenant_id)))


@bp.patch("/v1/admin/tenants/<tenant_id>/context_layers")
@operation(
    "updateTenantContextLayers", "Set a tenant's default context layers",
    tags=["admin"],
    description="An operator: any tenant; a tenant admin: its own (another tenant is "
                "`404`). Each field given is set, or cleared with `null`; the other stays. "
                "A job gets the tenant's bootstrap when its persona has none of its own, "
                "and the tenant's skills before the persona's, less those the persona "
                "names again (the persona's skill of that name replaces it); a job with "
                "no persona gets both. Skill names are unique in the list.",
    body=ContextLayersUpdateSchema,
    responses={
        200: json_response(ContextLayersSchema, "The tenant's default layers now."),
    },
    errors=(401, 403, 404, 415, 422))
@require_key(admin=True)
def patch_context_layers(tenant_id: str):
    data = ContextLayersUpdateSchema().load(json_body())
    with session_scope(g.settings) as session:
        tenant = update_layers(session, _reachable_tenant(session, tenant_id), data)
        return jsonify(layers_object(tenant))


@bp.post("/v1/admin/keys")
@operation(
    "createKey", "Make an API key of a tenant",
    tags=["admin"],
    description="Admin keys only. The answer holds the key itself, the only time it "
                "is shown; only its hash is stored. `admin: true` makes an admin of "
                "that tenant (never an operator: those are made on the server). A "
                "tenant admin names only its own tenant: another is `404`.",
    body=KeyRequestSchema,
    responses={
        201: json_response(NewApiKeySchema, "The new key, with `key`."),
    },
    errors=(401, 403, 404, 415, 422))
@require_key(admin=True)
def post_key():
    data = KeyRequestSchema().load(json_body())
    reach = admin_reach()
    if reach is not None and data["tenant_id"] != reach:
        # a tenant admin names only its own tenant: any other is absent, existing or not
        raise NotFound("tenant", str(data["tenant_id"]))
    with session_scope(g.settings) as session:
        try:
            tenant = find_tenant(session, data["tenant_id"])
        except NotFound:
            raise ValidationFailed({"tenant_id": ["No such tenant."]},
                                   "No tenant with that tenant_id.") from None
        row, key = create_key(session, data["name"], data["admin"], tenant.id)
        return _created({**key_object(row), "key": key})


@bp.get("/v1/admin/keys")
@operation(
    "listKeys", "Every API key (never the key itself)",
    tags=["admin"],
    description="An operator: every tenant's keys; a tenant admin: its tenant's.",
    responses={
        200: json_response(ApiKeyPageSchema, "Every key, oldest first."),
    },
    errors=(401, 403))
@require_key(admin=True)
def get_keys():
    with session_scope(g.settings) as session:
        return jsonify({"data": [key_object(k) for k in list_keys(session, admin_reach())]})


@bp.post("/v1/admin/keys/<key_id>/revoke")
@operation(
    "revokeKey", "Revoke an API key",
    tags=["admin"],
    description="From now on the key answers `401`, and its schedules stop firing. "
                "Another tenant's key is `404` to a tenant admin; an operator's key "
                "is `403` to it.",
    responses={
        200: json_response(ApiKeySchema, "The key, revoked."),
    },
    errors=(401, 403, 404))
@require_key(admin=True)
def post_revoke(key_id: str):
    with session_scope(g.settings) as session:
        row = revoke_key(session, parse_uuid(key_id, "key"), admin_reach())
        return jsonify(key_object(row))


@bp.post("/v1/admin/keys/<key_id>/rotate")
@operation(
    "rotateKey", "Rotate an API key",
    tags=["admin"],
    description="Revokes the key and makes its successor (same name, tenant and "
                "scope); the answer holds the new key, the only time it is shown. "
                "`409` when the key is revoked already. Another tenant's key is `404` "
                "to a tenant admin; an operator's key is `403` to it.",
    responses={
        201: json_response(NewApiKeySchema, "The new key, with `key`."),
    },
    errors=(401, 403, 404, 409))
@require_key(admin=True)
def post_rotate(key_id: str):
    with session_scope(g.settings) as session:
        row, key = admin.rotate_key(session, parse_uuid(key_id, "key"), admin_reach())
        return _created({**key_object(row), "key": key})


# --- personas -------------------------------------------------------------------------------

def _check_persona(data: dict) -> None:
    from agentq.tools.registry import get_registry
    # the tenant's own modules and the global ones: another tenant's is unknown here (422)
    modules = get_registry(g.settings).modules_for(g.tenant_id)
    admin.check_modules(data.get("allowed_modules"), modules)
    admin.check_tools(data.get("requires_approval"),
                      [t.name for m in modules.values() for t in m.tools])


@bp.post("/v1/personas")
@operation(
    "createPersona", "Make a persona",
    tags=["admin"],
    description="Admin keys only. A tenant's first persona is its default; "
                "`is_default: true` moves the default here. `allowed_modules` must "
                "name known tool modules and `requires_approval` known tools "
                "(`422`).",
    body=PersonaRequestSchema,
    responses={
        201: json_response(PersonaSchema, "The new persona."),
    },
    errors=(401, 403, 415, 422))
@require_key(admin=True)
def post_persona():
    data = PersonaRequestSchema().load(json_body())
    _check_persona(data)
    with session_scope(g.settings) as session:
        return _created(admin.persona_object(admin.create_persona(session, g.tenant_id, data)))


@bp.get("/v1/personas")
@operation(
    "listPersonas", "The tenant's personas",
    tags=["admin"],
    responses={
        200: json_response(PersonaPageSchema, "Every persona, oldest first."),
    },
    errors=(401, 403))
@require_key(admin=True)
def get_personas():
    with session_scope(g.settings) as session:
        return jsonify({"data": [admin.persona_object(p)
                                 for p in admin.list_personas(session, g.tenant_id)]})


@bp.get("/v1/personas/<persona_id>")
@operation(
    "getPersona", "Get a persona",
    tags=["admin"],
    responses={
        200: json_response(PersonaSchema, "The persona."),
    },
    errors=(401, 403, 404))
@require_key(admin=True)
def get_persona(persona_id: str):
    with session_scope(g.settings) as session:
        return jsonify(admin.persona_object(admin.find_persona(session, g.tenant_id,
                                                               persona_id)))


@bp.patch("/v1/personas/<persona_id>")
@operation(
    "updatePersona", "Change a persona",
    tags=["admin"],
    description="Only the fields given change. `is_default: false` on the default "
                "is `409` (make another the default instead).",
    body=PersonaUpdateSchema,
    responses={
        200: json_response(PersonaSchema, "The persona."),
    },
    errors=(401, 403, 404, 409, 415, 422))
@require_key(admin=True)
def patch_persona(persona_id: str):
    data = PersonaUpdateSchema().load(json_body())
    _check_persona(data)
    with session_scope(g.settings) as session:
        persona = admin.find_persona(session, g.tenant_id, persona_id)
        return jsonify(admin.persona_object(admin.update_persona(session, persona, data)))


@bp.delete("/v1/personas/<persona_id>")
@operation(
    "deletePersona", "Delete a persona",
    tags=["admin"],
    description="Conversations and jobs that named it go on with none; if it was the "
                "default, the oldest remaining persona becomes the default.",
    responses={
        200: json_response(DeletedSchema, "`{\"id\", \"deleted\": true}`."),
    },
    errors=(401, 403, 404))
@require_key(admin=True)
def delete_persona(persona_id: str):
    with session_scope(g.settings) as session:
        persona = admin.find_persona(session, g.tenant_id, persona_id)
        ident = str(persona.id)
        admin.delete_persona(session, persona)
    return jsonify({"id": ident, "deleted": True})


# --- users ----------------------------------------------------------------------------------

@bp.get("/v1/users")
@operation(
    "listUsers", "The tenant's users",
    tags=["admin"],
    query=PageQuerySchema,
    responses={
        200: json_response(UserPageSchema, "Users, oldest first, with identities."),
    },
    errors=(401, 403, 422))
@require_key(admin=True)
def get_users():
    page = PageQuerySchema().load(request.args.to_dict())
    with session_scope(g.settings) as session:
        users = admin.list_users(session, g.tenant_id, page["limit"], page["offset"])
        links = admin.identities(session, [u.id for u in users])
        return jsonify({"data": [admin.user_object(u, links[u.id]) for u in users]})


@bp.get("/v1/users/<user_id>")
@operation(
    "getUser", "A user, their usage and token logs",
    tags=["admin"],
    responses={
        200: json_response(UserDetailSchema, "The user, usage this budget period and "
                           "the latest token logs."),
    },
    errors=(401, 403, 404))
@require_key(admin=True)
def get_user(user_id: str):
    with session_scope(g.settings) as session:
        user = admin.find_user(session, g.tenant_id, user_id)
        return jsonify(admin.user_detail(session, g.settings, user))


@bp.patch("/v1/users/<user_id>")
@operation(
    "updateUser", "Set a user's level, budget or name",
    tags=["admin"],
    body=UserUpdateSchema,
    responses={
        200: json_response(UserDetailSchema, "The user."),
    },
    errors=(401, 403, 404, 415, 422))
@require_key(admin=True)
def patch_user(user_id: str):
    data = UserUpdateSchema().load(json_body())
    with session_scope(g.settings) as session:
        user = admin.update_user(session, admin.find_user(session, g.tenant_id, user_id), data)
        return jsonify(admin.user_detail(session, g.settings, user))


@bp.post("/v1/users/<user_id>/links")
@operation(
    "linkUser", "Link another platform identity",
    tags=["admin"],
    description="Messages from this (platform, platform_user_id) are this user's "
                "from now on. `409` when it is another user's; `200` when it is "
                "this user's already.",
    body=IdentityRequestSchema,
    responses={
        201: json_response(UserSchema, "The user, with the new identity."),
        200: json_response(UserSchema, "The user; the identity was linked already."),
    },
    errors=(401, 403, 404, 409, 415, 422))
@require_key(admin=True)
def post_link(user_id: str):
    data = IdentityRequestSchema().load(json_body())
    with session_scope(g.settings) as session:
        user = admin.find_user(session, g.tenant_id, user_id)
        _link, created = admin.link_identity(session, user, data["platform"],
                                             data["platform_user_id"],
                                             data["platform_username"])
        body = admin.user_object(user, admin.identities(session, [user.id])[user.id])
    response = jsonify(body)
    response.status_code = 201 if created else 200
    return response


# --- usage ----------------------------------------------------------------------------------

@bp.get("/v1/usage")
@operation(
    "usageReport", "Tokens and cost per user, persona or model",
    tags=["admin"],
    query=UsageQuerySchema,
    responses={
        200: json_response(UsageReportSchema, "One row per group, largest cost first."),
    },
    errors=(401, 403, 422))
@require_key(admin=True)
def get_usage():
    query = UsageQuerySchema().load(request.args.to_dict())
    until = query.get("until") or utcnow()
    since = query.get("since") or until - timedelta(days=g.settings.budget_period_days)
    if since > until:
        raise ValidationFailed({"since": ["Must not be after until."]})
    with session_scope(g.settings) as session:
        rows = admin.usage_report(session, g.tenant_id, query["group_by"], since, until)
    return jsonify({"group_by": query["group_by"], "since": since.isoformat(),
                    "until": until.isoformat(), "data": rows})
