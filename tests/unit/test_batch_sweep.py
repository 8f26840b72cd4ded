"""The sweeper's safety net for batches (agentq.batches.sweep), without servers: a batch
whose last line's `advance` was lost is still ended."""
from __future__ import annotations

import uuid
from datetime import timedelta

from agentq.batches import sweep
from agentq.db import utcnow
from agentq.loop.states import BatchStatus
from agentq.models import Batch
from agentq.tenants import DEFAULT_TENANT_ID


def _batch(h, age: timedelta) -> uuid.UUID:
    with h.sessions() as session, session.begin():
        batch = Batch(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID,
                      status=BatchStatus.RUNNING, total=0, meta={},
                      created_at=utcnow() - age)
        session.add(batch)
        return batch.id


def test_a_batch_whose_jobs_all_ended_unmarked_is_ended_by_the_sweep(make):
    # given a running batch with no live job, older than a step deadline, and a new one
    h = make()
    stale = _batch(h, timedelta(seconds=h.settings.step_deadline_s + 60))
    fresh = _batch(h, timedelta(0))
    # when the sweeper passes
    assert sweep(h.settings, h.sessions) == 1
    # then the stale one has ended and the new one is left to its own jobs' ends
    with h.sessions() as session:
        assert session.get(Batch, stale).status == BatchStatus.COMPLETED
        assert session.get(Batch, fresh).status == BatchStatus.RUNNING
