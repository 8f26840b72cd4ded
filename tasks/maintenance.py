"""Maintenance tasks (beat): the sweeper, and firing due schedules. Each rides out a
database blip and logs one line when it could not (tasks.base.maintenance_run)."""
from __future__ import annotations

from agentq.batches import sweep as sweep_batches
from agentq.loop.provider_wait import sweep_provider_waits
from agentq.loop.sweeper import sweep as sweep_jobs
from agentq.loop.sweeper import sweep_waiting
from tasks import names
from tasks.app import app
from tasks.base import AgentqTask, maintenance_run, services


@app.task(base=AgentqTask, name=names.SWEEP)
def sweep() -> int:
    """Stalled jobs re-driven, waiting ones started, batches advanced, overdue provider
    attempts re-sent, approvals past their deadline denied: each in its unit of work.
    Returns how many."""
    from agentq.loop.approvals import expire
    s = services()
    return maintenance_run(names.SWEEP, lambda: (
        sweep_jobs(s.settings, s.sessions) + sweep_waiting(s.settings, s.sessions)
        + sweep_batches(s.settings, s.sessions)
        + sweep_provider_waits(s.settings, s.sessions) + expire(s.settings, s.sessions)))


@app.task(base=AgentqTask, name=names.FIRE_SCHEDULES)
def fire_schedules() -> int:
    """Fire every due schedule (agentq.schedules): exactly once per tick, whichever beat
    process runs this first."""
    from agentq.schedules import fire_due
    s = services()
    return maintenance_run(names.FIRE_SCHEDULES, lambda: fire_due(s.settings, s.sessions))


@app.task(base=AgentqTask, name=names.SUMMARIZE_IDLE)
def summarize_idle() -> int:
    """Idle conversations into memories of their users (agentq.memory_digest): safe to run
    twice at once or to be delivered again."""
    from agentq.memory_digest import summarize_idle as digest_idle
    s = services()
    return maintenance_run(names.SUMMARIZE_IDLE,
                           lambda: digest_idle(s.settings, s.sessions, s.router))
