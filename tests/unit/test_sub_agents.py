"""Sub-agents' durability, driven without Celery (tests/unit/test_step.py's harness): each
effect is run by hand, so a test loses one on purpose — the wake-up of a parent whose last
child ended, a delegate call's task — and the sweeper finds the job again."""
from __future__ import annotations

import uuid

from sqlalchemy import select

from agentq.loop.effects import DispatchTools, JobEnded, NextStep
from agentq.loop.execute import execute_tool_call
from agentq.loop.sweeper import sweep_waiting
from agentq.models import Job, JobEvent, ToolCall
from agentq.testing.harness import calls, text

AGENTS = {"AGENTQ_DEFAULT_MODULES": "agents,math", "AGENTQ_STEP_DEADLINE_S": "1"}


def _delegate(task: str) -> tuple[str, dict]:
    return ("agents.delegate", {"task": task})


def _children(h, job_id: str) -> list[str]:
    with h.sessions() as session:
        return [str(i) for i in session.execute(select(Job.id).where(
            Job.parent_job_id == uuid.UUID(job_id)).order_by(Job.created_at)).scalars()]


def _event_types(h, job_id: str) -> list[str]:
    with h.sessions() as session:
        return list(session.execute(select(JobEvent.type).where(
            JobEvent.job_id == uuid.UUID(job_id)).order_by(JobEvent.seq)).scalars())


def test_a_parent_whose_wake_up_was_lost_is_re_driven_by_the_sweeper(make):
    # given a parent that delegated one task, its child run to its end
    h = make(calls(_delegate("find it")), text("found it"), text("the child found it"),
             **AGENTS)
    parent = h.submit("delegate this")
    [dispatch] = h.stepper.run(parent, 0, "start")
    assert isinstance(dispatch, DispatchTools)
    [(tool_use_id, queue, _limit)] = dispatch.calls
    assert queue == "tools.agents"
    started = h.sent_by(execute_tool_call, tool_use_id, h.settings, h.registry, h.sessions)
    [child] = _children(h, parent)
    assert started == [NextStep(child, 0, "start")]
    assert (h.job(parent).status, h.job(parent).waiting_for) == ("waiting", "children")
    # a second delivery of the call makes no second child
    assert h.sent_by(execute_tool_call, tool_use_id, h.settings, h.registry,
                     h.sessions) == []
    assert _children(h, parent) == [child]

    # when the child ends, and the parent's wake-up is lost (never run)
    ended = h.sent_by(h.stepper.run, child, 0, "start")
    assert NextStep(parent, 1, "callback") in ended and JobEnded(child, "completed") in ended
    assert h.job(parent).status == "running"  # woken in the child's own transaction
    h.backdate(parent)
    # then the sweeper re-drives it, and it answers from the child's result
    assert h.sweep() == [NextStep(parent, 1, "sweeper")]
    assert h.stepper.run(parent, 1, "sweeper") == [JobEnded(parent, "completed")]
    assert h.job(parent).response["content"] == "the child found it"
    tool_message = h.router.requests[-1]["messages"][-1]
    assert tool_message["role"] == "tool" and "found it" in tool_message["content"]
    assert _event_types(h, parent).count("child_ended") == 1


def test_a_waiting_parent_whose_delegate_task_was_lost_gets_it_sent_again(make):
    # given a parent that delegated two tasks; only the first call's task arrived
    h = make(calls(_delegate("first"), _delegate("second")), text("one"), text("two"),
             text("both answered"), **AGENTS)
    parent = h.submit("delegate two")
    [dispatch] = h.stepper.run(parent, 0, "start")
    (first, _, _), (second, _, _) = dispatch.calls
    h.sent_by(execute_tool_call, first, h.settings, h.registry, h.sessions)
    [child_one] = _children(h, parent)
    # its child ends: the parent still waits for the other call
    assert NextStep(parent, 1, "callback") not in h.sent_by(h.stepper.run, child_one, 0,
                                                             "start")
    assert (h.job(parent).status, h.job(parent).waiting_for) == ("waiting", "children")

    # when a step deadline passes, the sweeper sends the lost call again
    h.backdate(parent)
    resent = h.sent_by(sweep_waiting, h.settings, h.sessions)
    assert [e for e in resent if isinstance(e, DispatchTools)] == [
        DispatchTools(parent, 1, ((second, "tools.agents", h.settings.tool_time_limit_s),))]
    # and once it runs, its child's end wakes the parent
    h.sent_by(execute_tool_call, second, h.settings, h.registry, h.sessions)
    child_two = [c for c in _children(h, parent) if c != child_one][0]
    assert NextStep(parent, 1, "callback") in h.sent_by(h.stepper.run, child_two, 0, "start")
    assert h.stepper.run(parent, 1, "callback") == [JobEnded(parent, "completed")]
    with h.sessions() as session:
        results = session.execute(select(ToolCall.status, ToolCall.result).where(
            ToolCall.job_id == uuid.UUID(parent)).order_by(ToolCall.position)).all()
    assert [(s, r["result"]["answer"]) for s, r in results] == [("succeeded", "one"),
                                                                ("succeeded", "two")]
    # the tokens of both children count in the parent's: its two calls and theirs
    assert h.job(parent).input_tokens == 4 * 10
