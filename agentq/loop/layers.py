"""A persona's context layers and a conversation's active project, rendered for the system
message (seed 002's order: system prompt, bootstrap, memory, skills, tool documentation,
then history and the current message; seed 003's active project after them).

A tenant may set default layers (`PATCH /v1/admin/tenants/<id>/context_layers`): its
bootstrap is sent when the job's persona has none of its own (a persona's replaces it), and
its skills come before the persona's, less those the persona names again (a persona's skill
replaces the tenant's of the same name). A job with no persona gets the tenant's.

`agentq.loop.context.system_text` puts them in that order; their tokens count against the
context budget like the system prompt's (history is windowed into the room they leave, the
current question is never dropped: a context whose fixed part passes the window fails
the job with `context_overflow`, as before).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence, TypedDict

from agentq.llm.types import ToolSpec

BOOTSTRAP_HEADER = "[Bootstrap]"
SKILLS_HEADER = "[Skills]"
TOOLS_HEADER = "[Tool documentation]"
PROJECT_HEADER = "[Active project]"
MAX_PARAMETERS_SHOWN = 20


class Extras(TypedDict):
    """A turn's layers, rendered: the `context.Layers` fields of the same names."""
    bootstrap: str | None
    skills: str | None
    tool_docs: str | None
    project: str | None


def extras(persona: object, conversation: object, tools: Sequence[ToolSpec],
           tenant: TenantLayers | None = None) -> Extras:
    """The layers (`context.Layers` fields) of a persona and conversation for a turn that
    offers `tools`, over the tenant's defaults. `persona` and `conversation` are read by
    attribute, each None or anything with the models' fields (a row of the step's query)."""
    offered = {t.name for t in tools}
    own_bootstrap = getattr(persona, "bootstrap", None)
    bootstrap = (own_bootstrap if own_bootstrap and own_bootstrap.strip()
                 else tenant.bootstrap if tenant else None)
    skills = merged_skills(tenant.skills if tenant else None,
                           getattr(persona, "skills", None))
    return {"bootstrap": _block(BOOTSTRAP_HEADER, bootstrap),
            "skills": skills_text(skills, offered),
            "tool_docs": (tool_docs_text(tools)
                          if getattr(persona, "tool_docs", False) else None),
            "project": _block(PROJECT_HEADER, getattr(conversation, "active_project", None))}


class TenantLayers(NamedTuple):
    """A tenant's default layers (`tenants.bootstrap`, `tenants.skills`)."""
    bootstrap: str | None
    skills: Sequence[dict[str, Any]] | None


def merged_skills(tenant: Sequence[dict[str, Any]] | None,
                  persona: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The tenant's skills the persona does not name, then the persona's."""
    own = list(persona or ())
    named = {skill.get("name") for skill in own}
    return [skill for skill in tenant or () if skill.get("name") not in named] + own


def _block(header: str, text: str | None) -> str | None:
    return f"{header}\n{text.strip()}" if text and text.strip() else None


def skills_text(skills: Sequence[dict[str, Any]], offered: set[str]) -> str | None:
    """The skills whose tools are all offered to this turn, each under its name."""
    parts = []
    for skill in skills:
        needs = list(skill.get("tools") or ())
        if any(name not in offered for name in needs):
            continue
        head = f"## {skill['name']}" + (f" (tools: {', '.join(needs)})" if needs else "")
        parts.append(f"{head}\n{str(skill.get('instructions') or '').strip()}")
    return f"{SKILLS_HEADER}\n" + "\n\n".join(parts) if parts else None


def tool_docs_text(tools: Sequence[ToolSpec]) -> str | None:
    """Each offered tool: its name, description and parameters (name, type, required)."""
    if not tools:
        return None
    lines = [TOOLS_HEADER]
    for tool in tools:
        lines.append(f"- {tool.name}: {(tool.description or '').strip()}")
        schema = tool.parameters or {}
        required = set(schema.get("required") or ())
        for name, spec in list((schema.get("properties") or {}).items())[
                :MAX_PARAMETERS_SHOWN]:
            kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
            note = (spec.get("description") or "") if isinstance(spec, dict) else ""
            lines.append(f"  - {name} ({kind}{', required' if name in required else ''})"
                         + (f": {note}" if note else ""))
    return "\n".join(lines)
