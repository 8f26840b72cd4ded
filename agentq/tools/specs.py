"""A tool module's registration, as values: where it is (`ModuleSpec`), the per-module
defaults and their checks, the static modules of AGENTQ_TOOL_MODULES, and the errors a call
to a module raises.

It reads nothing and imports no settings, so `agentq.config` parses AGENTQ_TOOL_MODULES with
it and `agentq.tools.remote` (fetching, calling, the shared cache) and `agentq.tools.mcp`
share its errors without importing each other for them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentq.errors import ConfigError, ToolError, ValidationFailed
from agentq.tools.manifest import NAME_RE, PERMISSION_LEVELS

KINDS = ("http", "mcp")


class ModuleError(ToolError):
    """The module answered with an error (`{"ok": false, "error": ...}`): not retried."""
    code = "module_error"
    retryable = False


class ModuleUnavailable(ToolError):
    """The module could not be reached (retried once, then the module is unhealthy)."""
    code = "module_unavailable"


class ModuleHttpError(ToolError):
    code = "module_http_error"


class ModuleBadAnswer(ToolError):
    code = "module_bad_answer"
    retryable = False


@dataclass(frozen=True)
class ModuleSpec:
    """Where a module is and how to reach it; `secret` is never shown."""
    name: str
    kind: str = "http"
    url: str | None = None
    command: tuple[str, ...] | None = None
    slow: bool = False
    secret: str | None = field(default=None, repr=False)
    static: bool = False
    permission: str | None = None
    """The level a caller needs for the module's tools (an HTTP manifest's own `permission`
    wins; an MCP server has none, so this is its tools' level; default guest)."""
    requires_approval: bool | tuple[str, ...] = False
    """True: every call of its tools waits for a person's approval; a tuple: the tools so
    named (`tool` or `module.tool`). An HTTP manifest's own `requires_approval` wins."""
    timeout_s: float | None = None
    """Each call's time limit (an HTTP manifest's own `time_limit_s` wins)."""
    tenant_id: str | None = None
    """The tenant whose module it is (registered by its admin): offered to, run for, and
    shown to that tenant only. None: global (an operator's, or AGENTQ_TOOL_MODULES)."""

    def visible_to(self, tenant_id) -> bool:
        """Whether a job or key of `tenant_id` may see, enable and run this module."""
        return self.tenant_id is None or self.tenant_id == str(tenant_id)

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "url": self.url,
                "command": list(self.command) if self.command else None, "slow": self.slow,
                "local": False,  # its calls cross the network: never run in the step
                "signed": bool(self.secret), "static": self.static,
                "permission": self.permission,
                "requires_approval": (list(self.requires_approval)
                                      if isinstance(self.requires_approval, tuple)
                                      else self.requires_approval),
                "timeout_s": self.timeout_s, "global": self.tenant_id is None,
                "tenant_id": self.tenant_id}

    def defaults(self) -> dict[str, Any] | None:
        """The per-module defaults as stored (tool_modules.defaults), or None."""
        out = {k: v for k, v in self.public().items()
               if k in ("permission", "requires_approval", "timeout_s") and v not in
               (None, False, [])}
        return out or None

    def gated(self, tool: str) -> bool:
        """Whether the registration asks approval for `tool` (`module.tool`)."""
        if isinstance(self.requires_approval, tuple):
            short = tool.partition(".")[2]
            return tool in self.requires_approval or short in self.requires_approval
        return bool(self.requires_approval)


def check_defaults(name: str, permission: Any, requires_approval: Any,
                   timeout_s: Any) -> None:
    """The per-module defaults; ValidationFailed naming the field to fix."""
    if permission is not None and permission not in PERMISSION_LEVELS:
        raise ValidationFailed({"permission": [f"Must be one of {list(PERMISSION_LEVELS)}."]},
                               "The module's permission is not valid.")
    if not isinstance(requires_approval, bool):
        ok = isinstance(requires_approval, (list, tuple)) and 0 < len(requires_approval) <= 200
        for tool in requires_approval if ok else ():
            prefix, dot, short = tool.partition(".") if isinstance(tool, str) else ("", "", "")
            if not (NAME_RE.fullmatch(tool) if isinstance(tool, str) and not dot else
                    prefix == name and NAME_RE.fullmatch(short)):
                ok = False
        if not ok:
            raise ValidationFailed(
                {"requires_approval": ["Must be true, false, or a non-empty list of the "
                                       f"module's tool names (`tool` or `{name}.tool`)."]},
                "The module's requires_approval is not valid.")
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or
                                  isinstance(timeout_s, bool) or not 0.1 <= timeout_s <= 86400):
        raise ValidationFailed({"timeout_s": ["Must be a number of seconds from 0.1 to "
                                              "86400."]},
                               "The module's timeout_s is not valid.")


def parse_static(raw: str | None, env: dict[str, str]) -> tuple[ModuleSpec, ...]:
    """AGENTQ_TOOL_MODULES: `name=url` entries, comma-separated (`name=mcp+http://…` for an
    MCP server over streamable HTTP); secret from AGENTQ_MODULE_SECRET_<NAME>; slow when
    the name is in AGENTQ_SLOW_MODULES; per-module defaults from
    AGENTQ_MODULE_PERMISSION_<NAME> (guest|user|admin|owner),
    AGENTQ_MODULE_APPROVAL_<NAME> (`all`, or tool names comma-separated) and
    AGENTQ_MODULE_TIMEOUT_S_<NAME> (seconds)."""
    specs = []
    slow = {p.strip() for p in (env.get("AGENTQ_SLOW_MODULES") or "").split(",")}
    for entry in (raw or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, url = entry.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not NAME_RE.fullmatch(name) or not url:
            raise ConfigError("AGENTQ_TOOL_MODULES",
                              f"entry {name or entry!r} must be name=url with name matching "
                              "[a-z][a-z0-9_]*")
        kind = "http"
        if url.startswith("mcp+"):
            kind, url = "mcp", url[4:]
        upper = name.upper()
        permission = env.get(f"AGENTQ_MODULE_PERMISSION_{upper}") or None
        approval_raw = (env.get(f"AGENTQ_MODULE_APPROVAL_{upper}") or "").strip()
        approval: bool | tuple[str, ...] = False
        if approval_raw.lower() in ("all", "true", "1", "*"):
            approval = True
        elif approval_raw:
            approval = tuple(t.strip() for t in approval_raw.split(",") if t.strip())
        timeout_raw = env.get(f"AGENTQ_MODULE_TIMEOUT_S_{upper}") or None
        try:
            timeout_s = float(timeout_raw) if timeout_raw else None
            check_defaults(name, permission, approval, timeout_s)
        except (ValueError, ValidationFailed) as exc:
            fields = getattr(exc, "fields", {"timeout_s": ["Must be a number of seconds."]})
            field_name = next(iter(fields))
            env_name = {"permission": "PERMISSION", "requires_approval": "APPROVAL",
                        "timeout_s": "TIMEOUT_S"}[field_name]
            raise ConfigError(f"AGENTQ_MODULE_{env_name}_{upper}",
                              fields[field_name][0]) from None
        specs.append(ModuleSpec(name=name, kind=kind, url=url, slow=name in slow,
                                secret=env.get(f"AGENTQ_MODULE_SECRET_{upper}") or None,
                                static=True, permission=permission,
                                requires_approval=approval, timeout_s=timeout_s))
    return tuple(specs)
