"""Tool module `agents`: `agents.delegate` hands a task to a sub-agent (API.md 1.2).

The call does not run here: the loop takes it (`agentq.agents`) when its task is
delivered. It starts a child job in a new conversation of the same tenant and user, the
parent waits without a worker (`waiting_for: children`), and the child's answer (or error)
becomes this call's result when the child ends.
"""
from __future__ import annotations

from typing import Any

from agentq.errors import ToolError
from agentq.tools.manifest import ToolContext, define_module

MAX_TASK_CHARS = 20_000


def delegate(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Reached only outside the loop (a direct registry call): a sub-agent needs a job."""
    raise ToolError("agents.delegate runs as a sub-agent job of the calling job; it cannot "
                    "run on its own")


_LIMIT = {"type": "integer", "minimum": 1}

MODULE = define_module({
    "module": "agents",
    "description": "Sub-agents: hand a task to another agent and get its answer.",
    "tools": [
        {
            "name": "agents.delegate",
            "description": ("Hand a self-contained task to a sub-agent, which works on it in "
                            "a conversation of its own (with its own tools) and answers. "
                            "Several delegate calls in one reply run in parallel. The result "
                            "is the sub-agent's answer."),
            "parameters": {
                "type": "object",
                "properties": {
                    "task": {"type": "string", "minLength": 1, "maxLength": MAX_TASK_CHARS,
                             "description": "What the sub-agent is to do, with everything it "
                                            "needs to know: it sees nothing else."},
                    "persona_id": {"type": "string", "format": "uuid",
                                   "description": "The sub-agent's persona (default: this "
                                                  "agent's)."},
                    "limits": {
                        "type": "object",
                        "properties": {"max_iterations": _LIMIT, "max_tokens": _LIMIT,
                                       "max_seconds": _LIMIT},
                        "additionalProperties": False,
                        "description": "The sub-agent's own limits (within this job's)."},
                },
                "required": ["task"],
                "additionalProperties": False,
            },
            "permission": "guest",
            "function": delegate,
            "idempotent": True,  # keyed by its tool_use_id: one child however often it runs
            "time_limit_s": 30,
        },
    ],
})
