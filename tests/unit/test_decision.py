"""The turn's decision: the pre-call limits and what a model reply becomes."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from agentq.llm.types import LLMReply, ToolCallRequest
from agentq.loop.decision import (
    Finish,
    Limits,
    PlannedCall,
    RunTools,
    Stop,
    check_limits,
    decide,
    remaining_output_budget,
)

OFFERED = ["math.evaluate", "time.now"]


def _reply(content: str = "", *calls: ToolCallRequest) -> LLMReply:
    return LLMReply(content=content, tool_calls=tuple(calls),
                    stop_reason="tool_use" if calls else "end_turn", model="gpt-4o-mini",
                    input_tokens=10, output_tokens=5)


# --- check_limits ---------------------------------------------------------------------

def test_nothing_stops_a_job_within_its_limits():
    # given a job below its iteration limit with budget left
    limits = Limits(iteration=1, max_iterations=10, budget_limit=100, budget_used=99)
    # when / then
    assert check_limits(limits) is None


def test_cancel_wins_over_every_other_limit():
    # given a cancelled job that is also out of iterations and budget
    limits = Limits(iteration=10, max_iterations=10, cancel_requested=True,
                    budget_limit=100, budget_used=500)
    # when
    stop = check_limits(limits)
    # then
    assert isinstance(stop, Stop)
    assert stop.reason == "cancelled"


def test_max_iterations_wins_over_the_budget():
    # given a job out of iterations and out of budget
    limits = Limits(iteration=3, max_iterations=3, budget_limit=100, budget_used=500)
    # when
    stop = check_limits(limits)
    # then
    assert stop.reason == "max_iterations"
    assert stop.details == {"iterations": 3, "limit": 3}


def test_budget_stops_when_it_is_the_only_limit_reached():
    # given
    reset = datetime(2030, 1, 1, tzinfo=timezone.utc)
    limits = Limits(iteration=0, max_iterations=3, budget_limit=100, budget_used=101,
                    budget_reset_at=reset)
    # when
    stop = check_limits(limits)
    # then
    assert stop.reason == "budget_exceeded"
    assert stop.details == {"used": 101, "limit": 100}
    assert reset.isoformat() in stop.message


def test_budget_exactly_at_its_limit_is_exceeded():
    # given a user who used exactly the whole budget
    limits = Limits(iteration=0, max_iterations=3, budget_limit=100, budget_used=100)
    # when
    stop = check_limits(limits)
    # then
    assert stop is not None and stop.reason == "budget_exceeded"


def test_no_budget_means_unlimited():
    # given a user without a budget who used a great deal
    limits = Limits(iteration=0, max_iterations=3, budget_limit=None, budget_used=10**12)
    # when / then
    assert check_limits(limits) is None


# --- decide ---------------------------------------------------------------------------

def test_a_reply_without_tool_calls_finishes_with_its_content():
    # given / when
    decision = decide(_reply("The answer is 4."), OFFERED)
    # then
    assert decision == Finish("The answer is 4.")


def test_a_reply_with_tool_calls_runs_them_in_order():
    # given
    reply = _reply("Let me check.",
                   ToolCallRequest("c1", "math.evaluate", {"expression": "2+2"}),
                   ToolCallRequest("c2", "time.now", {}))
    # when
    decision = decide(reply, OFFERED)
    # then
    assert decision == RunTools((PlannedCall("c1", "math.evaluate", {"expression": "2+2"}),
                                 PlannedCall("c2", "time.now", {})), "Let me check.")
    assert all(call.error is None for call in decision.calls)


@pytest.mark.parametrize("name", ["web.search", "code.run_python"])
def test_a_call_to_a_tool_not_offered_is_answered_with_tool_not_found(name):
    # given a call to a tool that does not exist or was not offered to this caller
    reply = _reply("", ToolCallRequest("c1", name, {"x": 1}))
    # when
    decision = decide(reply, OFFERED)
    # then
    assert isinstance(decision, RunTools)
    (call,) = decision.calls
    assert call.error["code"] == "tool_not_found"
    assert name in call.error["message"]
    assert "math.evaluate" in call.error["message"]  # tells the model what exists


def test_arguments_that_are_not_json_are_answered_with_invalid_arguments():
    # given a call whose arguments the router could not parse
    reply = _reply("", ToolCallRequest("c1", "math.evaluate", None, raw_arguments="{oops",
                                       arguments_error="Expecting property name"))
    # when
    decision = decide(reply, OFFERED)
    # then
    (call,) = decision.calls
    assert call.arguments is None
    assert call.error["code"] == "invalid_arguments"
    assert "Expecting property name" in call.error["message"]


def test_good_and_bad_calls_of_one_reply_are_kept_together_in_order():
    # given
    reply = _reply("", ToolCallRequest("c1", "nope.tool", {}),
                   ToolCallRequest("c2", "math.evaluate", {"expression": "1"}))
    # when
    decision = decide(reply, OFFERED)
    # then
    assert [c.provider_call_id for c in decision.calls] == ["c1", "c2"]
    assert decision.calls[0].error["code"] == "tool_not_found"
    assert decision.calls[1].error is None


# --- remaining_output_budget ------------------------------------------------------------

@pytest.mark.parametrize("limit, used, requested, expected", [
    (None, 10**9, 500, 500),    # unlimited: the request stands
    (None, 0, None, None),
    (100, 90, 50, 10),          # capped by what is left
    (100, 90, None, 10),
    (100, 20, 50, 50),          # the request is smaller than what is left
    (100, 100, 50, 1),          # never below 1
    (100, 150, None, 1),
])
def test_remaining_output_budget_caps_the_output_tokens(limit, used, requested, expected):
    # given
    limits = Limits(iteration=0, max_iterations=5, budget_limit=limit, budget_used=used)
    # when / then
    assert remaining_output_budget(limits, requested) == expected


def test_the_smaller_limit_wins_and_the_settings_cap_them():
    from agentq.loop.decision import effective_limits
    persona = {"max_iterations": 8, "max_tokens": 1000}
    request = {"max_iterations": 50, "max_seconds": 30.0}
    assert effective_limits(10, None, None, persona, request) == {
        "max_iterations": 8, "max_tokens": 1000, "max_seconds": 30.0}
    assert effective_limits(10, 500, 20.0, None, request) == {
        "max_iterations": 10, "max_tokens": 500, "max_seconds": 20.0}
    assert effective_limits(10, None, None) == {
        "max_iterations": 10, "max_tokens": None, "max_seconds": None}


def test_token_and_time_limits_stop_with_their_own_reasons():
    stop = check_limits(Limits(iteration=2, max_iterations=10, max_tokens=40, tokens_used=45))
    assert stop.reason == "max_tokens" and stop.details == {"used": 45, "limit": 40}
    stop = check_limits(Limits(iteration=2, max_iterations=10, max_seconds=1.0, elapsed_s=1.5))
    assert stop.reason == "max_time"
    assert check_limits(Limits(iteration=2, max_iterations=10, max_tokens=40, tokens_used=39,
                               max_seconds=1.0, elapsed_s=0.5)) is None


def test_a_reply_cut_at_its_output_limit_finishes_cut_and_runs_none_of_its_calls():
    """Issue 31 item 2: finish_reason `length` (stop_reason max_tokens)."""
    from agentq.llm.types import LLMReply, ToolCallRequest
    from agentq.loop.decision import Finish, decide
    cut_text = LLMReply("Once upon a", (), "max_tokens", "m", 10, 5)
    assert decide(cut_text, []) == Finish("Once upon a", cut=True)
    cut_call = LLMReply("Let me", (ToolCallRequest("c1", "math.evaluate", None, '{"expr',
                                                   "cut short"),), "max_tokens", "m", 10, 5)
    assert decide(cut_call, ["math.evaluate"]) == Finish("Let me", cut=True,
                                                          not_run=("math.evaluate",))
