"""Tenants: who owns rows. Every API key belongs to one; every row a key creates or names
(users, platform links, personas, conversations, jobs, files, batches, webhook deliveries,
idempotency keys) carries its tenant, and a key sees only its own tenant's rows.

Admin keys belong to a tenant too. On the ordinary routes they act like any key of their
tenant (and see every key's rows there). A *tenant admin* (`is_admin`) acts only inside its
tenant, on the admin routes too; an *operator* (`is_operator`, made only on the server)
also reaches across tenants: the tenants' own routes, keys of any tenant.

Each tenant has quotas (API.md 1.2): `quotas_for` is what the rest of agentq reads; an
operator sets them (`update_quotas`, `PATCH /v1/admin/tenants/<id>`), a quota not set is
the settings' default (`AGENTQ_QUOTA_*`), and 0 means no limit.

Each tenant may have default context layers (`update_layers`, `PATCH
/v1/admin/tenants/<id>/context_layers`, by its admin or an operator): a bootstrap text and
skills under its personas' own (agentq.loop.layers).
"""
from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import Counter
from typing import Any, Mapping

from sqlalchemy import Integer, bindparam, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agentq.config import Settings, get_settings
from agentq.config.quotas import QUOTA_NAMES, Quotas
from agentq.db import lock_row, utcnow
from agentq.errors import Conflict, NotFound, QuotaExceeded, ValidationFailed
from agentq.ids import new_id
from agentq.loop.states import NOT_ADMITTED, UNENDED_STATUSES, JobStatus, WaitingFor
from agentq.models import Job, Tenant
from agentq.prebuilt import literal_in

DEFAULT_TENANT_ID = uuid.UUID("00000000-0000-0000-0000-000000000001")
"""Made by the migration that introduced tenants; the rows and keys from before it."""
DEFAULT_TENANT_NAME = "default"
MAX_NAME_CHARS = 200


def create_tenant(session: Session, name: str) -> Tenant:
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME_CHARS:
        raise ValidationFailed({"name": [f"Must be 1..{MAX_NAME_CHARS} characters."]})
    tenant = Tenant(id=new_id(), name=name, created_at=utcnow())
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


def tenant_object(tenant: Tenant, settings: Settings | None = None) -> dict:
    """The tenant as the admin routes show it, with its quotas (each the tenant's own or
    the settings' default: `quotas_set` names the ones an operator set)."""
    return {"id": str(tenant.id), "name": tenant.name,
            "created_at": tenant.created_at.isoformat() if tenant.created_at else None,
            "quotas": dataclasses.asdict(_quotas(tenant.quotas, settings or get_settings())),
            "quotas_set": sorted(k for k in (tenant.quotas or {}) if k in QUOTA_NAMES)}


# --- quotas -------------------------------------------------------------------------------

MAX_QUOTA = 1_000_000


def _quotas(stored: Mapping[str, Any] | None, settings: Settings) -> Quotas:
    defaults = settings.quotas
    own = {k: v for k, v in (stored or {}).items()
           if k in QUOTA_NAMES and isinstance(v, int) and not isinstance(v, bool)}
    return dataclasses.replace(defaults, **own)


def quotas_for(session: Session, tenant_id: uuid.UUID,
               settings: Settings | None = None) -> Quotas:
    """The tenant's quotas: those an operator set, the settings' defaults for the rest (an
    unknown tenant gets the defaults). One small query; `cached_quotas` for hot paths."""
    stored = session.execute(select(Tenant.quotas).where(Tenant.id == tenant_id)
                             ).scalar_one_or_none()
    return _quotas(stored, settings or get_settings())


_CACHE_TTL_S = 5.0
_cache: dict[uuid.UUID, tuple[float, Quotas]] = {}
_cache_lock = threading.Lock()


def cached_quotas(session: Session, tenant_id: uuid.UUID,
                  settings: Settings | None = None) -> Quotas:
    """`quotas_for`, remembered by this process for up to 5 s (a change by an operator
    takes effect within that)."""
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(tenant_id)
    if hit is not None and now - hit[0] < _CACHE_TTL_S:
        return hit[1]
    quotas = quotas_for(session, tenant_id, settings)
    with _cache_lock:
        _cache[tenant_id] = (now, quotas)
    return quotas


def forget_cached_quotas() -> None:
    with _cache_lock:
        _cache.clear()


def check_quota(session: Session, tenant_id: uuid.UUID, quota: str, held,
                settings: Settings | None = None) -> None:
    """Refuse one more of what `quota` bounds (QuotaExceeded, 422) when the tenant holds
    its quota already; `held` is the statement counting what it holds. The tenant's row is
    locked first (agentq.db.lock_row: its jobs' inserts are not blocked by it), so
    concurrent creations of one tenant count one after another."""
    limit = getattr(quotas_for(session, tenant_id, settings), quota)
    if not limit:
        return
    lock_row(session, Tenant, tenant_id, load=False)
    used = session.execute(held).scalar_one()
    if used >= limit:
        raise QuotaExceeded(quota, limit, used)


def update_quotas(session: Session, tenant: Tenant, changes: Mapping[str, Any]) -> Tenant:
    """Set (a whole number 0..1,000,000) or clear (null: back to the default) some of a
    tenant's quotas; the others stay as they were."""
    unknown = sorted(set(changes) - set(QUOTA_NAMES))
    if unknown:
        raise ValidationFailed({name: [f"Unknown quota; known: {', '.join(QUOTA_NAMES)}."]
                                for name in unknown}, "Unknown quota(s).")
    bad = {name: [f"Must be a whole number from 0 (no limit) to {MAX_QUOTA}, or null."]
           for name, value in changes.items()
           if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                     or not 0 <= value <= MAX_QUOTA)}
    if bad:
        raise ValidationFailed(bad, "Invalid quota(s).")
    stored = dict(tenant.quotas or {})
    for name, value in changes.items():
        if value is None:
            stored.pop(name, None)
        else:
            stored[name] = value
    tenant.quotas = stored or None
    session.flush()
    with _cache_lock:
        _cache.pop(tenant.id, None)
    return tenant


# --- default context layers -------------------------------------------------------------------

LAYER_FIELDS = ("bootstrap", "skills")


def layers_object(tenant: Tenant) -> dict:
    """The tenant's default context layers as the admin routes show them."""
    return {"tenant_id": str(tenant.id), "bootstrap": tenant.bootstrap,
            "skills": tenant.skills}


def update_layers(session: Session, tenant: Tenant, changes: Mapping[str, Any]) -> Tenant:
    """Set (or clear, with null) the tenant's default bootstrap text and skills; a field not
    given stays as it was. Skill names are unique within the tenant's list (a persona's
    skill replaces the tenant's of its name, agentq.loop.layers)."""
    skills = changes.get("skills")
    if skills:
        twice = sorted(n for n, k in Counter(skill["name"] for skill in skills).items()
                       if k > 1)
        if twice:
            raise ValidationFailed({"skills": [f"Skill name(s) given twice: "
                                               f"{', '.join(twice)}."]},
                                   "Each skill needs a name of its own.")
    for name in LAYER_FIELDS:
        if name in changes:
            setattr(tenant, name, changes[name] or None)
    session.flush()
    return tenant


# --- running jobs ---------------------------------------------------------------------------

# A job waits for its tenant's quota (`waiting_for: quota`, agentq.loop.lifecycle.may_start)
# while the tenant runs `running_jobs` jobs already: it holds its conversation (later
# messages queue behind it as behind any job) but takes no step until one of them ends.


_RUNNING = select(func.count()).select_from(Job).where(
    Job.tenant_id == bindparam("tenant_id"), Job.status.in_(UNENDED_STATUSES),
    or_(Job.waiting_for.is_(None), Job.waiting_for.not_in(NOT_ADMITTED)),
    Job.id.not_in(bindparam("aside", expanding=True)))
"""`running_count`'s statement, built once with bind parameters (a statement built per
call cost more of the caller's CPU than Postgres spends running it)."""


RUNNING_NOW = select(func.count()).select_from(
    select(Job.id).where(
        Job.tenant_id == bindparam("running_tenant", type_=Job.tenant_id.type),
        literal_in(Job.status, UNENDED_STATUSES),
        or_(Job.waiting_for.is_(None), ~literal_in(Job.waiting_for, NOT_ADMITTED)))
    .limit(bindparam("running_cap", type_=Integer)).subquery()).scalar_subquery()
"""`_RUNNING` as a subquery of another statement, the tenant bound as `running_tenant`:
`running_count` as that statement's snapshot sees the jobs (its own writes aside), for a
writer that changed no other job (a new job taking its conversation). It counts no further
than `running_cap`, the tenant's quota: whether the quota is full is all its reader asks,
and a tenant with a backlog far past its quota would otherwise have every submit count it
all. Its statuses are written into the SQL (`prebuilt.literal_in`), so the statement that
carries it is compiled once (agentq.prebuilt)."""


def _runs(job) -> bool:
    """`_RUNNING`'s condition, of a job as it is in memory."""
    return job.status in UNENDED_STATUSES and job.waiting_for not in NOT_ADMITTED


def running_count(session: Session, tenant_id: uuid.UUID,
                  besides: uuid.UUID | None = None) -> int:
    """The tenant's jobs that run or were let start (queued with nothing to wait for,
    waiting for their provider or a person), `besides` aside: what `running_jobs` bounds.
    Through the partial index of its live jobs, as this session sees them: a job it changed
    and has not written yet (a step's unit of work writes at its commit: the job ending,
    the one handed its conversation) counts as it is now."""
    changed = [o for o in (*session.new, *session.dirty)
               if isinstance(o, Job) and o.tenant_id == tenant_id]
    aside = {o.id for o in changed} | ({besides} if besides is not None else set())
    stored = session.execute(_RUNNING, {"tenant_id": tenant_id, "aside": list(aside)}
                             ).scalar_one()
    return stored + sum(1 for o in changed if o.id != besides and _runs(o))


def tenants_waiting_for_quota(session: Session) -> list[uuid.UUID]:
    return list(session.execute(select(Job.tenant_id).where(
        Job.waiting_for == WaitingFor.QUOTA, Job.status == JobStatus.QUEUED).distinct()
    ).scalars())
