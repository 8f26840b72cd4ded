"""What one turn decides: a typed value, a pure function of persisted state and the reply.

A turn of a job (see `agentq.loop.step` for the whole contract):

  1. limits: cancelled? model calls used up (max_iterations)? budget used up?  → `Stop`
  2. context: system prompt + history window (the step builds it)
  3. model call (the step makes it)
  4. decide: no tool calls → `Finish(content)`; tool calls → `RunTools(calls)`

`decide` never raises for anything the model sends: a call to a tool that does not exist,
was not offered, or has arguments that are not JSON becomes a `PlannedCall` that is already
resolved with an error result the model will read (seed 004).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Literal

from agentq.llm.types import LLMReply

StopReason = Literal["max_iterations", "budget_exceeded", "cancelled", "error"]


@dataclass(frozen=True)
class Finish:
    content: str


@dataclass(frozen=True)
class PlannedCall:
    provider_call_id: str
    name: str
    arguments: dict[str, Any] | None
    error: dict[str, Any] | None = None
    """Set when the call is answered without running (unknown tool, bad JSON, not allowed)."""


@dataclass(frozen=True)
class RunTools:
    calls: tuple[PlannedCall, ...]
    content: str = ""


@dataclass(frozen=True)
class Stop:
    reason: StopReason
    message: str
    details: dict[str, Any] = field(default_factory=dict)


Decision = Finish | RunTools | Stop


@dataclass(frozen=True)
class Limits:
    """What the pre-call checks need, read from the job and its user."""
    iteration: int
    max_iterations: int
    cancel_requested: bool = False
    budget_limit: int | None = None
    budget_used: int = 0
    budget_reset_at: datetime | None = None


def check_limits(limits: Limits) -> Stop | None:
    """Before every model call: cancel, then the iteration guard, then the budget."""
    if limits.cancel_requested:
        return Stop("cancelled", "The job was cancelled.")
    if limits.iteration >= limits.max_iterations:
        return Stop("max_iterations",
                    f"Stopped after {limits.iteration} model calls (the limit is "
                    f"{limits.max_iterations}) without a final answer.",
                    {"iterations": limits.iteration, "limit": limits.max_iterations})
    if limits.budget_limit is not None and limits.budget_used >= limits.budget_limit:
        when = (f" It resets at {limits.budget_reset_at.isoformat()}."
                if limits.budget_reset_at else "")
        return Stop("budget_exceeded",
                    f"Your monthly token budget is used up ({limits.budget_used} of "
                    f"{limits.budget_limit} tokens).{when}",
                    {"used": limits.budget_used, "limit": limits.budget_limit})
    return None


def decide(reply: LLMReply, offered: Iterable[str]) -> Decision:
    """The turn's decision from the model's reply and the names of the tools offered."""
    if not reply.tool_calls:
        return Finish(reply.content)
    offered = set(offered)
    planned = []
    for call in reply.tool_calls:
        error = None
        if call.arguments is None:
            error = {"code": "invalid_arguments",
                     "message": f"Arguments for {call.name} are not a JSON object: "
                                f"{call.arguments_error or 'unreadable'}"}
        elif call.name not in offered:
            error = {"code": "tool_not_found",
                     "message": f"No tool named {call.name!r} is available. Available: "
                                f"{', '.join(sorted(offered)) or 'none'}."}
        planned.append(PlannedCall(call.id, call.name, call.arguments, error))
    return RunTools(tuple(planned), reply.content)


def remaining_output_budget(limits: Limits, requested: int | None) -> int | None:
    """Cap a call's output tokens by what is left of the budget (never below 1)."""
    if limits.budget_limit is None:
        return requested
    left = max(1, limits.budget_limit - limits.budget_used)
    return left if requested is None else min(requested, left)
