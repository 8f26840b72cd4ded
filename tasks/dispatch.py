"""Effects → Celery messages: this process's dispatcher (`agentq.loop.uow`), called only after
the transaction that wrote the rows has committed. A step's tool calls go out as a chord:
one task per call on its module's queue, the next step as the callback, and an error
callback so a hard failure still advances (a single call carries the two as its link and
link_error: a chord of one joins nothing). Nothing here opens a database session: an
effect that needs a transaction (admitting a batch's next jobs) is a task of its own.

Tasks are sent by name (tasks/names.py) through the app, never through a task module: a
process that only sends (the API) loads no task module, nor the step and the tools behind
them (tests/unit/test_uow.py)."""
from __future__ import annotations

import logging
from typing import Sequence, assert_never

from celery import chord, group

from agentq import tracing
from agentq.config import get_settings
from agentq.loop import uow
from agentq.loop.effects import (
    AdmitBatch,
    BatchEnded,
    DispatchTools,
    Effect,
    JobEnded,
    NextStep,
    RevokeTools,
    SendWebhooks,
)
from tasks import names
from tasks.app import app
from tasks.names import ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE

log = logging.getLogger(__name__)
HARD_LIMIT_MARGIN_S = 30
MAX_COUNTDOWN_S = 600.0
"""Longer waits are left to the sweeper: an ETA message sits in a worker's memory, and Redis
hands it out again after its visibility timeout, so hour-long countdowns would duplicate."""


def dispatch(effects: Sequence[Effect]) -> None:
    for effect in effects:
        match effect:
            case NextStep(job_id=job_id, iteration=iteration, cause=cause,
                          not_before=not_before):
                app.send_task(names.STEP, (job_id, iteration), {"cause": cause},
                              queue=ORCHESTRATOR_QUEUE, eta=not_before, ignore_result=True)
            case DispatchTools(job_id=job_id, iteration=iteration, calls=calls):
                joined_by_chord = get_settings().tool_join == "chord"
                # the task id is the tool_use_id, so a cancel can revoke it by name; a
                # chord reads its header's results
                header = [app.signature(
                    names.EXECUTE_TOOL, (tool_use_id,), queue=queue, immutable=True,
                    task_id=tool_use_id, time_limit=2 * limit_s + HARD_LIMIT_MARGIN_S,
                    ignore_result=not joined_by_chord)
                    for tool_use_id, queue, limit_s in calls]
                if not joined_by_chord:
                    group(header).apply_async()
                    continue
                body = app.signature(names.AFTER_TOOLS, (job_id, iteration),
                                     queue=ORCHESTRATOR_QUEUE, ignore_result=True)
                failed = app.signature(names.TOOLS_FAILED, (job_id, iteration),
                                       queue=ORCHESTRATOR_QUEUE, immutable=True,
                                       ignore_result=True)
                if len(header) == 1:
                    # A chord of one joins nothing: the call goes out with the next step
                    # linked, and its error callback, as the chord would call them; the
                    # worker passes its return value on, so no result is stored and
                    # counted in the backend.
                    # celery-types' Signature.set lists no ignore_result; Celery's takes any
                    call = header[0].set(ignore_result=True)  # type: ignore[call-arg]
                    call.apply_async(link=body, link_error=failed)
                    continue
                body.link_error(failed)
                chord(header)(body)
            case JobEnded(job_id=job_id, status=status, finish_reason=reason):
                # The trace's last span of the job: made once its end has committed, a
                # child of the step that ended it.
                with tracing.span("job.end", job_id=job_id, status=status,
                                  finish_reason=reason):
                    log.info("job ended", extra={"job_id": job_id, "status": status})
            case SendWebhooks(delivery_ids=ids):
                for delivery_id in ids:  # on a broker error the sweeper sends it
                    send_webhook(delivery_id)
            case AdmitBatch(batch_id=batch_id):
                app.send_task(names.ADVANCE_BATCH, (batch_id,), queue=ORCHESTRATOR_QUEUE,
                              ignore_result=True)
            case BatchEnded(batch_id=batch_id, status=status):
                log.info("batch ended", extra={"batch_id": batch_id, "status": status})
            case RevokeTools(tool_use_ids=ids):
                if not get_settings().embedded_broker:
                    app.control.revoke(list(ids))
            case _:
                assert_never(effect)


def send_webhook(delivery_id: str, countdown_s: float = 0.0) -> None:
    """Enqueue one attempt; on a broker error the row stays pending and the sweeper sends it."""
    if countdown_s > MAX_COUNTDOWN_S:
        log.info("webhook retry left to the sweeper",
                 extra={"delivery_id": delivery_id, "retry_in_s": countdown_s})
        return
    try:
        app.send_task(names.DELIVER_WEBHOOK, (delivery_id,), countdown=countdown_s or None,
                      queue=WEBHOOKS_QUEUE, ignore_result=True)
    except Exception:
        log.exception("webhook enqueue failed; the sweeper will send it",
                      extra={"delivery_id": delivery_id})


uow.set_dispatcher(dispatch)
