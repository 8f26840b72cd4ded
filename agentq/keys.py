"""API keys: shown once at creation, stored only as a SHA-256 hash; each belongs to a tenant."""
from __future__ import annotations

import hashlib
import secrets
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.models import ApiKey
from agentq.tenants import DEFAULT_TENANT_ID

KEY_PREFIX = "aq_"
KEY_BYTES = 32
MAX_NAME_CHARS = 200


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_key(session: Session, name: str, admin: bool = False,
               tenant_id: uuid.UUID = DEFAULT_TENANT_ID) -> tuple[ApiKey, str]:
    """Make a key of `tenant_id`; returns the row and the key itself (the only time it is
    seen)."""
    if not name.strip():
        raise ValueError("a key needs a name")
    key = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
    row = ApiKey(id=uuid.uuid4(), tenant_id=tenant_id, name=name.strip()[:MAX_NAME_CHARS],
                 key_hash=hash_key(key), prefix=key[:10], is_admin=admin, created_at=utcnow())
    session.add(row)
    session.flush()
    return row, key


def lookup(session: Session, key: str) -> ApiKey | None:
    row = session.execute(select(ApiKey).where(ApiKey.key_hash == hash_key(key))
                          ).scalar_one_or_none()
    if row is None or row.revoked_at is not None:
        return None
    return row


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.execute(select(ApiKey).order_by(ApiKey.created_at)).scalars())


def revoke_key(session: Session, key_id: uuid.UUID) -> ApiKey | None:
    row = session.get(ApiKey, key_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def key_object(row: ApiKey) -> dict:
    """A key as listed: never the key itself, nor its hash."""
    def iso(value):
        return value.isoformat() if value else None
    return {"id": str(row.id), "name": row.name, "prefix": row.prefix,
            "tenant_id": str(row.tenant_id), "admin": row.is_admin,
            "created_at": iso(row.created_at), "last_used_at": iso(row.last_used_at),
            "revoked_at": iso(row.revoked_at)}
