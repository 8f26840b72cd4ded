"""What a unit of work asks for once its transaction has committed: plain values, so
nothing in the loop knows Celery. `agentq.loop.uow` hands them to this process's dispatcher
(`tasks.dispatch` sends Celery messages; `agentq.runner` runs them in-process); each
dispatcher handles every type below, and none opens a database session to do so."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

Cause = Literal["start", "callback", "errback", "sweeper", "continue", "provider"]


@dataclass(frozen=True)
class NextStep:
    job_id: str
    iteration: int
    cause: Cause = "continue"
    not_before: datetime | None = None
    """A delayed step (a job waiting for its provider): sent as a message with this ETA,
    so no worker is held while it waits."""


@dataclass(frozen=True)
class DispatchTools:
    job_id: str
    iteration: int
    calls: tuple[tuple[str, str, float], ...]
    """(tool_use_id, queue, time limit in seconds) per call."""


@dataclass(frozen=True)
class RevokeTools:
    """Queued tool tasks of a cancelled job (their Celery task id is the tool_use_id)."""
    tool_use_ids: tuple[str, ...]


@dataclass(frozen=True)
class JobEnded:
    job_id: str
    status: str
    finish_reason: str | None = field(default=None, compare=False)
    """For the `job.end` span only; effects compare by job and status."""


@dataclass(frozen=True)
class BatchEnded:
    """For the log and the dispatcher's record; its webhook goes as `SendWebhooks`."""
    batch_id: str
    status: str


@dataclass(frozen=True)
class AdmitBatch:
    """A batch job ended: admit the next and see whether the batch is done — a task with
    a unit of work of its own, so no job's lock is held while the batch's is taken."""
    batch_id: str


@dataclass(frozen=True)
class SendWebhooks:
    """Webhook delivery rows written by the transaction (a job's or batch's end, an
    approval request) go out now: one attempt each."""
    delivery_ids: tuple[str, ...]


Effect = (NextStep | DispatchTools | RevokeTools | JobEnded | BatchEnded | AdmitBatch
          | SendWebhooks)
