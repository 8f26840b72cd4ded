"""The decisions a step makes around its I/O (agentq.loop.rules), as pure functions of
values: no database, broker or model server."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from agentq.loop import rules
from agentq.loop.decision import check_limits

NOW = datetime(2026, 11, 27, 1, 0, tzinfo=timezone.utc)
OWN = {"max_iterations": 10, "max_tokens": 1000, "max_seconds": 60.0}


@pytest.mark.parametrize("first_turn, expected", [
    ({"replay": True, "branch": True, "sub_agent": True, "follow_up": True}, "replay"),
    ({"branch": True, "sub_agent": True, "follow_up": True}, "branch"),
    ({"sub_agent": True, "follow_up": True}, "sub_agent"),
    ({"follow_up": True}, "follow_up"),
    ({}, "user"),
])
def test_a_jobs_first_turn_is_triggered_by_how_the_job_came_to_be(first_turn, expected):
    flags = {"replay": False, "branch": False, "sub_agent": False, "follow_up": False,
             **first_turn}
    assert rules.turn_trigger(iteration=0, steered=True, **flags) == expected


def test_a_later_turn_is_steering_or_the_loop_going_on():
    flags = {"replay": True, "branch": False, "sub_agent": True, "follow_up": False}
    assert rules.turn_trigger(iteration=2, steered=True, **flags) == "steering"
    assert rules.turn_trigger(iteration=2, steered=False, **flags) == "continuation"


def _after(**given):
    values = {"pending": True, "cancelled": False, "cause": "callback",
              "children_running": False, "split_turn": False, **given}
    return rules.after_tools(**values)


def test_a_turn_with_every_result_in_is_collected():
    assert _after(pending=False, cause="sweeper", children_running=True,
                  split_turn=True) == rules.Collect(cancelled=False)


def test_a_cancel_collects_at_once_whatever_still_runs():
    assert _after(cancelled=True, children_running=True, split_turn=True,
                  cause="sweeper") == rules.Collect(cancelled=True)


def test_pending_calls_are_waited_for_sent_again_or_answered_lost():
    assert _after(children_running=True, cause="sweeper") == rules.AwaitChildren()
    assert _after(split_turn=True) == rules.AwaitDispatch()
    assert _after(split_turn=True, cause="errback") == rules.Collect(cancelled=False)
    assert _after(cause="sweeper") == rules.Redispatch()
    assert _after() == rules.Collect(cancelled=False)  # the callback came without them


def test_an_empty_answer_still_gives_the_client_text_and_says_which_model():
    assert rules.final_answer("4", "small") == ("4", None)
    content, error = rules.final_answer("  \n", "small")
    assert content == rules.EMPTY_ANSWER
    assert error == {"code": "empty_answer", "message": "Model small answered with no text."}


def test_a_cut_reply_names_its_limit_and_the_calls_not_run():
    error = rules.cut_short_error("m", 256, 256, ("search", "fetch"))
    assert error["code"] == "length"
    assert "output limit of 256 tokens" in error["message"]
    assert "(search, fetch)" in error["message"]
    assert error["tool_calls_not_run"] == ["search", "fetch"]
    assert error["output_tokens"] == 256 and error["max_tokens"] == 256
    bare = rules.cut_short_error("m", None, 90, ())
    assert "tool_calls_not_run" not in bare and "Its tool calls" not in bare["message"]
    assert "output limit:" in bare["message"]


@pytest.mark.parametrize("reason, note", [
    ("max_iterations", True), ("max_tokens", True), ("max_time", True), ("hook", True),
    ("error", False), ("cancelled", False), ("budget_exceeded", False),
])
def test_limits_and_hooks_leave_a_note_errors_do_not(reason, note):
    assert rules.leaves_note(reason) is note


def test_an_overflowing_context_fails_the_job_with_its_sizes():
    stop = rules.context_overflow(9000, 8000, "small")
    assert stop.reason == "error"
    assert stop.details == {"code": "context_overflow", "tokens": 9000, "budget": 8000}
    assert "needs 9000 tokens" in stop.message and "small takes 8000" in stop.message


def test_a_recorded_replay_draws_on_no_budget():
    common = {"iteration": 1, "own": OWN, "cancel_requested": False, "budget_limit": 100,
              "budget_used": 100, "budget_reset_at": None, "tokens_used": 5,
              "started_at": NOW - timedelta(seconds=3), "now": NOW}
    live = rules.turn_limits(recorded_replay=False, **common)
    replayed = rules.turn_limits(recorded_replay=True, **common)
    assert check_limits(live).reason == "budget_exceeded"
    assert check_limits(replayed) is None
    assert live.elapsed_s == 3.0 and live.max_seconds == 60.0 and live.max_tokens == 1000


def test_a_job_not_started_has_used_no_time():
    limits = rules.turn_limits(iteration=0, own=OWN, cancel_requested=False,
                               recorded_replay=False, budget_limit=None, budget_used=0,
                               budget_reset_at=None, tokens_used=0, started_at=None, now=NOW)
    assert limits.elapsed_s == 0.0


def _verdict(**given):
    values = {"status": "pending", "job_ended": False, "cancel_requested": False,
              "delegate": False, "attempts": 0, "lease_until": None, "now": NOW,
              "idempotent": False, **given}
    return rules.call_verdict(**values)


def test_a_first_delivery_starts_its_call():
    assert _verdict() == rules.Start(1)


def test_a_stored_call_is_answered_with_its_status_even_when_the_job_ended():
    assert _verdict(status="succeeded", job_ended=True) == rules.Settled("succeeded")


def test_a_call_of_an_ended_or_cancelled_job_is_not_run():
    assert _verdict(job_ended=True, delegate=True) == rules.CancelCall()
    assert _verdict(cancel_requested=True) == rules.CancelCall()


def test_a_delegate_call_starts_a_sub_agent():
    assert _verdict(delegate=True, attempts=2) == rules.Delegate()


def test_a_live_lease_means_another_delivery_runs_it():
    assert _verdict(attempts=1, lease_until=NOW + timedelta(seconds=1),
                    idempotent=True) == rules.Elsewhere()


def test_a_dead_delivery_reruns_only_an_idempotent_tool():
    expired = NOW - timedelta(seconds=1)
    assert _verdict(attempts=1, lease_until=expired) == rules.Interrupted()
    assert _verdict(attempts=1, lease_until=expired, idempotent=True) == rules.Start(2)


def test_a_call_that_crashed_its_worker_too_often_is_answered_not_run():
    assert _verdict(attempts=rules.MAX_DELIVERIES - 1, idempotent=True) == rules.Start(
        rules.MAX_DELIVERIES)
    assert _verdict(attempts=rules.MAX_DELIVERIES, idempotent=True) == rules.Start(
        rules.MAX_DELIVERIES + 1, crashed=True)
