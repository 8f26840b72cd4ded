"""A job stopped where its turn's tool call waits to run, for the tests of a tool task's
start and finish (tests/unit/test_tool_start_pg.py, test_tool_finish_pg.py)."""
from __future__ import annotations

import uuid

from agentq.testing.harness import Harness


def pending_call(h: Harness) -> tuple[uuid.UUID, str]:
    """A job whose turn asked for one call, not yet run: (its id, the call's tool_use_id).
    The harness's model must answer the first step with one tool call."""
    job_id = h.submit("write it")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    return uuid.UUID(job_id), tool_use_id
