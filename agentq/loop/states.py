"""The job's vocabulary: every value its state columns take, as enums, and the groups of
them the code, the API, the dashboard and the CLI ask about, derived from the enums; and the
statuses of what makes jobs, batches and schedules.

A leaf: it imports nothing of agentq, so the models (whose columns are typed by these
enums), the API's schemas, the CLI and the client all read one spelling. The enums are
`StrEnum`s stored as their values (`agentq.column_types.enum_column`), so a member is
the string that was always in the row: `job.status == "queued"` still holds for a loaded
job, and no row changed when the columns became enum-typed.

Which value follows which is `agentq.loop.lifecycle`'s table of transitions.
"""
from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    """For a person's approval of a tool call (waiting_for = approval) or for its
    sub-agents (waiting_for = children), holding no worker."""
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Phase(enum.StrEnum):
    LLM = "llm"
    """The next step calls the model."""
    TOOLS = "tools"
    """The turn's tool calls are out; the next step collects their results."""


class WaitingFor(enum.StrEnum):
    CONVERSATION = "conversation"
    """Another job owns the conversation; this one starts when it ends."""
    BATCH = "batch"
    """A batch line not admitted yet (the batch's concurrency is full)."""
    QUOTA = "quota"
    """Its tenant runs `running_jobs` jobs already (agentq.tenants): it holds its
    conversation but takes no step until one of them ends."""
    APPROVAL = "approval"
    """A tool call awaits a person (status `waiting`)."""
    PROVIDER = "provider"
    """Every model failed transiently; the step comes back at `provider_next_attempt_at`
    (status `running`, shown `waiting` by the API)."""
    CHILDREN = "children"
    """Its sub-agents run (`agents.delegate`; status `waiting`); the last one's end wakes it."""


class ReplayMode(enum.StrEnum):
    RECORDED = "recorded"
    """The original's replies are played back: no provider, nothing billed."""
    LIVE = "live"
    """The model is called again on the original's question."""


class StopReason(enum.StrEnum):
    """Why a job ended (its `finish_reason`)."""
    END_TURN = "end_turn"
    LENGTH = "length"
    """The model's reply was cut at its output limit: an answer, but not a whole one."""
    MAX_ITERATIONS = "max_iterations"
    MAX_TOKENS = "max_tokens"
    MAX_TIME = "max_time"
    BUDGET_EXCEEDED = "budget_exceeded"
    CANCELLED = "cancelled"
    ERROR = "error"
    HOOK = "hook"


class ToolCallStatus(enum.StrEnum):
    """pending → succeeded | failed | cancelled; a call of a `requires_approval` tool starts
    `awaiting` (a person) → pending (approved) | failed (denied, timed out) | cancelled."""
    PENDING = "pending"
    AWAITING = "awaiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class BatchStatus(enum.StrEnum):
    """queued → running (its first line admitted) → completed | cancelled (its last line
    ended; cancelled when a cancel was asked for): `agentq.batches`."""
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class ScheduleStatus(enum.StrEnum):
    """active → completed (a one-off that fired) | cancelled: `agentq.schedules`."""
    ACTIVE = "active"
    COMPLETED = "completed"
    """Shown `done` by the API (`SCHEDULE_SHOWN`): the rows predate the contract's name."""
    CANCELLED = "cancelled"


class DeliveryStatus(enum.StrEnum):
    """One webhook delivery attempt's row: pending → succeeded | failed (another attempt
    follows, a row of its own) | gave_up (the retry schedule ran out): `agentq.webhooks`."""
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    GAVE_UP = "gave_up"


def values(*members: enum.StrEnum) -> tuple[str, ...]:
    """The plain strings of `members` (for marshmallow's OneOf, click's Choice, SQL)."""
    return tuple(m.value for m in members)


JOB_STATUSES = values(*JobStatus)
"""Every status, in the order of a job's life (the API's and the dashboard's choices)."""
ENDED = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
"""A job that has ended: nothing about it changes any more."""
ENDED_STATUSES = values(JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
UNENDED_STATUSES = values(JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.WAITING)
"""A job not ended yet (a tenant's live jobs; a conversation's busy owner)."""
LIVE_STATUSES = values(JobStatus.QUEUED, JobStatus.RUNNING)
"""A job that may still take a step (waiting ones are woken by a person or a child)."""
COUNTED_STATUSES = values(JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.COMPLETED,
                          JobStatus.FAILED, JobStatus.CANCELLED)
"""The keys of a batch's and the overview's counts (a waiting job counts as running)."""
SHOWN_WAITS = frozenset({WaitingFor.PROVIDER, WaitingFor.APPROVAL, WaitingFor.CHILDREN})
"""Waits the API shows as `status: waiting` (the others are shown `queued`)."""
NOT_ADMITTED = values(WaitingFor.CONVERSATION, WaitingFor.BATCH, WaitingFor.QUOTA)
"""Waits of a queued job before its first step: it does not count as running."""
WAITS = values(*WaitingFor)
FINISH_REASONS = values(*StopReason)
REPLAY_MODES = values(*ReplayMode)
BATCH_STATUSES = values(*BatchStatus)
BATCH_ENDED = frozenset({BatchStatus.COMPLETED, BatchStatus.CANCELLED})
"""A batch whose every line has ended: nothing about it changes any more."""
SCHEDULE_SHOWN = {ScheduleStatus.COMPLETED: "done"}
"""A schedule's stored status → the API's, where they differ (API.md: active | done |
cancelled)."""
SCHEDULE_STATUSES_SHOWN = tuple(SCHEDULE_SHOWN.get(s, s.value) for s in ScheduleStatus)
