"""Tenants: who owns rows. Every API key belongs to one; every row a key creates or names
(users, platform links, personas, conversations, jobs, files, batches, webhook deliveries,
idempotency keys) carries its tenant, and a key sees only its own tenant's rows.

Admin keys belong to a tenant too. On the ordinary routes they act like any key of their
tenant (and see every key's rows there); only the `/v1/admin/` routes (tenants and keys)
reach across tenants.
"""
from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agentq.db import utcnow
from agentq.errors import Conflict, NotFound, ValidationFailed
from agentq.models import Tenant

DEFAULT_TENANT_ID = uuid.UUID("00000000-0000-0000-0000-000000000001")
"""Made by the migration that introduced tenants; the rows and keys from before it."""
DEFAULT_TENANT_NAME = "default"
MAX_NAME_CHARS = 200


def create_tenant(session: Session, name: str) -> Tenant:
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME_CHARS:
        raise ValidationFailed({"name": [f"Must be 1..{MAX_NAME_CHARS} characters."]})
    tenant = Tenant(id=uuid.uuid4(), name=name, created_at=utcnow())
    try:
        with session.begin_nested():
            session.add(tenant)
            session.flush()
    except IntegrityError:
        raise Conflict(f"A tenant named {name!r} exists already.", name=name) from None
    return tenant


def list_tenants(session: Session) -> list[Tenant]:
    return list(session.execute(select(Tenant).order_by(Tenant.created_at, Tenant.name))
                .scalars())


def find_tenant(session: Session, ref: str | uuid.UUID | None) -> Tenant:
    """A tenant by id or by name; None is the default tenant."""
    if ref is None:
        ref = DEFAULT_TENANT_ID
    tenant = None
    try:
        tenant = session.get(Tenant, ref if isinstance(ref, uuid.UUID) else uuid.UUID(ref))
    except ValueError:
        pass
    if tenant is None and isinstance(ref, str):
        tenant = session.execute(select(Tenant).where(Tenant.name == ref)).scalar_one_or_none()
    if tenant is None:
        raise NotFound("tenant", str(ref))
    return tenant


def tenant_object(tenant: Tenant) -> dict:
    return {"id": str(tenant.id), "name": tenant.name,
            "created_at": tenant.created_at.isoformat() if tenant.created_at else None}
