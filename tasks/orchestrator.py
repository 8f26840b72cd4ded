"""Orchestrator tasks: thin; the loop lives in agentq.loop.step."""
from __future__ import annotations

import logging

# every worker loads this module (tasks.app's `include`): its units of work send effects
# as Celery messages through tasks.dispatch, which registers itself on import
import tasks.dispatch  # noqa: E402,F401
from agentq import logs, tracing
from agentq.db import DATABASE_UNREACHABLE
from agentq.loop.effects import Cause
from tasks import names
from tasks.app import app
from tasks.base import DATABASE_RETRIES, AgentqTask, services

log = logging.getLogger(__name__)


def _run(job_id: str, iteration: int, cause: Cause) -> None:
    token = logs.bind(job_id=job_id, iteration=iteration)
    tracing.annotate(job_id=job_id, iteration=iteration, cause=cause)
    try:
        # its units of work hand their effects to the dispatcher after each commit
        services().stepper.run(job_id, iteration, cause)
    except DATABASE_UNREACHABLE as exc:
        # The database is away, or every pooled connection stayed busy (a burst of re-driven
        # steps after an outage): transient, never a reason to fail the job. The task tries
        # again (DATABASE_RETRIES); the sweeper re-drives what the retries did not finish.
        log.warning("step could not reach the database; it is tried again",
                    extra={"error": type(exc).__name__})
        raise
    except Exception as exc:
        log.exception("step failed")
        services().stepper.fail(job_id, exc)
    finally:
        logs.unbind(token)


@app.task(base=AgentqTask, name=names.STEP, **DATABASE_RETRIES)
def step(job_id: str, iteration: int, cause: Cause = "continue") -> None:
    _run(job_id, iteration, cause)


@app.task(base=AgentqTask, name=names.AFTER_TOOLS, **DATABASE_RETRIES)
def after_tools(_results: object, job_id: str, iteration: int) -> None:
    """The chord's callback: every tool task of the turn has returned."""
    _run(job_id, iteration, "callback")


@app.task(base=AgentqTask, name=names.TOOLS_FAILED, **DATABASE_RETRIES)
def tools_failed(job_id: str, iteration: int) -> None:
    """The chord's error callback: a tool task died; the step answers it with an error."""
    _run(job_id, iteration, "errback")


@app.task(base=AgentqTask, name=names.ADVANCE_BATCH)
def advance_batch(batch_id: str) -> None:
    """A batch job ended: admit the batch's next jobs, end the batch after its last one
    (its own unit of work: the batch's lock, no job's)."""
    import uuid

    from agentq.batches import advance
    advance(services().sessions, uuid.UUID(batch_id))
