"""Bearer API keys on every /v1/ route: 401 without a valid key, 403 without the scope.

A key belongs to a tenant (agentq.tenants). Every row a route reads or changes must be of
the key's tenant: another tenant's row is absent (404), admin key or not. Inside its
tenant a non-admin key sees the rows it created; an admin key sees every key's rows there.
Only the /v1/admin/ routes (api/admin.py) reach across tenants."""
from __future__ import annotations

import functools
from typing import Callable

from flask import g, request

from agentq.db import session_scope
from agentq.errors import Forbidden, Unauthorized
from agentq.keys import lookup


def _authenticate() -> None:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'.")
    with session_scope(g.settings) as session:
        row = lookup(session, key.strip())
        if row is None:
            raise Unauthorized("Invalid API key.")
        g.api_key_id, g.is_admin, g.tenant_id = row.id, row.is_admin, row.tenant_id


def require_key(admin: bool = False) -> Callable:
    def wrap(view: Callable) -> Callable:
        @functools.wraps(view)
        def inner(*args, **kwargs):
            _authenticate()
            if admin and not g.is_admin:
                raise Forbidden("This route needs an admin key.", scope="admin")
            return view(*args, **kwargs)
        return inner
    return wrap


def can_see(row) -> bool:
    """A row (with `tenant_id` and `api_key_id`) of the key's tenant that the key may see:
    an admin key every key's, another key its own."""
    return (row is not None and row.tenant_id == g.tenant_id
            and (g.is_admin or row.api_key_id == g.api_key_id))
