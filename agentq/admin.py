"""The admin surface, shared by the admin routes (api/admin.py) and the `agentq`
subcommands: personas, users (levels, budgets, platform identities), key rotation, usage.

Everything here acts inside one tenant (the admin key's, or the CLI's `--tenant`): another
tenant's persona or user is absent (NotFound).

A tenant has at most one default persona: the first one made is the default unless it is
made with `is_default: false` (then the tenant has none, and a job that no persona matches
runs with none: the settings' defaults), making another the default moves the flag, and
deleting the default hands it to the oldest remaining persona. A partial unique index
holds it in the database too.
"""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, Iterable

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import Conflict, NotFound, ValidationFailed
from agentq.ids import new_id
from agentq.keys import create_key, find_key, hand_over
from agentq.models import ApiKey, Job, Persona, TokenLog, User, UserPlatformLink
from agentq.tools.manifest import PERMISSION_LEVELS

PERSONA_FIELDS = ("name", "platform", "platform_server_id", "is_default", "system_prompt",
                  "allowed_modules", "default_model", "max_tokens_per_request", "stream",
                  "limits", "requires_approval", "bootstrap", "skills", "tool_docs")
PERSONA_COLUMNS = {"requires_approval": "approval_tools"}
"""API field → Persona column, where they differ (the column keeps its first name)."""
LIMIT_KEYS = ("max_iterations", "max_tokens", "max_seconds")
RECENT_TOKEN_LOGS = 20
USAGE_GROUPS = ("user", "persona", "model")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


# --- personas ---------------------------------------------------------------------------

def check_modules(modules: Iterable[str] | None, known: Iterable[str]) -> None:
    if modules is None:
        return
    unknown = sorted(set(modules) - set(known))
    if unknown:
        raise ValidationFailed({"allowed_modules": [f"Unknown module(s): {', '.join(unknown)}; "
                                                    f"known: {', '.join(sorted(known))}."]},
                               "Unknown tool module(s).")


def check_tools(names: Iterable[str] | None, known: Iterable[str]) -> None:
    if names is None:
        return
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValidationFailed({"requires_approval": [f"Unknown tool(s): "
                                                      f"{', '.join(unknown)}."]},
                               "Unknown tool(s).")


def list_personas(session: Session, tenant_id: uuid.UUID) -> list[Persona]:
    return list(session.execute(select(Persona).where(Persona.tenant_id == tenant_id)
                                .order_by(Persona.created_at, Persona.id)).scalars())


def _of_tenant(session: Session, model, kind: str, tenant_id: uuid.UUID,
               ident: uuid.UUID | str):
    """The row of `model` with this id in the tenant; else NotFound, as if absent."""
    try:
        key = ident if isinstance(ident, uuid.UUID) else uuid.UUID(ident)
    except ValueError:
        raise NotFound(kind, str(ident)) from None
    row = session.get(model, key)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(kind, str(ident))
    return row


def find_persona(session: Session, tenant_id: uuid.UUID, persona_id: uuid.UUID | str
                 ) -> Persona:
    return _of_tenant(session, Persona, "persona", tenant_id, persona_id)


def _lock_defaults(session: Session, tenant_id: uuid.UUID) -> Persona | None:
    """The tenant's default persona, locked (one writer at a time moves the flag)."""
    return session.execute(select(Persona).where(Persona.tenant_id == tenant_id,
                                                 Persona.is_default.is_(True))
                           .with_for_update()).scalar_one_or_none()


def _unset_default(session: Session, tenant_id: uuid.UUID, keep: uuid.UUID | None) -> None:
    session.execute(update(Persona).where(Persona.tenant_id == tenant_id,
                                          Persona.is_default.is_(True), Persona.id != keep)
                    .values(is_default=False))
    session.flush()


def _limits(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """The limits that are set (None when none is): what effective_limits reads."""
    kept = {k: v for k, v in (value or {}).items() if k in LIMIT_KEYS and v is not None}
    return kept or None


def _columns(data: dict[str, Any]) -> dict[str, Any]:
    """The persona fields of `data` (API names) as Persona column values, is_default aside
    (the callers move the default flag under its lock)."""
    out = {}
    for name, value in data.items():
        if name in PERSONA_FIELDS and name != "is_default":
            out[PERSONA_COLUMNS.get(name, name)] = _limits(value) if name == "limits" else value
    return out


def create_persona(session: Session, tenant_id: uuid.UUID, data: dict[str, Any]) -> Persona:
    _lock_defaults(session, tenant_id)
    make_default = data.get("is_default")
    if make_default is None:  # unsaid: the tenant's first persona is its default
        make_default = session.execute(select(Persona.id).where(
            Persona.tenant_id == tenant_id).limit(1)).first() is None
    persona = Persona(id=new_id(), tenant_id=tenant_id, created_at=utcnow(),
                      **_columns(data), is_default=False)
    session.add(persona)
    session.flush()
    if make_default:  # `is_default: false` is honoured, on a first persona too
        _unset_default(session, tenant_id, persona.id)
        persona.is_default = True
        session.flush()
    return persona


def update_persona(session: Session, persona: Persona, data: dict[str, Any]) -> Persona:
    _lock_defaults(session, persona.tenant_id)
    if data.get("is_default") is False and persona.is_default:
        raise Conflict("A tenant keeps one default persona: make another one the default "
                       "instead.", persona_id=str(persona.id))
    for name, value in _columns(data).items():
        setattr(persona, name, value)
    if data.get("is_default") and not persona.is_default:
        _unset_default(session, persona.tenant_id, persona.id)
        persona.is_default = True
    session.flush()
    return persona


def delete_persona(session: Session, persona: Persona) -> Persona | None:
    """Delete; conversations and jobs that named it keep going with none (SET NULL).
    Returns the persona that became the default, if the default was deleted."""
    _lock_defaults(session, persona.tenant_id)
    was_default, tenant_id = persona.is_default, persona.tenant_id
    session.delete(persona)
    session.flush()
    if not was_default:
        return None
    heir = session.execute(select(Persona).where(Persona.tenant_id == tenant_id)
                           .order_by(Persona.created_at, Persona.id).limit(1)
                           ).scalar_one_or_none()
    if heir is not None:
        heir.is_default = True
        session.flush()
    return heir


def persona_object(persona: Persona) -> dict[str, Any]:
    return {"id": str(persona.id), "name": persona.name, "platform": persona.platform,
            "platform_server_id": persona.platform_server_id,
            "is_default": persona.is_default, "system_prompt": persona.system_prompt,
            "allowed_modules": persona.allowed_modules,
            "default_model": persona.default_model,
            "max_tokens_per_request": persona.max_tokens_per_request,
            "stream": bool(persona.stream), "limits": _limits(persona.limits),
            "requires_approval": persona.approval_tools,
            "bootstrap": persona.bootstrap, "skills": persona.skills,
            "tool_docs": bool(persona.tool_docs),
            "created_at": _iso(persona.created_at)}


# --- users ------------------------------------------------------------------------------

def list_users(session: Session, tenant_id: uuid.UUID, limit: int = 100,
               offset: int = 0) -> list[User]:
    return list(session.execute(select(User).where(User.tenant_id == tenant_id)
                                .order_by(User.created_at, User.id)
                                .limit(limit).offset(offset)).scalars())


def find_user(session: Session, tenant_id: uuid.UUID, user_id: uuid.UUID | str) -> User:
    return _of_tenant(session, User, "user", tenant_id, user_id)


def find_user_by_identity(session: Session, tenant_id: uuid.UUID, platform: str,
                          platform_user_id: str) -> User:
    user = session.execute(
        select(User).join(UserPlatformLink, UserPlatformLink.user_id == User.id).where(
            UserPlatformLink.tenant_id == tenant_id, UserPlatformLink.platform == platform,
            UserPlatformLink.platform_user_id == platform_user_id)).scalar_one_or_none()
    if user is None:
        raise NotFound("user", f"{platform}:{platform_user_id}")
    return user


def identities(session: Session, user_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[dict]]:
    found: dict[uuid.UUID, list[dict]] = {u: [] for u in user_ids}
    if not user_ids:
        return found
    for link in session.execute(select(UserPlatformLink).where(
            UserPlatformLink.user_id.in_(user_ids))
            .order_by(UserPlatformLink.created_at)).scalars():
        found[link.user_id].append({"platform": link.platform,
                                    "platform_user_id": link.platform_user_id,
                                    "platform_username": link.platform_username})
    return found


def user_object(user: User, links: list[dict]) -> dict[str, Any]:
    return {"id": str(user.id), "display_name": user.display_name,
            "permission_level": user.permission_level,
            "token_budget_monthly": user.token_budget_monthly,
            "tokens_used_this_month": user.tokens_used_this_month,
            "budget_reset_at": _iso(user.budget_reset_at),
            "created_at": _iso(user.created_at), "identities": links}


def user_detail(session: Session, settings: Settings, user: User) -> dict[str, Any]:
    """The user, their usage this budget period and their latest token logs."""
    period_end = user.budget_reset_at
    period_start = period_end - timedelta(days=settings.budget_period_days)
    totals = session.execute(select(
        func.coalesce(func.sum(TokenLog.input_tokens), 0),
        func.coalesce(func.sum(TokenLog.output_tokens), 0),
        func.coalesce(func.sum(TokenLog.cost_estimate), 0.0), func.count(TokenLog.id))
        .where(TokenLog.user_id == user.id, TokenLog.created_at >= period_start,
               TokenLog.created_at < period_end)).one()
    logs = session.execute(select(TokenLog).where(TokenLog.user_id == user.id)
                           .order_by(TokenLog.created_at.desc())
                           .limit(RECENT_TOKEN_LOGS)).scalars()
    return {**user_object(user, identities(session, [user.id])[user.id]),
            "usage": {"period_start": _iso(period_start), "period_end": _iso(period_end),
                      "input_tokens": int(totals[0]), "output_tokens": int(totals[1]),
                      "cost_estimate": float(totals[2]), "calls": int(totals[3])},
            "token_logs": [{"id": str(t.id), "job_id": str(t.job_id) if t.job_id else None,
                            "conversation_id": (str(t.conversation_id) if t.conversation_id
                                                else None),
                            "model": t.model, "input_tokens": t.input_tokens,
                            "output_tokens": t.output_tokens,
                            "cost_estimate": t.cost_estimate,
                            "created_at": _iso(t.created_at)} for t in logs]}


def update_user(session: Session, user: User, data: dict[str, Any]) -> User:
    if "permission_level" in data:
        if data["permission_level"] not in PERMISSION_LEVELS:
            raise ValidationFailed({"permission_level": [
                f"Must be one of: {', '.join(PERMISSION_LEVELS)}."]})
        user.permission_level = data["permission_level"]
    if "token_budget_monthly" in data:
        budget = data["token_budget_monthly"]
        if budget is not None and (not isinstance(budget, int) or budget < 0):
            raise ValidationFailed({"token_budget_monthly": [
                "Must be a whole number of tokens >= 0, or null (unlimited)."]})
        user.token_budget_monthly = budget
    if "display_name" in data:
        user.display_name = data["display_name"]
    session.flush()
    return user


def link_identity(session: Session, user: User, platform: str, platform_user_id: str,
                  platform_username: str | None = None) -> tuple[dict[str, Any], bool]:
    """Link a (platform, platform_user_id) to `user` (seed 000's multi-platform users).
    Returns (the identity, made now?); 409 when it belongs to another user."""
    existing = session.execute(select(UserPlatformLink).where(
        UserPlatformLink.tenant_id == user.tenant_id, UserPlatformLink.platform == platform,
        UserPlatformLink.platform_user_id == platform_user_id)).scalar_one_or_none()
    created = False
    if existing is None:
        link = UserPlatformLink(id=new_id(), tenant_id=user.tenant_id, user_id=user.id,
                                platform=platform, platform_user_id=platform_user_id,
                                platform_username=platform_username or platform_user_id,
                                created_at=utcnow())
        try:
            with session.begin_nested():
                session.add(link)
                session.flush()
            existing, created = link, True
        except IntegrityError:
            existing = session.execute(select(UserPlatformLink).where(
                UserPlatformLink.tenant_id == user.tenant_id,
                UserPlatformLink.platform == platform,
                UserPlatformLink.platform_user_id == platform_user_id)).scalar_one()
    if existing.user_id != user.id:
        raise Conflict(f"{platform}:{platform_user_id} is linked to another user.",
                       platform=platform, platform_user_id=platform_user_id,
                       user_id=str(existing.user_id))
    return ({"platform": existing.platform, "platform_user_id": existing.platform_user_id,
             "platform_username": existing.platform_username}, created)


# --- keys -------------------------------------------------------------------------------

def rotate_key(session: Session, key_id: uuid.UUID,
               tenant_id: uuid.UUID | None = None) -> tuple[ApiKey, str]:
    """Revoke a live key and make its successor (same name, tenant and scope). With
    `tenant_id` (a tenant admin asking) `keys.find_key`'s limits hold."""
    old = find_key(session, key_id, tenant_id, lock=True)
    if old.revoked_at is not None:
        raise Conflict(f"Key {key_id} is revoked; make a new one instead.",
                       key_id=str(key_id))
    old.revoked_at = utcnow()
    new, key = create_key(session, old.name, old.is_admin, old.tenant_id,
                          operator=bool(old.is_operator))
    hand_over(session, old, new)
    return new, key


# --- usage ------------------------------------------------------------------------------

def usage_report(session: Session, tenant_id: uuid.UUID, group_by: str, since: datetime,
                 until: datetime) -> list[dict[str, Any]]:
    """Tokens and cost of the tenant's model calls in [since, until), per user, persona
    (the job's) or model, largest cost first."""
    if group_by not in USAGE_GROUPS:
        raise ValidationFailed({"group_by": [f"Must be one of: {', '.join(USAGE_GROUPS)}."]})
    column = {"user": TokenLog.user_id, "persona": Job.persona_id,
              "model": TokenLog.model}[group_by]
    query = (select(column, func.sum(TokenLog.input_tokens), func.sum(TokenLog.output_tokens),
                    func.sum(TokenLog.cost_estimate), func.count(TokenLog.id))
             .join(User, User.id == TokenLog.user_id)
             .where(User.tenant_id == tenant_id, TokenLog.created_at >= since,
                    TokenLog.created_at < until))
    if group_by == "persona":
        query = query.outerjoin(Job, Job.id == TokenLog.job_id)
    rows = session.execute(query.group_by(column)).all()
    out = [{"key": str(key) if key is not None else None, "input_tokens": int(i or 0),
            "output_tokens": int(o or 0), "total_tokens": int((i or 0) + (o or 0)),
            "cost_estimate": float(c or 0.0), "calls": int(n)} for key, i, o, c, n in rows]
    return sorted(out, key=lambda r: (-r["cost_estimate"], -r["total_tokens"],
                                      r["key"] or ""))
