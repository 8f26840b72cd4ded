"""The manifest a tool module declares, checked where it is declared.

A tool module is a package in `tool_workers/` whose `__init__` ends with

    MODULE = define_module({
        "module": "math",
        "description": "Arithmetic.",
        "tools": [
            {"name": "math.evaluate", "description": "...", "parameters": {JSON Schema},
             "permission": "guest", "function": evaluate, "time_limit_s": 5,
             "idempotent": True},
        ],
    })

Tools run at least once: a call whose worker dies mid-run is delivered again, so it may
run twice. `idempotent` (default false) says whether running a call twice has the effect
of running it once. A tool with side effects makes itself idempotent with the call's
`ctx.idempotency_key` (its tool_use_id, the same on every delivery): files.create_document
stores one file per key. A non-idempotent tool that is run again is logged
(`tool.rerun_not_idempotent`) and its `tool_execution_end` event says `reruns`.

A module may declare itself `"local": true`: its tools are pure (no side effects, nothing
read but their arguments and the clock), run in-process and end in bounded time, so its
calls may run inside the orchestrator's step instead of on its queue (DESIGN 1.2, "Local
tools"). The declaration only allows it: the deployment turns it on per module
(AGENTQ_LOCAL_MODULES; `agentq.tools.registry.ToolRegistry.is_local`). A slow module cannot
declare it.

An unknown key, a duplicate name, a name outside `module.tool`, a bad JSON Schema or an
unknown permission fails at import with a ManifestError saying what to fix.

A tool function is `fn(args: dict, ctx: ToolContext) -> JSON-able value`. It raises
`ToolError` (or anything) on failure; the registry turns that into data for the model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from agentq.errors import ManifestError

PERMISSION_LEVELS = ("guest", "user", "admin", "owner")
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,30}")  # always used with fullmatch
MODULE_KEYS = {"module", "description", "tools", "slow", "time_limit_s", "local"}
TOOL_KEYS = {"name", "description", "parameters", "permission", "function", "time_limit_s",
             "idempotent", "requires_approval", "approval_timeout_s"}


def permission_rank(level: str) -> int:
    """guest < user < admin < owner; an unknown level ranks below guest."""
    try:
        return PERMISSION_LEVELS.index(level)
    except ValueError:
        return -1


@dataclass
class ToolContext:
    """What a tool knows about the call besides its arguments."""
    tool_use_id: str
    job_id: str
    user_id: str
    conversation_id: str
    permission_level: str
    platform: str = ""
    platform_channel_id: str = ""
    platform_thread_id: str | None = None
    session_factory: Callable[[], Any] | None = None
    """A SQLAlchemy sessionmaker for tools that store rows (files)."""
    public_url: str = "http://localhost:5000"
    scratch_dir: str | None = None
    tenant_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        """The same on every delivery of this call (its tool_use_id): a tool with side
        effects does them once per key."""
        return self.tool_use_id


@dataclass(frozen=True)
class ToolDef:
    name: str
    module: str
    description: str
    parameters: dict[str, Any]
    permission: str
    function: Callable[[dict[str, Any], ToolContext], Any]
    time_limit_s: float | None
    idempotent: bool = False
    """Running a call twice has the effect of running it once (tools are at-least-once)."""
    requires_approval: bool = False
    """A person approves each call first (POST /v1/jobs/<id>/tool_calls/<id>/approve)."""
    approval_timeout_s: float | None = None
    """How long a call waits for that approval before it is denied (default: the
    deployment's AGENTQ_APPROVAL_TIMEOUT_S, 24 h)."""

    def validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.parameters)


@dataclass(frozen=True)
class ToolModule:
    name: str
    description: str
    tools: tuple[ToolDef, ...]
    slow: bool = False
    time_limit_s: float | None = None
    local: bool = False
    """Declares its tools pure, in-process and bounded: its calls may run in the step."""


def define_module(manifest: dict[str, Any]) -> ToolModule:
    """Check a manifest and build the module; raise ManifestError saying what to fix."""
    if not isinstance(manifest, dict):
        raise ManifestError("?", "the manifest must be a dict")
    module = manifest.get("module")
    if not isinstance(module, str) or not NAME_RE.fullmatch(module):
        raise ManifestError(str(module), "'module' must match [a-z][a-z0-9_]*")
    unknown = set(manifest) - MODULE_KEYS
    if unknown:
        raise ManifestError(module, f"unknown key(s) {sorted(unknown)}; allowed: "
                                    f"{sorted(MODULE_KEYS)}")
    tools_in = manifest.get("tools")
    if not isinstance(tools_in, list) or not tools_in:
        raise ManifestError(module, "'tools' must be a non-empty list")
    module_limit = _limit(module, "time_limit_s", manifest.get("time_limit_s"))
    seen: set[str] = set()
    tools: list[ToolDef] = []
    for i, spec in enumerate(tools_in):
        where = f"tools[{i}]"
        if not isinstance(spec, dict):
            raise ManifestError(module, f"{where} must be a dict")
        unknown = set(spec) - TOOL_KEYS
        if unknown:
            raise ManifestError(module, f"{where}: unknown key(s) {sorted(unknown)}; allowed: "
                                        f"{sorted(TOOL_KEYS)}")
        missing = {"name", "description", "parameters", "function"} - set(spec)
        if missing:
            raise ManifestError(module, f"{where}: missing {sorted(missing)}")
        name = spec["name"]
        prefix, _, tool = str(name).partition(".")
        if prefix != module or not NAME_RE.fullmatch(tool):
            raise ManifestError(module, f"{where}: name {name!r} must be '{module}.<tool>' "
                                        "with <tool> matching [a-z][a-z0-9_]*")
        if name in seen:
            raise ManifestError(module, f"{where}: duplicate tool name {name!r}")
        seen.add(name)
        permission = spec.get("permission", "guest")
        if permission not in PERMISSION_LEVELS:
            raise ManifestError(module, f"{name}: permission {permission!r} is not one of "
                                        f"{PERMISSION_LEVELS}")
        params = spec["parameters"]
        if not isinstance(params, dict) or params.get("type") != "object":
            raise ManifestError(module, f"{name}: parameters must be a JSON Schema with "
                                        "type 'object'")
        try:
            Draft202012Validator.check_schema(params)
        except SchemaError as exc:
            raise ManifestError(module, f"{name}: parameters is not a valid JSON Schema: "
                                        f"{exc.message}") from None
        if not callable(spec["function"]):
            raise ManifestError(module, f"{name}: function must be callable")
        if not isinstance(spec["description"], str) or not spec["description"].strip():
            raise ManifestError(module, f"{name}: description must be a non-empty string")
        idempotent = spec.get("idempotent", False)
        if not isinstance(idempotent, bool):
            raise ManifestError(module, f"{name}: idempotent must be true or false")
        requires_approval = spec.get("requires_approval", False)
        if not isinstance(requires_approval, bool):
            raise ManifestError(module, f"{name}: requires_approval must be true or false")
        tools.append(ToolDef(
            name=name, module=module, description=spec["description"].strip(),
            parameters=params, permission=permission, function=spec["function"],
            time_limit_s=_limit(module, f"{name}.time_limit_s", spec.get("time_limit_s")),
            idempotent=idempotent,
            requires_approval=requires_approval,
            approval_timeout_s=_limit(module, f"{name}.approval_timeout_s",
                                      spec.get("approval_timeout_s")),
        ))
    slow = manifest.get("slow", False)
    if not isinstance(slow, bool):
        raise ManifestError(module, "'slow' must be true or false")
    local = manifest.get("local", False)
    if not isinstance(local, bool):
        raise ManifestError(module, "'local' must be true or false")
    if local and slow:
        raise ManifestError(module, "a slow module cannot be local: a local module's calls "
                                    "run in the orchestrator's step, in bounded time")
    return ToolModule(name=module, description=str(manifest.get("description") or ""),
                      tools=tuple(tools), slow=slow, time_limit_s=module_limit, local=local)


def _limit(module: str, key: str, value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ManifestError(module, f"{key} must be a positive number of seconds")
    return float(value)
