"""The tool task: runs one call by tool_use_id on its module's queue; errors are values."""
from __future__ import annotations

from agentq import logs, tracing
from agentq.loop.execute import OutcomeRecord, execute_tool_call
from tasks import names
from tasks.app import app
from tasks.base import DATABASE_RETRIES, AgentqTask, services


@app.task(base=AgentqTask, name=names.EXECUTE_TOOL, **DATABASE_RETRIES)
def execute(tool_use_id: str) -> OutcomeRecord:
    token = logs.bind(tool_use_id=tool_use_id)
    tracing.annotate(tool_use_id=tool_use_id)
    try:
        s = services()
        # with tool_join=database, the call that stores its turn's last result sends the
        # next step (an effect of that unit of work)
        return execute_tool_call(tool_use_id, s.settings, s.registry, s.sessions).as_dict()
    finally:
        logs.unbind(token)
