"""API keys: shown once at creation, stored only as a SHA-256 hash; each belongs to a tenant.

Three kinds (API.md 1.2): a plain key; a *tenant admin* (`is_admin`), the admin of its own
tenant only; an *operator* (`is_operator`, always an admin too), which reaches across
tenants and is made only on the server (`agentq keys create NAME --admin`, no `--tenant`)."""
from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import Any, cast

from sqlalchemy import func, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.errors import Forbidden, NotFound
from agentq.ids import new_id
from agentq.loop.states import ScheduleStatus
from agentq.models import ApiKey, Conversation, Schedule
from agentq.tenants import DEFAULT_TENANT_ID

KEY_PREFIX = "aq_"
KEY_BYTES = 32
MAX_NAME_CHARS = 200


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_key(session: Session, name: str, admin: bool = False,
               tenant_id: uuid.UUID = DEFAULT_TENANT_ID,
               operator: bool = False) -> tuple[ApiKey, str]:
    """Make a key of `tenant_id`; returns the row and the key itself (the only time it is
    seen). `operator` (only the server's own commands pass it) makes an admin that reaches
    across tenants."""
    if not name.strip():
        raise ValueError("a key needs a name")
    key = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
    row = ApiKey(id=new_id(), tenant_id=tenant_id, name=name.strip()[:MAX_NAME_CHARS],
                 key_hash=hash_key(key), prefix=key[:10], is_admin=admin or operator,
                 is_operator=operator,
                 created_at=utcnow())
    session.add(row)
    session.flush()
    return row, key


def lookup(session: Session, key: str) -> ApiKey | None:
    row = session.execute(select(ApiKey).where(ApiKey.key_hash == hash_key(key))
                          ).scalar_one_or_none()
    if row is None or row.revoked_at is not None:
        return None
    return row


def list_keys(session: Session, tenant_id: uuid.UUID | None = None) -> list[ApiKey]:
    """Every key (an operator's view), or one tenant's."""
    query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if tenant_id is not None:
        query = query.where(ApiKey.tenant_id == tenant_id)
    return list(session.execute(query).scalars())


def find_key(session: Session, key_id: uuid.UUID, tenant_id: uuid.UUID | None = None,
             lock: bool = False) -> ApiKey:
    """The key an admin acts on (revokes, rotates). With `tenant_id` (a tenant admin
    asking) only that tenant's: another tenant's key is absent (NotFound, as a missing
    one), and an operator's is not its to touch (Forbidden)."""
    row = session.get(ApiKey, key_id, with_for_update=lock)
    if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
        raise NotFound("key", str(key_id))
    if tenant_id is not None and row.is_operator:
        raise Forbidden("An operator's key is revoked or rotated by an operator.",
                        scope="operator")
    return row


def revoke_key(session: Session, key_id: uuid.UUID,
               tenant_id: uuid.UUID | None = None) -> ApiKey:
    """Revoke a key (`find_key` says which it may be): it answers 401 from now on, and its
    active schedules are cancelled (a revoked key's schedules never fire again; beat checks
    too, `agentq.schedules`). A revoked key stays as it was."""
    row = find_key(session, key_id, tenant_id)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        cancel_schedules_of(session, row.id, row.revoked_at)
    return row


def cancel_schedules_of(session: Session, key_id: uuid.UUID, at) -> int:
    """Cancel the key's active schedules (as DELETE /v1/schedules/<id> does); returns how
    many."""
    result = cast("CursorResult[Any]", session.execute(  # an UPDATE's: it has rowcount
        update(Schedule).where(Schedule.api_key_id == key_id,
                               Schedule.status == ScheduleStatus.ACTIVE)
        .values(status=ScheduleStatus.CANCELLED, next_run_at=None, cancelled_at=at)
        .execution_options(synchronize_session=False)))
    return result.rowcount or 0


def hand_over(session: Session, old: ApiKey, new: ApiKey) -> None:
    """A rotation: the successor takes the old key's active schedules and, for a
    non-admin key, its conversations at their places (`agentq.loop.identity.scope_key`
    names the owning key), so the same client goes on where it was."""
    session.execute(update(Schedule).where(Schedule.api_key_id == old.id,
                                           Schedule.status == ScheduleStatus.ACTIVE)
                    .values(api_key_id=new.id)
                    .execution_options(synchronize_session=False))
    if old.is_admin:
        return
    suffix = f',"{old.id}"]'
    session.execute(
        update(Conversation).where(Conversation.tenant_id == old.tenant_id,
                                   Conversation.scope_key.endswith(suffix, autoescape=True))
        .values(scope_key=func.substr(Conversation.scope_key, 1,
                                      func.length(Conversation.scope_key) - len(suffix))
                .op("||")(f',"{new.id}"]'))
        .execution_options(synchronize_session=False))


def key_object(row: ApiKey) -> dict:
    """A key as listed: never the key itself, nor its hash."""
    def iso(value):
        return value.isoformat() if value else None
    return {"id": str(row.id), "name": row.name, "prefix": row.prefix,
            "tenant_id": str(row.tenant_id), "admin": row.is_admin,
            "operator": bool(row.is_operator),
            "created_at": iso(row.created_at), "last_used_at": iso(row.last_used_at),
            "revoked_at": iso(row.revoked_at)}
