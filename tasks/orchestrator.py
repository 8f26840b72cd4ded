"""Orchestrator tasks: thin; the loop lives in agentq.loop.step."""
from __future__ import annotations

import logging

from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from agentq import logs, tracing
from tasks import names
from tasks.app import app
from tasks.base import AgentqTask, services
# every worker loads this module (tasks.app's `include`): its units of work send effects
# as Celery messages through tasks.dispatch, which registers itself on import
import tasks.dispatch  # noqa: E402,F401


log = logging.getLogger(__name__)

UNREACHABLE = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)
"""The database is away, or every pooled connection stayed busy."""
STEP_RETRIES = {"autoretry_for": UNREACHABLE, "max_retries": 5, "retry_backoff": 1,
                "retry_backoff_max": 30, "retry_jitter": True}
"""Celery's own retries of a step that could not reach the database: again within about a
second, then 2, 4, 8, 16 s (each a random share of that, so a burst of them spreads out).
A step that failed before its claim was written claims its job on a retry, and the job goes
on within seconds of a blip rather than at the sweeper's next re-drive (the step deadline,
300 s by default). One that failed after its claim finds the step taken until its lease
runs out: the retry does nothing, and the sweeper re-drives the job then, as before."""


def _run(job_id: str, iteration: int, cause: str) -> None:
    token = logs.bind(job_id=job_id, iteration=iteration)
    tracing.annotate(job_id=job_id, iteration=iteration, cause=cause)
    try:
        # its units of work hand their effects to the dispatcher after each commit
        services().stepper.run(job_id, iteration, cause)
    except UNREACHABLE as exc:
        # The database is away, or every pooled connection stayed busy (a burst of re-driven
        # steps after an outage): transient, never a reason to fail the job. The task tries
        # again (STEP_RETRIES); the sweeper re-drives what the retries did not finish.
        log.warning("step could not reach the database; it is tried again",
                    extra={"error": type(exc).__name__})
        raise
    except Exception as exc:
        log.exception("step failed")
        services().stepper.fail(job_id, exc)
    finally:
        logs.unbind(token)


@app.task(base=AgentqTask, name=names.STEP, **STEP_RETRIES)
def step(job_id: str, iteration: int, cause: str = "continue") -> None:
    _run(job_id, iteration, cause)


@app.task(base=AgentqTask, name=names.AFTER_TOOLS, **STEP_RETRIES)
def after_tools(_results, job_id: str, iteration: int) -> None:
    """The chord's callback: every tool task of the turn has returned."""
    _run(job_id, iteration, "callback")


@app.task(base=AgentqTask, name=names.TOOLS_FAILED, **STEP_RETRIES)
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
