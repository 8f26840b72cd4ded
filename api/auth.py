"""Bearer API keys on every /v1/ route: 401 without a valid key, 403 without the scope."""
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
        g.api_key_id, g.is_admin = row.id, row.is_admin


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


def can_see(api_key_id) -> bool:
    """Admins see everything; other keys see what they created."""
    return g.is_admin or api_key_id == g.api_key_id
