"""Effects as a unit of work hands them on, for the dispatcher's tests (tests/unit/test_uow.py
and the process it starts): one of each kind, and a turn of one tool call."""
from __future__ import annotations

import uuid

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


def one_of_each(job_id: str) -> list[Effect]:
    batch = str(uuid.uuid4())
    return [NextStep(job_id, 0, "continue"),
            DispatchTools(job_id, 1, (("tool_unit_a", "unit-tools", 5.0),
                                      ("tool_unit_b", "unit-tools", 5.0))),
            RevokeTools(("tool_unit_c",)), JobEnded(job_id, "completed", "end_turn"),
            SendWebhooks((str(uuid.uuid4()),)), AdmitBatch(batch),
            BatchEnded(batch, "completed")]


def one_call(job_id: str) -> list[Effect]:
    """A turn of one tool call."""
    return [DispatchTools(job_id, 1, (("tool_unit_a", "unit-tools", 5.0),))]
