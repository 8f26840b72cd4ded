"""API keys: shown once at creation, stored only as a SHA-256 hash."""
from __future__ import annotations

import hashlib
import secrets
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentq.models import ApiKey

KEY_PREFIX = "aq_"
KEY_BYTES = 32


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_key(session: Session, name: str, admin: bool = False) -> tuple[ApiKey, str]:
    """Make a key; returns the row and the key itself (the only time it is seen)."""
    if not name.strip():
        raise ValueError("a key needs a name")
    key = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
    row = ApiKey(id=uuid.uuid4(), name=name.strip(), key_hash=hash_key(key),
                 prefix=key[:10], is_admin=admin)
    session.add(row)
    session.flush()
    return row, key


def lookup(session: Session, key: str) -> ApiKey | None:
    row = session.execute(select(ApiKey).where(ApiKey.key_hash == hash_key(key))
                          ).scalar_one_or_none()
    if row is None or row.revoked_at is not None:
        return None
    return row
