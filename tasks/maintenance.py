"""Maintenance tasks (beat): the sweeper, and firing due schedules."""
from __future__ import annotations

from agentq.loop.sweeper import sweep as sweep_jobs
from agentq.loop.provider_wait import sweep_provider_waits
from agentq.loop.sweeper import sweep_waiting
from tasks.app import app
from tasks.base import AgentqTask, services
from tasks.dispatch import dispatch


@app.task(base=AgentqTask, name="maintenance.sweep")
def sweep() -> int:
    s = services()
    effects = sweep_jobs(s["settings"], s["sessions"])
    effects += sweep_waiting(s["settings"], s["sessions"])
    effects += sweep_provider_waits(s["settings"], s["sessions"])
    from agentq.approvals import expire
    effects += expire(s["settings"], s["sessions"])  # approvals past their deadline: denied
    dispatch(effects)
    return len(effects)


@app.task(base=AgentqTask, name="maintenance.fire_schedules")
def fire_schedules() -> int:
    """Fire every due schedule (agentq.schedules): exactly once per tick, whichever beat
    process runs this first."""
    from agentq.schedules import fire_due
    s = services()

    def committed(buffers, effects) -> None:
        for events in buffers:
            events.announce()
        dispatch(effects)

    return fire_due(s["settings"], s["sessions"], on_committed=committed)


@app.task(base=AgentqTask, name="maintenance.summarize_idle")
def summarize_idle() -> int:
    """Idle conversations into memories of their users (agentq.memory_digest): safe to run
    twice at once or to be delivered again."""
    from agentq.memory_digest import summarize_idle as digest_idle
    s = services()
    return digest_idle(s["settings"], s["sessions"], s["router"])
