"""Every task's name and every fixed queue's, in one place. A task registers under its name
here (the decorators of tasks/orchestrator.py, tools.py, webhooks.py, maintenance.py) and a
sender sends by it (`app.send_task`, `app.signature`: tasks/dispatch.py, tasks/embedded.py),
so no sender imports a task module: the API and the dispatcher load neither the step nor the
tools. The queue names are here too, so what lists queues (the metrics' scrape, the
dashboard's overview) does not load the Celery app for them.

Nothing of ours reads a task's result but a chord's, when tool calls join by chord
(AGENTQ_TOOL_JOIN=chord): the results of its header, `EXECUTE_TOOL`. So each sender says
`ignore_result=True`, except for `EXECUTE_TOOL` under a chord. With a Redis result backend
that saves, per task sent, a SUBSCRIBE and an UNSUBSCRIBE of its result channel in the
sender and a SET and a PUBLISH in the worker. A worker follows what a message says; one
that does not say (another client's) follows the task's own `ignore_result`.
"""
from __future__ import annotations

ORCHESTRATOR_QUEUE = "orchestrator"
"""Steps and their chord callbacks (`orchestrator.*`)."""
MAINTENANCE_QUEUE = "maintenance"
"""The sweeper, schedules, the memory digest (`maintenance.*`)."""
WEBHOOKS_QUEUE = "webhooks"
"""Webhook deliveries (`webhooks.*`). Tool calls go to their module's queue
(`agentq.tools.registry.ToolRegistry.queues`)."""

STEP = "orchestrator.step"
AFTER_TOOLS = "orchestrator.after_tools"
"""The chord's callback: every tool call of the turn has returned."""
TOOLS_FAILED = "orchestrator.tools_failed"
"""The chord's error callback: a tool task died."""
ADVANCE_BATCH = "orchestrator.advance_batch"
EXECUTE_TOOL = "tools.execute"
DELIVER_WEBHOOK = "webhooks.deliver"
SWEEP = "maintenance.sweep"
SWEEP_WEBHOOKS = "maintenance.sweep_webhooks"
FIRE_SCHEDULES = "maintenance.fire_schedules"
SUMMARIZE_IDLE = "maintenance.summarize_idle"
