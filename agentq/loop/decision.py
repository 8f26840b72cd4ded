"""What one turn decides: a typed value, a pure function of persisted state and the reply.

A turn of a job (see `agentq.loop.step` for the whole contract):

  1. limits: cancelled? model calls used up (max_iterations)? budget used up?  → `Stop`
  2. context: system prompt + history window (the step builds it)
  3. model call (the step makes it)
  4. decide: no tool calls → `Finish(content)`; tool calls → `RunTools(calls)`; a reply
     cut at its output limit → `Finish(content, cut=True)`, its calls not run

`decide` never raises for anything the model sends: a call to a tool that does not exist,
was not offered, or has arguments that are not JSON becomes a `PlannedCall` that is already
resolved with an error result the model will read (seed 004).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

from agentq.config import Settings
from agentq.llm.types import LLMReply
from agentq.loop.states import StopReason


@dataclass(frozen=True)
class Finish:
    content: str
    cut: bool = False
    """The reply was cut at its output limit (finish_reason `length`): the job ends with
    what there is, `completed` with finish_reason `length`, never `end_turn`."""
    not_run: tuple[str, ...] = ()
    """A cut reply's tool calls, by name: none is run (the last one's arguments are cut
    short; a call is never run on part of what the model meant to send)."""


@dataclass(frozen=True)
class PlannedCall:
    provider_call_id: str
    name: str
    arguments: dict[str, Any] | None
    error: dict[str, Any] | None = None
    """Set when the call is answered without running (unknown tool, bad JSON, not allowed)."""
    raw_arguments: str = ""
    """The arguments as the model sent them (what a rejected call's view shows when they
    were not a JSON object)."""


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

CANCELLED = Stop(StopReason.CANCELLED, "The job was cancelled.")
"""The job's cancel was recorded: it ends `cancelled`."""


@dataclass(frozen=True)
class Limits:
    """What the pre-call checks need, read from the job and its user."""
    iteration: int
    max_iterations: int
    cancel_requested: bool = False
    budget_limit: int | None = None
    budget_used: int = 0
    budget_reset_at: datetime | None = None
    max_tokens: int | None = None
    """This job's token limit (input + output, summaries included); None: none."""
    tokens_used: int = 0
    max_seconds: float | None = None
    """This job's wall-time limit from its start; None: none."""
    elapsed_s: float = 0.0


def effective_limits(settings_iterations: int, settings_tokens: int | None,
                     settings_seconds: float | None,
                     *sources: dict[str, Any] | None) -> dict[str, Any]:
    """The smaller of each limit across the settings and `sources` (a persona's, a
    request's); None where none sets it."""
    out: dict[str, Any] = {"max_iterations": settings_iterations,
                           "max_tokens": settings_tokens, "max_seconds": settings_seconds}
    for source in sources:
        for key in out:
            value = (source or {}).get(key)
            if value is not None:
                out[key] = value if out[key] is None else min(out[key], value)
    return out


def applied_limits(settings: Settings, persona_limits: dict[str, Any] | None,
                   requested: dict[str, Any] | None) -> dict[str, Any]:
    """The limits that apply to a new job (the job object's `limits_applied`): the
    smallest of the settings', the persona's and the request's."""
    return effective_limits(settings.max_iterations, settings.max_job_tokens,
                            settings.max_seconds, persona_limits, requested)


def check_limits(limits: Limits) -> Stop | None:
    """Before every model call: cancel, then the iteration guard, the job's token and time
    limits, then the budget."""
    if limits.cancel_requested:
        return CANCELLED
    if limits.iteration >= limits.max_iterations:
        return Stop(StopReason.MAX_ITERATIONS,
                    f"Stopped after {limits.iteration} model calls (the limit is "
                    f"{limits.max_iterations}) without a final answer.",
                    {"iterations": limits.iteration, "limit": limits.max_iterations})
    if limits.max_tokens is not None and limits.tokens_used >= limits.max_tokens:
        return Stop(StopReason.MAX_TOKENS,
                    f"Stopped after using {limits.tokens_used} tokens (the job's limit is "
                    f"{limits.max_tokens}) without a final answer.",
                    {"used": limits.tokens_used, "limit": limits.max_tokens})
    if limits.max_seconds is not None and limits.elapsed_s >= limits.max_seconds:
        return Stop(StopReason.MAX_TIME,
                    f"Stopped after {limits.elapsed_s:.1f} s (the job's limit is "
                    f"{limits.max_seconds:g} s) without a final answer.",
                    {"elapsed_s": round(limits.elapsed_s, 3), "limit": limits.max_seconds})
    if limits.budget_limit is not None and limits.budget_used >= limits.budget_limit:
        when = (f" It resets at {limits.budget_reset_at.isoformat()}."
                if limits.budget_reset_at else "")
        return Stop(StopReason.BUDGET_EXCEEDED,
                    f"Your monthly token budget is used up ({limits.budget_used} of "
                    f"{limits.budget_limit} tokens).{when}",
                    {"used": limits.budget_used, "limit": limits.budget_limit})
    return None


def decide(reply: LLMReply, offered: Iterable[str], max_calls: int = 0) -> Decision:
    """The turn's decision from the model's reply and the names of the tools offered.
    `max_calls` (the tenant's `tool_calls_per_turn`; 0: no cap): the calls past it are
    answered with the error `too_many_tool_calls`, never run."""
    if reply.stop_reason == "max_tokens":
        return Finish(reply.content, cut=True,
                      not_run=tuple(call.name for call in reply.tool_calls))
    if not reply.tool_calls:
        return Finish(reply.content)
    offered = set(offered)
    planned = []
    for position, call in enumerate(reply.tool_calls):
        error = None
        if max_calls and position >= max_calls:
            error = {"code": "too_many_tool_calls",
                     "message": f"Only {max_calls} tool calls are run per reply; this one "
                                f"(call {position + 1} of {len(reply.tool_calls)}) was not. "
                                "Make fewer calls at a time."}
        elif call.arguments is None:
            error = {"code": "invalid_arguments",
                     "message": f"Arguments for {call.name} are not a JSON object: "
                                f"{call.arguments_error or 'unreadable'}"}
        elif call.name not in offered:
            error = {"code": "tool_not_found",
                     "message": f"No tool named {call.name!r} is available. Available: "
                                f"{', '.join(sorted(offered)) or 'none'}."}
        planned.append(PlannedCall(call.id, call.name, call.arguments, error,
                                   call.raw_arguments))
    return RunTools(tuple(planned), reply.content)


@dataclass(frozen=True)
class WaitForProvider:
    """Every model failed with a transient error: park the job, try again at
    `next_attempt_at` (attempt number `attempt` was the one that just failed)."""
    next_attempt_at: datetime
    delay_s: float
    attempt: int
    waiting_since: datetime


def provider_backoff_s(attempt: int, base_s: float, max_s: float, jitter: float,
                       retry_after_s: float | None = None) -> float:
    """The delay after failed attempt `attempt` (1, 2, ...): base · 2^(attempt-1), capped at
    `max_s`, "equal jitter" (half fixed, half `jitter` ∈ [0, 1) of it) so a fleet that parked
    together does not come back together; a provider's `Retry-After` is a floor."""
    ceiling = min(max_s, base_s * 2.0 ** min(max(attempt - 1, 0), 30))
    delay = ceiling / 2 + ceiling / 2 * min(max(jitter, 0.0), 1.0)
    if retry_after_s is not None and retry_after_s > delay:
        delay = retry_after_s
    return delay


def wait_for_provider(*, now: datetime, waiting_since: datetime | None, attempts: int,
                      window_s: float, base_s: float, max_s: float, jitter: float,
                      retry_after_s: float | None, last_error: str
                      ) -> WaitForProvider | Stop:
    """After a transient failure of the whole chain: wait (with a growing delay) while the
    window that began at the first such failure lasts; the last attempt is made at the
    window's end; a failure after it ends the job `provider_unavailable`."""
    since = waiting_since or now
    attempt = attempts + 1
    deadline = since + timedelta(seconds=window_s)
    if now >= deadline:
        waited = (now - since).total_seconds()
        return Stop(StopReason.ERROR,
                    f"The model provider kept failing for {waited:.0f} s ({attempt} "
                    f"attempts); last error: {last_error}",
                    {"code": "provider_unavailable", "attempts_made": attempt,
                     "waited_s": round(waited, 3)})
    delay = provider_backoff_s(attempt, base_s, max_s, jitter, retry_after_s)
    next_at = min(now + timedelta(seconds=delay), deadline)
    return WaitForProvider(next_at, (next_at - now).total_seconds(), attempt, since)


def remaining_output_budget(limits: Limits, requested: int | None) -> int | None:
    """Cap a call's output tokens by what is left of the budget (never below 1)."""
    if limits.budget_limit is None:
        return requested
    left = max(1, limits.budget_limit - limits.budget_used)
    return left if requested is None else min(requested, left)
