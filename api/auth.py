"""Bearer API keys on every /v1/ route: 401 without a valid key, 403 without the scope.

A key belongs to a tenant (agentq.tenants). Every row a route reads or changes must be of
the key's tenant: another tenant's row is absent (404), admin key or not. Inside its
tenant a non-admin key sees the rows it created; an admin key sees every key's rows there.

Admin keys are of two kinds (API.md 1.2): a tenant admin acts only inside its tenant, on
the admin routes too; an operator (`require_key(operator=True)`, made only on the server)
also reaches across tenants, and only on the /v1/admin/ routes (api/admin.py)."""
from __future__ import annotations

import functools
from typing import Callable

from flask import g, request
from sqlalchemy import bindparam, select

from agentq.db import autocommitting, engine_for
from agentq.errors import Forbidden, Unauthorized
from agentq.keys import hash_key
from agentq.models import ApiKey
from agentq.prebuilt import Prebuilt
from api.ratelimit import check_rate

_LIVE_KEY = Prebuilt(select(ApiKey.id, ApiKey.is_admin, ApiKey.tenant_id, ApiKey.is_operator)
                     .where(ApiKey.key_hash == bindparam("key_hash"),
                            ApiKey.revoked_at.is_(None)))
"""`keys.lookup`'s answer as one prebuilt statement (agentq.prebuilt), built once: every
request reads it, and through an ORM session (its transaction, the statement built and
compiled anew, an ApiKey instance loaded) it was 11% of the web process's samples for a
job's submit."""


def _authenticate() -> None:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'.")
    with engine_for(g.settings).connect() as connection, autocommitting(connection):
        row = _LIVE_KEY.first(connection, {"key_hash": hash_key(key.strip())})
    if row is None:
        raise Unauthorized("Invalid API key.")
    g.api_key_id, g.is_admin, g.tenant_id = row.id, row.is_admin, row.tenant_id
    g.is_operator = bool(row.is_operator)


def require_key(admin: bool = False, operator: bool = False) -> Callable:
    """`admin`: a tenant admin or an operator; `operator`: an operator only (a tenant
    admin gets 403 too)."""
    def wrap(view: Callable) -> Callable:
        @functools.wraps(view)
        def inner(*args, **kwargs):
            _authenticate()
            check_rate()  # the key's requests per second: 429 past them (api/ratelimit.py)
            if (admin or operator) and not g.is_admin:
                raise Forbidden("This route needs an admin key.", scope="admin")
            if operator and not g.is_operator:
                raise Forbidden("This route needs an operator key (made on the server with "
                                "`agentq keys create NAME --admin`).", scope="operator")
            return view(*args, **kwargs)
        return inner
    return wrap


def admin_reach():
    """The tenant an admin route may act in: None (every tenant) for an operator, the
    key's own tenant for a tenant admin."""
    return None if getattr(g, "is_operator", False) else g.tenant_id


def can_see(row) -> bool:
    """A row (with `tenant_id` and `api_key_id`) of the key's tenant that the key may see:
    an admin key every key's, another key its own."""
    return (row is not None and row.tenant_id == g.tenant_id
            and (g.is_admin or row.api_key_id == g.api_key_id))
