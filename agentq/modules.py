"""Registering external tool modules (the admin API and `agentq modules ...` share this):
add (the manifest is fetched and checked first: a bad one is refused saying what to fix),
list with health, refresh now, remove. Secrets are stored, never returned nor logged.

Modules per tenant (API.md 1.2): a module registered by a tenant's admin is that tenant's
(`tool_modules.tenant_id`); a global one (tenant None) is registered by an operator, the CLI
on the server, or AGENTQ_TOOL_MODULES. `tenant_id` below is the asking tenant: another
tenant's module is absent to it (NotFound), as if it did not exist; None (an operator, the
CLI) reaches every module."""
from __future__ import annotations

import logging
import uuid
from typing import Any

from sqlalchemy import event

from agentq.errors import Conflict, Forbidden, ManifestError, NotFound, ValidationFailed
from agentq.models import ToolModuleRow
from agentq.tools.registry import ToolRegistry
from agentq.tools.remote import (
    Known,
    ModuleSpec,
    build_module,
    check_approval_names,
    check_spec,
    module_object,
    spec_of,
    tools_of,
)

log = logging.getLogger(__name__)


def python_module_object(module, local: bool = False) -> dict[str, Any]:
    """An in-process module as GET /v1/modules shows it; `local`: its calls run in the
    step (`ToolRegistry.is_local`)."""
    return {"name": module.name, "kind": "python", "url": None, "command": None,
            "slow": module.slow, "local": local, "signed": False, "static": True,
            "permission": None, "requires_approval": False, "timeout_s": None,
            "global": True, "tenant_id": None,
            "health": {"status": "ok", "error": None, "checked_at": None},
            "tools": tools_of(module)}


def list_modules(registry: ToolRegistry, tenant_id=None) -> list[dict[str, Any]]:
    """Every module `tenant_id` may see (its own and the global ones; None: all)."""
    local = [python_module_object(registry._local[n], registry.is_local(n))
             for n in sorted(registry._local)]
    remote = registry.remote.known(force=True) if registry.remote else {}
    return local + [module_object(remote[n]) for n in sorted(remote)
                    if n not in registry._local
                    and (tenant_id is None or remote[n].spec.visible_to(tenant_id))]


def _after_commit(session, action) -> None:
    """Tell the other processes only once the row is committed: told earlier, one of them
    could re-read the list without it (or with a removed one, and fetch it again)."""
    event.listen(session, "after_commit", lambda _session: action(), once=True)


def add_module(session, registry: ToolRegistry, spec: ModuleSpec) -> dict[str, Any]:
    check_spec(spec, registry.settings, registry.local_module_names)
    if session.get(ToolModuleRow, spec.name) is not None or any(
            s.name == spec.name for s in registry.settings.tool_modules):
        raise Conflict(f"A tool module named {spec.name!r} exists.", name=spec.name)
    if spec.tenant_id:
        check_module_quota(session, uuid.UUID(spec.tenant_id), registry.settings)
    try:
        manifest = registry.remote.fetch(spec)
    except ManifestError as exc:
        raise ValidationFailed({"manifest": [exc.message]},
                               f"The module's manifest was refused: {exc.message}") from None
    module = build_module(spec, manifest, registry.remote._function_for)
    check_approval_names(spec, module)
    session.add(ToolModuleRow(name=spec.name, kind=spec.kind, url=spec.url,
                              command=list(spec.command) if spec.command else None,
                              slow=spec.slow, secret=spec.secret, defaults=spec.defaults(),
                              tenant_id=uuid.UUID(spec.tenant_id) if spec.tenant_id
                              else None))
    session.flush()
    registry.remote.forget(spec.name)
    _cached, health = registry.remote.cache(spec, manifest)
    _after_commit(session, registry.remote.store.bump)
    log.info("tool module added", extra={"tool_module": spec.name, "kind": spec.kind,
                                         "tenant_id": spec.tenant_id})
    return module_object(Known(spec, module, health))


def check_module_quota(session, tenant_id: uuid.UUID, settings) -> None:
    """Refuse a tenant's module past its `modules` quota (agentq.tenants.check_quota; global
    modules do not count), before its manifest is fetched."""
    from sqlalchemy import func, select

    from agentq.tenants import check_quota
    check_quota(session, tenant_id, "modules", select(func.count()).select_from(ToolModuleRow)
                .where(ToolModuleRow.tenant_id == tenant_id), settings)


def find_spec(session, registry: ToolRegistry, name: str, tenant_id=None) -> ModuleSpec:
    """The module `name` as `tenant_id` may see it (None: any); NotFound otherwise."""
    row = session.get(ToolModuleRow, name) if len(name) <= 31 else None
    if row is not None:
        spec = spec_of(row)
        if tenant_id is not None and not spec.visible_to(tenant_id):
            raise NotFound("module", name)  # another tenant's: as if absent
        return spec
    for spec in registry.settings.tool_modules:
        if spec.name == name:
            return spec
    if name in registry.local_module_names:
        raise Conflict(f"Module {name!r} is an in-process (python) module; it has no "
                       "manifest to refresh and cannot be removed here.", name=name)
    raise NotFound("module", name)


def refresh_module(session, registry: ToolRegistry, name: str,
                   tenant_id=None) -> dict[str, Any]:
    spec = find_spec(session, registry, name, tenant_id)
    registry.remote.refresh(spec)
    return module_object(registry.remote.known(force=True)[name])


def remove_module(session, registry: ToolRegistry, name: str, tenant_id=None) -> None:
    spec = find_spec(session, registry, name, tenant_id)
    if tenant_id is not None and spec.tenant_id is None and not spec.static:
        raise Forbidden(f"Module {name!r} is global: an operator removes it.",
                        scope="operator")
    if spec.static:
        raise Conflict(f"Module {name!r} is configured by AGENTQ_TOOL_MODULES; remove it "
                       "there.", name=name)
    session.delete(session.get(ToolModuleRow, name))
    session.flush()
    _after_commit(session, lambda: registry.remote.forget(name))
    log.info("tool module removed", extra={"tool_module": name})
