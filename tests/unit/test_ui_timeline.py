"""The job page's waterfall (api/ui_timeline.py): bars from a job's events, tool calls and
token logs, as the loop writes them (tests/integration/test_dashboard.py draws them from a
real job in Chromium)."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from api.ui_timeline import build, duration, ticks

T0 = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(**fields):
    values = dict(id=uuid.uuid4(), status="completed", finish_reason="end_turn",
                  created_at=at(0), started_at=at(0.5), finished_at=at(10), error=None,
                  waiting_for=None, input_tokens=30, output_tokens=12, cost_estimate=0.002)
    values.update(fields)
    return SimpleNamespace(**values)


def events(*items):
    return [SimpleNamespace(seq=n, type=kind, created_at=at(when), data=data)
            for n, (when, kind, data) in enumerate(items, 1)]


def call(ident, name, created, started, finished, status="succeeded", turn=1):
    return SimpleNamespace(tool_use_id=ident, name=name, created_at=at(created),
                           started_at=at(started) if started is not None else None,
                           finished_at=at(finished) if finished is not None else None,
                           status=status, result={"ok": status == "succeeded"},
                           arguments={}, queue="tools.x", attempts=1, iteration=turn)


def usage(turn, model="gpt-4o-mini", cost=0.001):
    return SimpleNamespace(iteration=turn, model=model, input_tokens=10, output_tokens=4,
                           cost_estimate=cost, usage_estimated=False, created_at=at(0))


ONE_TOOL_TURN = events(
    (0.5, "job_start", {}), (0.5, "message_start", {"role": "user", "kind": "question"}),
    (0.5, "message_end", {"role": "user", "kind": "question"}),
    (0.5, "turn_start", {"turn": 1}), (0.5, "message_start", {"role": "assistant", "turn": 1}),
    (2.5, "message_end", {"role": "assistant", "turn": 1, "model": "gpt-4o-mini",
                          "input_tokens": 10, "output_tokens": 4}),
    (2.5, "tool_execution_start", {"tool_use_id": "t1", "name": "math.evaluate"}),
    (4.0, "tool_execution_end", {"tool_use_id": "t1", "name": "math.evaluate"}),
    (4.1, "turn_end", {"turn": 1}),
    (4.1, "turn_start", {"turn": 2}), (4.1, "message_start", {"role": "assistant", "turn": 2}),
    (9.9, "message_end", {"role": "assistant", "turn": 2, "model": "gpt-4o-mini",
                          "input_tokens": 20, "output_tokens": 8}),
    (9.9, "turn_end", {"turn": 2}), (10, "job_end", {"status": "completed"}))


def test_an_ended_job_has_a_bar_per_step_with_its_times_tokens_and_cost():
    fall = build(job(), ONE_TOOL_TURN, [call("t1", "math.evaluate", 2.5, 3.0, 4.0)],
                 [usage(1, cost=0.001), usage(2, cost=0.003)], now=at(100))
    shown = [(b.kind, b.label, b.duration_s) for b in fall.bars]
    assert shown == [("job", "Job", 10.0), ("queued", "Queued", 0.5),
                     ("turn", "Turn 1", 3.6), ("model", "Model call: gpt-4o-mini", 2.0),
                     ("tool", "Tool: math.evaluate", 1.0),
                     ("turn", "Turn 2", 5.8), ("model", "Model call: gpt-4o-mini", 5.8)]
    tool = fall.bars[4]
    assert tool.queued_s == 0.5 and tool.status == "ok" and not tool.open
    assert [(b.input_tokens, b.output_tokens, b.cost) for b in fall.bars if b.kind == "model"] \
        == [(10, 4, 0.001), (20, 8, 0.003)]
    # placed on one axis from the job's creation to its end
    assert (fall.start, fall.end) == (at(0), at(10))
    assert (tool.left, tool.width, tool.queued_left, tool.queued_width) == (30.0, 10.0, 25.0,
                                                                          5.0)
    assert not any(b.open for b in fall.bars)


def test_a_live_job_s_open_bars_end_now():
    running = job(status="running", finished_at=None)
    so_far = ONE_TOOL_TURN[:7]  # the tool started, nothing after
    fall = build(running, so_far, [call("t1", "math.evaluate", 2.5, 3.0, None, "pending")],
                 [usage(1)], now=at(5))
    opened = [(b.kind, b.end) for b in fall.bars if b.open]
    assert opened == [("job", at(5)), ("turn", at(5)), ("tool", at(5))]
    assert fall.end == at(5)


def test_waits_for_the_provider_and_for_approval_and_a_child_are_bars():
    items = events(
        (0.1, "job_start", {}), (0.1, "turn_start", {"turn": 1}),
        (0.1, "message_start", {"role": "assistant", "turn": 1}),
        (1.0, "waiting_provider", {"turn": 1, "attempt": 1,
                                   "waiting_since": at(0.2).isoformat(), "error": "503"}),
        (2.0, "waiting_provider", {"turn": 1, "attempt": 2,
                                   "waiting_since": at(0.2).isoformat(), "error": "503"}),
        (3.0, "message_end", {"role": "assistant", "turn": 1, "model": "m",
                              "input_tokens": 1, "output_tokens": 1}),
        (3.0, "approval_required", {"tool_use_id": "g", "name": "flaky.guarded", "turn": 1}),
        (3.0, "child_started", {"job_id": "c" * 32, "tool_use_id": "d"}),
        (5.0, "approval_resolved", {"tool_use_id": "g", "decision": "approved"}),
        (5.0, "tool_execution_start", {"tool_use_id": "g"}),
        (6.0, "child_ended", {"job_id": "c" * 32, "status": "completed"}),
        (6.5, "turn_end", {"turn": 1}), (7, "job_end", {}))
    fall = build(job(finished_at=at(7)), items,
                 [call("g", "flaky.guarded", 3.0, 5.5, 6.0)], [], now=at(60))
    by_kind = {b.kind: b for b in fall.bars}
    provider = by_kind["provider"]
    assert (provider.start, provider.end) == (at(0.2), at(3.0))
    assert provider.label == "Waiting for the provider (2 attempts)"
    approval = by_kind["approval"]
    assert (approval.label, approval.duration_s, approval.status) == (
        "Approval: flaky.guarded", 2.0, "approved")
    # the approved call was queued from its approval, not from when the model asked for it
    assert by_kind["tool"].queued_from == at(5.0) and by_kind["tool"].duration_s == 0.5
    child = by_kind["child"]
    assert (child.duration_s, child.link, child.status) == (3.0, "c" * 32, "completed")


def test_a_failed_model_call_ends_with_its_turn():
    items = events((0.1, "job_start", {}), (0.1, "turn_start", {"turn": 1}),
                   (0.1, "message_start", {"role": "assistant", "turn": 1}),
                   (1.1, "turn_end", {"turn": 1, "error": {"code": "bad_request"}}),
                   (1.1, "job_end", {"status": "failed"}))
    fall = build(job(status="failed", finished_at=at(1.1)), items, [], [], now=at(9))
    model = [b for b in fall.bars if b.kind == "model"][0]
    assert (model.duration_s, model.status) == (1.0, "failed")
    assert [b.status for b in fall.bars if b.kind == "turn"] == ["failed"]


def test_axis_ticks_and_durations_are_round():
    assert ticks(2.7) == [(0.0, "0"), (18.519, "0.5 s"), (37.037, "1.0 s"), (55.556, "1.5 s"),
                          (74.074, "2.0 s"), (92.593, "2.5 s")]
    assert [label for _, label in ticks(400)][:3] == ["0", "1 min", "2 min"]
    assert [duration(s) for s in (0.0123, 3.456, 125, 3600)] == [
        "12 ms", "3.46 s", "2 min 5 s", "1 h"]


def test_a_compaction_is_a_bar_with_its_summary_s_tokens_and_cost():
    items = events((0.1, "job_start", {}), (0.1, "turn_start", {"turn": 1}),
                   (0.1, "compaction_start", {"turn": 1, "round": 1}),
                   (1.6, "compaction_end", {"strategy": "summarize", "summary_version": 3,
                                            "summary_input_tokens": 900,
                                            "summary_output_tokens": 80}),
                   (1.6, "message_start", {"role": "assistant", "turn": 1}),
                   (2.0, "message_end", {"role": "assistant", "turn": 1, "model": "m",
                                         "input_tokens": 5, "output_tokens": 2}),
                   (2.0, "turn_end", {"turn": 1}), (2.0, "job_end", {}))
    fall = build(job(finished_at=at(2.0)), items, [],
                 [usage(-3, model="summarizer", cost=0.0004), usage(1)], now=at(9))
    compaction = [b for b in fall.bars if b.kind == "compaction"][0]
    assert (compaction.label, compaction.duration_s, compaction.model) == (
        "Compaction (summarize)", 1.5, "summarizer")
    assert (compaction.input_tokens, compaction.output_tokens, compaction.cost) == (900, 80,
                                                                                   0.0004)
    assert [b.kind for b in fall.bars] == ["job", "queued", "turn", "compaction", "model"]
