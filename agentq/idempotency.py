"""`Idempotency-Key`: the same key and body within 24 h returns the first job; the same key
with another body is refused. The key row is written in the transaction that creates the
job, under a unique index, so two concurrent requests with one key create one job."""
from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from agentq.db import insert_new, utcnow
from agentq.errors import Conflict, ValidationFailed
from agentq.ids import new_id
from agentq.models import IdempotencyKey

KEY_TTL_S = 24 * 3600
MAX_KEY_CHARS = 255


class IdempotencyMismatch(ValidationFailed):
    code = "idempotency_key_reused"

    def __init__(self, key: str):
        super().__init__({"Idempotency-Key": ["Already used with a different request body."]},
                         f"Idempotency-Key {key!r} was used with a different request.")


def request_hash(route: str, body: Any) -> str:
    canonical = json.dumps({"route": route, "body": body}, sort_keys=True,
                           separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_key(key: str) -> str:
    key = key.strip()
    if not key or len(key) > MAX_KEY_CHARS:
        raise ValidationFailed({"Idempotency-Key": [f"Must be 1..{MAX_KEY_CHARS} characters."]})
    return key


def find(session: Session, tenant_id: uuid.UUID, api_key_id: uuid.UUID, key: str,
         digest: str) -> uuid.UUID | None:
    """The job of an earlier request with this key, or None; a mismatch raises."""
    row = session.execute(select(IdempotencyKey).where(
        IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.api_key_id == api_key_id,
        IdempotencyKey.key == key)
    ).scalar_one_or_none()
    if row is None:
        return None
    if row.created_at < utcnow() - timedelta(seconds=KEY_TTL_S):
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.id == row.id))
        session.flush()
        return None
    if row.request_hash != digest:
        raise IdempotencyMismatch(key)
    return row.job_id or row.batch_id


_KEY = ("tenant_id", "api_key_id", "key")


def take(session: Session, tenant_id: uuid.UUID, api_key_id: uuid.UUID, key: str,
         digest: str, job_id: uuid.UUID) -> tuple[uuid.UUID | None, IdempotencyKey | None]:
    """Claim the key for the job this request is about to make (`job_id`, its id chosen
    before it is written), before anything else is written or locked: one INSERT … ON
    CONFLICT DO NOTHING, which a concurrent duplicate waits on (the unique index) and then
    finds taken. Returns (None, the claimed row), or (the earlier request's job, None); a
    mismatch raises; an expired key is taken afresh."""
    row = IdempotencyKey(id=new_id(), tenant_id=tenant_id, api_key_id=api_key_id,
                         key=key, request_hash=digest, job_id=job_id, created_at=utcnow())
    for _ in range(2):
        if insert_new(session, row, _KEY):
            return None, row
        earlier = find(session, tenant_id, api_key_id, key, digest)
        if earlier is not None:
            return earlier, None
    raise Conflict(f"Idempotency-Key {key!r} is being taken by another request; try again.")

