"""Effects → Celery messages: this process's dispatcher (`agentq.uow`), called only after
the transaction that wrote the rows has committed. A step's tool calls go out as a chord:
one task per call on its module's queue, the next step as the callback, and an error
callback so a hard failure still advances. Nothing here opens a database session: an
effect that needs a transaction (admitting a batch's next jobs) is a task of its own."""
from __future__ import annotations

import logging
from typing import Sequence, assert_never

from celery import chord, group

from agentq import tracing, uow
from agentq.config import get_settings
from agentq.loop.effects import (AdmitBatch, BatchEnded, DispatchTools, Effect, JobEnded,
                                 NextStep, RevokeTools, SendWebhooks)
from tasks.app import ORCHESTRATOR_QUEUE, app

log = logging.getLogger(__name__)
HARD_LIMIT_MARGIN_S = 30


def dispatch(effects: Sequence[Effect]) -> None:
    from tasks import orchestrator, tools, webhooks
    for effect in effects:
        match effect:
            case NextStep(job_id=job_id, iteration=iteration, cause=cause,
                          not_before=not_before):
                orchestrator.step.apply_async((job_id, iteration), {"cause": cause},
                                              queue=ORCHESTRATOR_QUEUE, eta=not_before)
            case DispatchTools(job_id=job_id, iteration=iteration, calls=calls):
                # the task id is the tool_use_id, so a cancel can revoke it by name
                header = [tools.execute.signature(
                    (tool_use_id,), queue=queue, immutable=True, task_id=tool_use_id,
                    time_limit=2 * limit_s + HARD_LIMIT_MARGIN_S)
                    for tool_use_id, queue, limit_s in calls]
                if get_settings().tool_join == "database":
                    group(header).apply_async()
                    continue
                body = orchestrator.after_tools.signature(
                    (job_id, iteration), queue=ORCHESTRATOR_QUEUE)
                body.link_error(orchestrator.tools_failed.signature(
                    (job_id, iteration), queue=ORCHESTRATOR_QUEUE, immutable=True))
                chord(header)(body)
            case JobEnded(job_id=job_id, status=status, finish_reason=reason):
                # The trace's last span of the job: made once its end has committed, a
                # child of the step that ended it.
                with tracing.span("job.end", job_id=job_id, status=status,
                                  finish_reason=reason):
                    log.info("job ended", extra={"job_id": job_id, "status": status})
            case SendWebhooks(delivery_ids=ids):
                for delivery_id in ids:  # on a broker error the sweeper sends it
                    webhooks.schedule(delivery_id)
            case AdmitBatch(batch_id=batch_id):
                orchestrator.advance_batch.apply_async((batch_id,), queue=ORCHESTRATOR_QUEUE)
            case BatchEnded(batch_id=batch_id, status=status):
                log.info("batch ended", extra={"batch_id": batch_id, "status": status})
            case RevokeTools(tool_use_ids=ids):
                if not get_settings().embedded_broker:
                    app.control.revoke(list(ids))
            case _:
                assert_never(effect)


uow.set_dispatcher(dispatch)
