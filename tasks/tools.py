"""The tool task: runs one call by tool_use_id on its module's queue; errors are values."""
from __future__ import annotations

from agentq import logs, tracing
from agentq.loop.execute import execute_tool_call
from tasks.app import app
from agentq.loop.effects import NextStep
from tasks.base import AgentqTask, services
from tasks.dispatch import dispatch


@app.task(base=AgentqTask, name="tools.execute")
def execute(tool_use_id: str) -> dict:
    token = logs.bind(tool_use_id=tool_use_id)
    tracing.annotate(tool_use_id=tool_use_id)
    try:
        s = services()
        outcome = execute_tool_call(tool_use_id, s["settings"], s["registry"], s["sessions"])
        if outcome.get("next_step"):
            job_id, iteration = outcome["next_step"]
            dispatch([NextStep(job_id, iteration, "callback")])
        return outcome
    finally:
        logs.unbind(token)
