"""Each tenant's webhook secret (API.md 1.2 "Webhook secrets per tenant").

A tenant's events are signed with its own secret (`tenants.webhook_secret`), so what one
tenant's receiver accepts no other tenant can forge. The default tenant, until it rotates,
signs with AGENTQ_WEBHOOK_SECRET (one secret, or several space-separated while an operator
rotates it by hand), as every tenant did before 1.2.

Any other tenant without a secret yet (made before 1.2, or never rotated) gets a fresh one
generated the first time it needs one (its first delivery, or its first rotation): it never
falls back to AGENTQ_WEBHOOK_SECRET, which other tenants' receivers hold. Nobody has seen
that generated secret, so its admin rotates (`POST /v1/admin/webhook-secret/rotate`) to get
one to give to its receiver.

A rotation makes a new secret, answers it once, and keeps the one before it (for the default
tenant that never rotated: the AGENTQ_WEBHOOK_SECRET ones) signing too for
ROTATION_OVERLAP: each event carries one `v1,` signature per secret, space-separated, so a
receiver holding either verifies. Secrets are never logged nor returned but by the rotation.
"""
from __future__ import annotations

import base64
import secrets as random
import uuid
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import NotFound
from agentq.models import Tenant
from agentq.tenants import DEFAULT_TENANT_ID

ROTATION_OVERLAP = timedelta(hours=24)
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh `whsec_` + base64 secret (32 random bytes), as Standard Webhooks has them."""
    return "whsec_" + base64.b64encode(random.token_bytes(SECRET_BYTES)).decode("ascii")


def _current(session: Session, tenant: Tenant, settings: Settings) -> tuple[str, ...]:
    """The secrets signing now without the previous one: the tenant's own; the setting's
    for the default tenant that has none; a generated one for any other tenant."""
    if tenant.webhook_secret:
        return tuple(tenant.webhook_secret.split())
    if tenant.id == DEFAULT_TENANT_ID:
        return tuple(settings.webhook_secrets)
    # first need of a secret: one writer sets it, the others read what it set
    session.execute(update(Tenant).where(Tenant.id == tenant.id,
                                         Tenant.webhook_secret.is_(None))
                    .values(webhook_secret=new_secret())
                    .execution_options(synchronize_session=False))
    session.refresh(tenant, attribute_names=["webhook_secret"])
    return tuple((tenant.webhook_secret or "").split())  # set by now, by us or another


def signing_secrets(session: Session, tenant: Tenant, settings: Settings,
                    now: datetime | None = None) -> tuple[str, ...]:
    """Every secret that signs the tenant's events now, the newest first (an empty tuple
    only for the default tenant with AGENTQ_WEBHOOK_SECRET unset: signing then fails with
    the setting named). The caller loads the tenant's row with what it signs (a delivery
    loads it with the delivery, agentq.webhooks.delivery._claim)."""
    current = _current(session, tenant, settings)
    now = now or utcnow()
    previous: tuple[str, ...] = ()
    if tenant.webhook_secret_previous and tenant.webhook_secret_previous_until and \
            tenant.webhook_secret_previous_until > now:
        previous = tuple(s for s in tenant.webhook_secret_previous.split()
                         if s not in current)
    return current + previous


def rotate(session: Session, tenant_id: uuid.UUID, settings: Settings,
           now: datetime | None = None) -> str:
    """A new secret for the tenant, returned once; the secrets signing until now keep
    signing for ROTATION_OVERLAP. The tenant's row is locked: two rotations at once end with
    one of them current and the other previous, never one lost silently."""
    tenant = session.get(Tenant, tenant_id, with_for_update=True, populate_existing=True)
    if tenant is None:
        raise NotFound("tenant", str(tenant_id))
    now = now or utcnow()
    was = _current(session, tenant, settings)
    secret = new_secret()
    tenant.webhook_secret = secret
    tenant.webhook_secret_previous = " ".join(was) or None
    tenant.webhook_secret_previous_until = now + ROTATION_OVERLAP if was else None
    session.flush()
    return secret
