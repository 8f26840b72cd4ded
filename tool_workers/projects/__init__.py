"""Tool module `projects`: the conversation's active project, a context layer (seed 003's
active project injection; `agentq.loop.layers`). The model sets or clears it; its next
turns (and the conversation's next jobs) carry it, as `PATCH /v1/conversations/<id>
{active_project}` does."""
from __future__ import annotations

import uuid
from typing import Any

from agentq.errors import ToolError
from agentq.models import Conversation
from agentq.tools.manifest import ToolContext, define_module

MAX_PROJECT_CHARS = 4000


def set_active(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if ctx.session_factory is None:
        raise ToolError("the projects tools need a database session")
    project = args.get("project")
    project = project.strip()[:MAX_PROJECT_CHARS] if isinstance(project, str) else None
    with ctx.session_factory() as session, session.begin():
        conversation = session.get(Conversation, uuid.UUID(ctx.conversation_id))
        if conversation is None:
            raise ToolError("the job's conversation is gone")
        conversation.active_project = project or None
    return {"active_project": project or None}


MODULE = define_module({
    "module": "projects",
    "description": "The conversation's active project, kept in its context.",
    "tools": [
        {"name": "projects.set_active",
         "description": "Set the project this conversation works on (it stays in the "
                        "context of the next turns); null or empty clears it.",
         "parameters": {
             "type": "object",
             "properties": {"project": {"type": ["string", "null"],
                                        "description": "What the project is, in a few "
                                                       "sentences."}},
             "required": ["project"], "additionalProperties": False},
         "permission": "guest", "function": set_active, "time_limit_s": 30},
    ],
})
