"""What a step decides around its I/O, as pure functions of values already read.

`agentq.loop.decision` decides a turn from the model's reply; these are the smaller decisions
made on the way in and out of a step's transactions: what started a turn, what the step
after a tool turn does with that turn's calls, which limits a turn runs under, what a
finished or cut-short reply ends the job with, and whether a tool call's delivery runs its
tool. Each takes plain values, so each is unit-tested with no database or server
(tests/unit/test_loop_rules.py); the modules that do the I/O call them.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from agentq.loop.decision import Limits, Stop
from agentq.loop.lifecycle import EXECUTION_LIMITS, StopReason, ToolCallStatus

EMPTY_ANSWER = "The model gave no answer. Please try again or rephrase."
MAX_DELIVERIES = 3
"""A call whose task was delivered this often without storing a result (it crashed its
worker each time) is answered with an error instead of being run again."""
MAX_COMPACTION_ROUNDS = 4
"""Most summary calls one step makes; a backlog longer than that is folded on by the next
turns (meanwhile those old messages wait for their summary, never lost)."""

Trigger = Literal["replay", "branch", "sub_agent", "follow_up", "user", "steering",
                  "continuation"]


def turn_trigger(*, iteration: int, replay: bool, branch: bool, sub_agent: bool,
                 follow_up: bool, steered: bool) -> Trigger:
    """What started a turn (seed 001's TurnTrigger): on a job's first turn, how the job
    came to be; after it, steering input or the loop going on."""
    if iteration == 0:
        if replay:
            return "replay"
        if branch:
            return "branch"
        if sub_agent:
            return "sub_agent"
        if follow_up:
            return "follow_up"
        return "user"
    return "steering" if steered else "continuation"


def turn_limits(*, iteration: int, own: dict[str, Any], cancel_requested: bool,
                recorded_replay: bool, budget_limit: int | None, budget_used: int,
                budget_reset_at: datetime | None, tokens_used: int,
                started_at: datetime | None, now: datetime) -> Limits:
    """The limits a turn is checked against: the job's own (`own`, its `limits_applied`)
    and its user's monthly budget, which a recorded replay does not draw on (it costs
    nothing)."""
    return Limits(iteration=iteration, max_iterations=own["max_iterations"],
                  cancel_requested=cancel_requested,
                  budget_limit=None if recorded_replay else budget_limit,
                  budget_used=budget_used, budget_reset_at=budget_reset_at,
                  max_tokens=own["max_tokens"], tokens_used=tokens_used,
                  max_seconds=own["max_seconds"],
                  elapsed_s=(now - started_at).total_seconds() if started_at else 0.0)


# -- the step after a tool turn -------------------------------------------------------
@dataclass(frozen=True)
class AwaitChildren:
    """Its sub-agents still run: the job waits (status `waiting`), holding no worker; the
    last child's end sends this step again."""


@dataclass(frozen=True)
class AwaitDispatch:
    """The turn went out in more than one dispatch (some calls were held for approval):
    this callback came while another dispatch's calls still run; that one's callback
    collects the turn."""


@dataclass(frozen=True)
class Redispatch:
    """The sweeper re-drives a turn whose calls were lost: they are sent again."""


@dataclass(frozen=True)
class Collect:
    """The turn's results become tool_result messages; a call still pending is answered:
    `cancelled` when the job's cancel was recorded, else lost (`tool_task_failed`)."""
    cancelled: bool


AfterTools = AwaitChildren | AwaitDispatch | Redispatch | Collect


def after_tools(*, pending: bool, cancelled: bool, cause: str, children_running: bool,
                split_turn: bool) -> AfterTools:
    """What the step after a tool turn does with that turn's calls. A cancel collects at
    once (what did not run is answered `cancelled`); otherwise a pending call is waited
    for while a child runs or another dispatch's callback is due, sent again when the
    sweeper found it lost, and answered as lost when the callback came without it."""
    if pending and not cancelled:
        if children_running:
            return AwaitChildren()
        if cause == "callback" and split_turn:
            return AwaitDispatch()
        if cause == "sweeper":
            return Redispatch()
    return Collect(cancelled)


# -- how a reply ends the job --------------------------------------------------------
def final_answer(content: str, model: str) -> tuple[str, dict[str, Any] | None]:
    """The job's answer and error for a reply without tool calls: a reply with no text
    (small models do this) still gives the client text to read, and an `empty_answer`
    error that says which model sent it."""
    if content.strip():
        return content, None
    return EMPTY_ANSWER, {"code": "empty_answer",
                          "message": f"Model {model} answered with no text."}


def cut_short_error(model: str, max_tokens: int | None, output_tokens: int,
                    not_run: tuple[str, ...]) -> dict[str, Any]:
    """The error of a reply cut at its output limit (finish_reason `length`): the answer
    is incomplete, and the calls it asked for were not run (named)."""
    limit = f" of {max_tokens} tokens" if max_tokens else ""
    message = (f"The reply of model {model} was cut at its output limit{limit}: "
               "the answer is incomplete.")
    if not_run:
        message += f" Its tool calls were not run ({', '.join(not_run)})."
    error: dict[str, Any] = {"code": "length", "message": message,
                             "output_tokens": output_tokens, "max_tokens": max_tokens}
    if not_run:
        error["tool_calls_not_run"] = list(not_run)
    return error


def leaves_note(reason: StopReason | str) -> bool:
    """Whether a stop leaves "[Agent stopped: <reason>]" in the conversation (and answers
    with the last assistant text): an execution limit or a hook, not an error."""
    return reason in EXECUTION_LIMITS or reason == StopReason.HOOK


def context_overflow(tokens: int, budget: int, model: str) -> Stop:
    """Compacted as far as it goes, the context still needs more than the model takes."""
    return Stop(StopReason.ERROR,
                f"The context needs {tokens} tokens after compaction; the model "
                f"{model} takes {budget}.",
                {"code": "context_overflow", "tokens": tokens, "budget": budget})


# -- whether a tool call's delivery runs its tool -----------------------------------------
@dataclass(frozen=True)
class Settled:
    """Stored already (another delivery ran it): this one answers with its status."""
    status: str


@dataclass(frozen=True)
class CancelCall:
    """Its job ended or is to be cancelled: the call is answered `cancelled`, not run."""


@dataclass(frozen=True)
class Delegate:
    """A sub-agent: a job is started, not a function run (`agentq.agents`)."""


@dataclass(frozen=True)
class Elsewhere:
    """Another delivery runs it (its lease is live): this one waits for that one's
    result instead of running the tool a second time."""


@dataclass(frozen=True)
class Interrupted:
    """The delivery that started it died without storing a result and the tool is not
    idempotent: it may have acted already, so it is not run again (the model is told)."""


@dataclass(frozen=True)
class Start:
    """This delivery starts the call (its `attempts`-th delivery). `crashed`: it was
    delivered more than MAX_DELIVERIES times without a result (it crashes its worker) and
    is answered with an error instead of being run again."""
    attempts: int
    crashed: bool = False


Verdict = Settled | CancelCall | Delegate | Elsewhere | Interrupted | Start


def call_verdict(*, status: str, job_ended: bool, cancel_requested: bool, delegate: bool,
                 attempts: int, lease_until: datetime | None, now: datetime,
                 idempotent: bool) -> Verdict:
    """A delivery of a tool call: whether it runs the tool. At-least-once for an idempotent
    tool whose running delivery died (its lease ran out); at-most-once otherwise."""
    if status != ToolCallStatus.PENDING:
        return Settled(status)
    if job_ended or cancel_requested:
        return CancelCall()
    if delegate:
        return Delegate()
    if attempts and lease_until is not None and lease_until > now:
        return Elsewhere()
    if attempts and not idempotent:
        return Interrupted()
    return Start(attempts + 1, crashed=attempts + 1 > MAX_DELIVERIES)
