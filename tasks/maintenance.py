"""Maintenance tasks (beat): the sweeper."""
from __future__ import annotations

from agentq.loop.sweeper import sweep as sweep_jobs
from agentq.loop.sweeper import sweep_waiting
from tasks.app import app
from tasks.base import AgentqTask, services
from tasks.dispatch import dispatch


@app.task(base=AgentqTask, name="maintenance.sweep")
def sweep() -> int:
    s = services()
    effects = sweep_jobs(s["settings"], s["sessions"])
    effects += sweep_waiting(s["settings"], s["sessions"])
    dispatch(effects)
    return len(effects)
