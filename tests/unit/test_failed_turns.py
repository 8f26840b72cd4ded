"""A turn that ends in an error still ends: a `turn_end` with the error, and the hooks hear
it (`on_error`, then `after_turn`), whether the model call failed or the step itself broke
(`fail_job`, the orchestrator's catch-all)."""
from __future__ import annotations

import uuid

from sqlalchemy import select

from agentq.errors import ProviderError
from agentq.hooks import Hooks
from agentq.loop.effects import JobEnded
from agentq.models import JobEvent
from agentq.testing.harness import MODEL


class Recorder:
    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def on_error(self, ctx):
        self.calls.append(("on_error", ctx))

    def after_turn(self, ctx):
        self.calls.append(("after_turn", ctx))


def _hooked(h) -> Recorder:
    recorder = Recorder()
    h.stepper.hooks = Hooks(loaded=[("rec", recorder)])
    return recorder


def _events(h, job_id: str) -> list[tuple[str, dict]]:
    with h.sessions() as session:
        return [(e.type, e.data) for e in session.execute(
            select(JobEvent).where(JobEvent.job_id == uuid.UUID(job_id))
            .order_by(JobEvent.seq)).scalars()]


class Boom(Exception):
    pass


def test_a_failed_model_call_ends_its_turn_and_the_hooks_hear_it(make):
    h = make(ProviderError("bad request", [{"model": MODEL, "error": "400"}]))
    recorder = _hooked(h)
    job_id = h.submit()
    assert h.stepper.run(job_id, 0, "start") == [JobEnded(job_id, "failed")]
    kinds = [k for k, _ in _events(h, job_id)]
    assert kinds.count("turn_start") == kinds.count("turn_end") == 1
    assert kinds.index("turn_end") < kinds.index("job_end")
    end = next(d for k, d in _events(h, job_id) if k == "turn_end")
    assert end["turn"] == 1 and end["error"]["code"] == "provider_error"
    assert [name for name, _ in recorder.calls] == ["on_error", "after_turn"]
    after = recorder.calls[1][1]
    assert (after["job_id"], after["turn"], after["content"]) == (job_id, 1, None)
    assert after["error"]["code"] == "provider_error"


def test_a_step_that_breaks_mid_turn_ends_the_turn_with_the_error(make):
    # given a step whose model call raises something that is not a provider error (a bug)
    h = make(Boom("the step broke"))
    recorder = _hooked(h)
    job_id = h.submit()
    try:
        h.stepper.run(job_id, 0, "start")
    except Boom as exc:
        # when the orchestrator's catch-all fails the job
        effects = h.stepper.fail(job_id, exc)
    else:
        raise AssertionError("the step should have raised")
    # then the job failed, and the turn that had begun ended with the error
    assert effects[0] == JobEnded(job_id, "failed")
    job = h.job(job_id)
    assert (job.status, job.finish_reason) == ("failed", "error")
    events = _events(h, job_id)
    kinds = [k for k, _ in events]
    assert kinds.count("turn_start") == kinds.count("turn_end") == 1
    assert kinds.index("turn_end") < kinds.index("job_end")
    end = next(d for k, d in events if k == "turn_end")
    assert end == {"turn": 1, "tool_results": [],
                   "error": {"code": "internal_error", "message": "Boom: the step broke"}}
    assert [name for name, _ in recorder.calls] == ["on_error", "after_turn"]
    assert recorder.calls[1][1]["error"]["code"] == "internal_error"
    assert recorder.calls[1][1]["turn"] == 1


def test_a_step_that_breaks_before_any_turn_began_writes_no_turn_end(make):
    h = make()
    recorder = _hooked(h)
    job_id = h.submit()
    effects = h.stepper.fail(job_id, Boom("before the first turn"))
    assert effects[0] == JobEnded(job_id, "failed")
    kinds = [k for k, _ in _events(h, job_id)]
    assert "turn_end" not in kinds and kinds[-1] == "job_end"
    assert [name for name, _ in recorder.calls] == ["on_error"]


def test_a_job_already_ended_is_left_alone(make):
    h = make(ProviderError("bad request", [{"model": MODEL, "error": "400"}]))
    recorder = _hooked(h)
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    recorder.calls.clear()
    before = _events(h, job_id)
    assert h.stepper.fail(job_id, Boom("late")) == []
    assert _events(h, job_id) == before and recorder.calls == []
