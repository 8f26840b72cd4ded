"""Local tools (DESIGN 1.2): a module that declares itself local, named in
AGENTQ_LOCAL_MODULES, has its calls run inside the orchestrator's step, and a turn whose
calls were all local goes on to its next model call in the same step's task. What decides
it (the registry), and jobs driven through the step: the calls recorded as a tool task
records them, nothing sent for them, a mixed turn, a timeout, an approval, a re-drive."""
from __future__ import annotations

import json
import threading
import uuid

import pytest
from sqlalchemy import update

from agentq.config import Settings
from agentq.errors import ConfigError, ManifestError
from agentq.loop import approvals
from agentq.loop.effects import DispatchTools, JobEnded, NextStep
from agentq.loop.execute import execute_tool_call
from agentq.loop.uow import UnitOfWork
from agentq.models import Job, JobEvent, Message, ToolCall
from agentq.testing.harness import Harness, ScriptedModel, calls, text
from agentq.tools.manifest import define_module
from agentq.tools.registry import LOCAL_QUEUE, ToolRegistry, discover
from agentq.tools.remote import build_module
from agentq.tools.specs import ModuleSpec
from tasks.names import ORCHESTRATOR_QUEUE
from tests.support import unit_db

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}},
          "additionalProperties": False}


def _module(name: str, function, *, local: bool = True, time_limit_s: float | None = None):
    tool = {"name": f"{name}.run", "description": "A test tool.", "parameters": SCHEMA,
            "function": function, "idempotent": True}
    if time_limit_s is not None:
        tool["time_limit_s"] = time_limit_s
    return define_module({"module": name, "description": "test", "tools": [tool],
                          "local": local})


def _settings(tmp_path, **env) -> Settings:
    return Settings.from_env({"AGENTQ_HOME": str(tmp_path), **env})


def _harness(tmp_path, modules, *replies, **env) -> Harness:
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), **env})
    return Harness(settings, modules, ScriptedModel(*replies))


def _stalled(h: Harness, job_id: str) -> None:
    """The job's task died: its step's lease, and any call's hold on the job, ran out a
    minute ago (the sweeper's deadlines, without a test waiting for them)."""
    h.backdate(job_id)
    with h.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
            step_lease_until=None, step_owner=None, redrive_after=None))


def _events(h: Harness, job_id: str, type_: str) -> list[dict]:
    return [e.data for e in h.rows(JobEvent, job_id, JobEvent.seq) if e.type == type_]


# --- which calls run in the step ----------------------------------------------------------

def test_no_module_is_local_unless_the_deployment_names_it(tmp_path):
    # given the shipped modules (math and time declare themselves local) and no setting
    registry = ToolRegistry(_settings(tmp_path), discover())
    # then every call goes by chord to its module's queue, the default
    assert not registry.is_local("math") and not registry.is_local("time")
    assert registry.queue_for("math.evaluate") == "tools.math"
    assert "tools.math" in registry.queues(slow=False)


def test_a_named_module_that_declares_itself_local_runs_in_the_step(tmp_path):
    # given math named local
    registry = ToolRegistry(_settings(tmp_path, AGENTQ_LOCAL_MODULES="math"), discover())
    # then its calls are local, time's are not; no tools worker consumes a queue of math's
    assert registry.is_local("math") and not registry.is_local("time")
    assert registry.queue_for("math.evaluate") == LOCAL_QUEUE == ORCHESTRATOR_QUEUE
    assert registry.queue_for("time.now") == "tools.time"
    assert "tools.math" not in registry.queues(slow=False)
    assert LOCAL_QUEUE not in registry.queues(slow=False) + registry.queues(slow=True)
    assert "tools.time" in registry.queues(slow=False)


def test_a_local_calls_limit_is_its_tools_capped_by_the_deployments(tmp_path):
    modules = [*discover(), _module("probe", lambda a, c: 1, time_limit_s=60)]
    registry = ToolRegistry(_settings(tmp_path, AGENTQ_LOCAL_MODULES="math,probe",
                                      AGENTQ_LOCAL_TOOL_TIME_LIMIT_S="2"), modules)
    # math.evaluate's own 5 s is over the cap; probe's 60 s too
    assert registry.time_limit_for("math.evaluate") == 2
    assert registry.time_limit_for("probe.run") == 2
    # a module that is not local keeps its own limit
    assert registry.time_limit_for("time.now") == 5


@pytest.mark.parametrize("name, says", [
    ("files", "does not declare itself local"),   # in-process, with side effects
    ("agents", "does not declare itself local"),  # a sub-agent is a job
    ("nosuch", "not an in-process tool module"),
])
def test_a_module_that_may_not_be_local_is_refused_when_the_registry_is_built(
        tmp_path, name, says):
    settings = _settings(tmp_path, AGENTQ_LOCAL_MODULES=name)
    with pytest.raises(ConfigError, match=says) as raised:
        ToolRegistry(settings, discover())
    assert "AGENTQ_LOCAL_MODULES" in str(raised.value)


def test_the_sandboxed_code_module_and_remote_modules_are_refused_by_the_settings(tmp_path):
    # code is slow (sandboxed); weather is an HTTP module of AGENTQ_TOOL_MODULES
    with pytest.raises(ConfigError, match="is slow"):
        _settings(tmp_path, AGENTQ_LOCAL_MODULES="code")
    with pytest.raises(ConfigError, match="remote module"):
        _settings(tmp_path, AGENTQ_LOCAL_MODULES="weather",
                  AGENTQ_TOOL_MODULES="weather=http://127.0.0.1:9/")


def test_the_manifest_declaration_is_checked():
    with pytest.raises(ManifestError, match="'local' must be true or false"):
        define_module({"module": "m", "description": "d", "local": "yes", "tools": [
            {"name": "m.t", "description": "d", "parameters": SCHEMA,
             "function": lambda a, c: 1}]})
    with pytest.raises(ManifestError, match="slow module cannot be local"):
        define_module({"module": "m", "description": "d", "local": True, "slow": True,
                       "tools": [{"name": "m.t", "description": "d", "parameters": SCHEMA,
                                  "function": lambda a, c: 1}]})


def test_a_remote_manifest_cannot_declare_itself_local():
    spec = ModuleSpec(name="weather", url="http://127.0.0.1:9/")
    manifest = {"module": "weather", "description": "d", "local": True, "tools": [
        {"name": "weather.now", "description": "d", "parameters": SCHEMA}]}
    with pytest.raises(ManifestError, match="not a manifest key of a remote module"):
        build_module(spec, manifest, lambda *_: (lambda a, c: 1))


# --- jobs: the calls run in the step --------------------------------------------------------

def test_a_turn_of_local_calls_runs_in_the_step_and_the_next_model_call_follows(tmp_path):
    # given math local, and a model that computes with it, then answers
    h = _harness(tmp_path, discover(),
                 calls(("math.evaluate", {"expression": "6*7"}), content="Computing."),
                 text("42"), AGENTQ_LOCAL_MODULES="math")
    job_id = h.submit()
    # when the job's first step runs
    effects = h.stepper.run(job_id, 0, "start")
    # then that one task made both model calls and ended the job: nothing was sent
    assert effects == [JobEnded(job_id, "completed")]
    assert len(h.router.requests) == 2
    job = h.job(job_id)
    assert (job.status, job.iteration, job.response["content"]) == ("completed", 2, "42")
    # and the call is recorded as a tool task records it
    (call,) = h.rows(ToolCall, job_id)
    assert (call.name, call.status, call.queue, call.attempts) == (
        "math.evaluate", "succeeded", LOCAL_QUEUE, 1)
    assert call.result == {"ok": True, "result": {"expression": "6*7", "result": 42},
                           "error": None, "attempts": 1}
    (start,) = _events(h, job_id, "tool_execution_start")
    (end,) = _events(h, job_id, "tool_execution_end")
    assert (start["tool_use_id"], start["local"], start["queue"]) == (
        call.tool_use_id, True, LOCAL_QUEUE)
    assert (end["tool_use_id"], end["ok"]) == (call.tool_use_id, True)
    roles = [m.role for m in h.rows(Message, job_id, Message.seq)]
    assert roles == ["user", "assistant", "tool_call", "tool_result", "assistant"]
    # the second model call read the result
    tool_messages = [m for m in h.router.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [call.tool_use_id]
    assert [e["turn"] for e in _events(h, job_id, "turn_start")] == [1, 2]


def test_a_chord_turn_is_unchanged_without_the_setting(tmp_path):
    h = _harness(tmp_path, discover(), calls(("math.evaluate", {"expression": "1+1"})),
                 text("2"))
    job_id = h.submit()
    (dispatch,) = h.stepper.run(job_id, 0, "start")
    assert isinstance(dispatch, DispatchTools)
    assert [queue for _id, queue, _limit in dispatch.calls] == ["tools.math"]
    assert len(h.router.requests) == 1
    assert "local" not in _events(h, job_id, "tool_execution_start")[0]
    execute_tool_call(dispatch.calls[0][0], h.settings, h.registry, h.sessions)
    assert h.stepper.run(job_id, 1, "callback") == [JobEnded(job_id, "completed")]


def test_a_mixed_turn_runs_its_local_calls_first_then_sends_the_rest_by_chord(tmp_path):
    # given math local and time not, and a turn calling both (time first)
    h = _harness(tmp_path, discover(),
                 calls(("time.now", {}), ("math.evaluate", {"expression": "2**10"})),
                 text("done"), AGENTQ_LOCAL_MODULES="math")
    job_id = h.submit()
    # when its first step runs
    effects = h.stepper.run(job_id, 0, "start")
    # then only time's call was sent, to its queue; math's has its result already
    (dispatch,) = effects
    assert isinstance(dispatch, DispatchTools) and dispatch.iteration == 1
    by_name = {c.name: c for c in h.rows(ToolCall, job_id)}
    assert [(i, q) for i, q, _limit in dispatch.calls] == [
        (by_name["time.now"].tool_use_id, "tools.time")]
    assert by_name["math.evaluate"].status == "succeeded"
    assert by_name["math.evaluate"].result["result"]["result"] == 1024
    assert by_name["time.now"].status == "pending"
    assert len(h.router.requests) == 1  # the turn is not over
    # when the chord's call runs and its callback follows
    execute_tool_call(dispatch.calls[0][0], h.settings, h.registry, h.sessions)
    assert h.stepper.run(job_id, 1, "callback") == [JobEnded(job_id, "completed")]
    # then the results went to the model in call order, both ok
    results = [m for m in h.router.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [by_name["time.now"].tool_use_id,
                                                   by_name["math.evaluate"].tool_use_id]
    turn_end = _events(h, job_id, "turn_end")[0]  # the tool turn's (turn 1)
    assert [r["ok"] for r in turn_end["tool_results"]] == [True, True]


def test_a_local_call_past_its_limit_is_a_tool_error_and_the_job_goes_on(tmp_path):
    # given a local tool that does not return until released, and a limit of 0.2 s
    release = threading.Event()
    ran = []

    def stuck(args, ctx):
        ran.append(ctx.tool_use_id)
        release.wait(60)
        return {"late": True}
    h = _harness(tmp_path, [_module("stuck", stuck)],
                 calls(("stuck.run", {"n": 1})), text("it timed out"),
                 AGENTQ_LOCAL_MODULES="stuck", AGENTQ_LOCAL_TOOL_TIME_LIMIT_S="0.2",
                 AGENTQ_DEFAULT_MODULES="stuck")
    job_id = h.submit()
    try:
        # when the step runs
        effects = h.stepper.run(job_id, 0, "start")
    finally:
        release.set()
    # then the call was answered `tool_timeout` after one attempt (not tried again) and
    # the model read that; the job completed in the same task
    assert effects == [JobEnded(job_id, "completed")]
    (call,) = h.rows(ToolCall, job_id)
    assert call.status == "failed" and len(ran) == 1
    assert call.result["error"]["code"] == "tool_timeout"
    assert call.result["attempts"] == 1
    (end,) = _events(h, job_id, "tool_execution_end")
    assert (end["ok"], end["error"]) == (False, "tool_timeout")
    assert h.job(job_id).response["content"] == "it timed out"


def test_a_local_call_held_for_approval_waits_and_once_approved_runs_on_the_orchestrator(
        tmp_path):
    # given math local and a persona that holds math.evaluate for a person
    h = _harness(tmp_path, discover(), calls(("math.evaluate", {"expression": "3*3"})),
                 text("9"), AGENTQ_LOCAL_MODULES="math")
    persona = h.add_persona(requires_approval=["math.evaluate"])
    job_id = h.submit(persona_id=persona)
    # when the first step runs, the call waits: the job pauses, nothing ran
    assert h.stepper.run(job_id, 0, "start") == []
    (call,) = h.rows(ToolCall, job_id)
    assert call.status == "awaiting"
    assert (h.job(job_id).status, h.job(job_id).waiting_for) == ("waiting", "approval")
    # when a person approves it
    with UnitOfWork(h.sessions) as unit:
        approvals.approve(unit, h.job(job_id).id, call.tool_use_id, None, h.registry)
    # then it is sent to the orchestrator's queue, never a module queue, and the job
    # completes once it has run
    (dispatch,) = [e for e in unit.sent if isinstance(e, DispatchTools)]
    assert [q for _i, q, _limit in dispatch.calls] == [ORCHESTRATOR_QUEUE]
    h.runner.run_until_idle()
    assert h.runner.ended[job_id] == "completed"
    assert h.job(job_id).response["content"] == "9"


def test_a_mixed_turn_with_a_held_call_ends_when_the_approved_call_is_in(tmp_path):
    # given math local and time.now held for a person
    h = _harness(tmp_path, discover(),
                 calls(("math.evaluate", {"expression": "1+2"}), ("time.now", {})),
                 text("3"), AGENTQ_LOCAL_MODULES="math")
    persona = h.add_persona(requires_approval=["time.now"])
    job_id = h.submit(persona_id=persona)
    # when the first step runs: math ran there, time waits; the turn is not over
    assert h.stepper.run(job_id, 0, "start") == []
    by_name = {c.name: c for c in h.rows(ToolCall, job_id)}
    assert by_name["math.evaluate"].status == "succeeded"
    assert by_name["time.now"].status == "awaiting"
    assert len(h.router.requests) == 1
    # when time's call is approved and runs, its callback collects the turn
    with UnitOfWork(h.sessions) as unit:
        approvals.approve(unit, h.job(job_id).id, by_name["time.now"].tool_use_id, None,
                          h.registry)
    h.runner.run_until_idle()
    assert h.runner.ended[job_id] == "completed"
    turn_end = _events(h, job_id, "turn_end")[0]  # the tool turn's (turn 1)
    assert [r["ok"] for r in turn_end["tool_results"]] == [True, True]


def test_a_re_driven_turn_runs_again_only_the_local_calls_without_a_committed_result(
        tmp_path, monkeypatch):
    # given a local tool that counts its runs, a turn of two calls of it, and a step that
    # dies (its process lost) after the first call's result was committed
    runs: list[int] = []

    def count(args, ctx):
        runs.append(args["n"])
        return {"n": args["n"]}
    h = _harness(tmp_path, [_module("counter", count)],
                 calls(("counter.run", {"n": 1}), ("counter.run", {"n": 2})), text("ok"),
                 AGENTQ_LOCAL_MODULES="counter", AGENTQ_DEFAULT_MODULES="counter",
                 AGENTQ_STEP_DEADLINE_S="1")
    job_id = h.submit()
    from agentq.loop import tool_turn
    real = tool_turn.execute_tool_call

    class ProcessLost(BaseException):
        pass

    def dies_on_the_second(tool_use_id, *args, **kwargs):
        if len(runs) == 1:
            raise ProcessLost()
        return real(tool_use_id, *args, **kwargs)
    monkeypatch.setattr(tool_turn, "execute_tool_call", dies_on_the_second)
    with pytest.raises(ProcessLost):
        h.stepper.run(job_id, 0, "start")
    monkeypatch.setattr(tool_turn, "execute_tool_call", real)
    first, second = h.rows(ToolCall, job_id, ToolCall.position)
    assert (first.status, second.status) == ("succeeded", "pending") and runs == [1]
    # when the sweeper re-drives the job
    _stalled(h, job_id)
    (redrive,) = h.sweep()
    assert redrive == NextStep(job_id, 1, "sweeper")
    again = h.stepper.run(redrive.job_id, redrive.iteration, redrive.cause)
    # then only the call without a result goes again, on the orchestrator's queue
    (dispatch,) = again
    assert [(i, q) for i, q, _limit in dispatch.calls] == [(second.tool_use_id,
                                                            ORCHESTRATOR_QUEUE)]
    h.runner.run_until_idle()
    assert h.runner.ended[job_id] == "completed"
    assert runs == [1, 2]  # each call ran once: the committed one was not run again


def test_a_committed_local_result_is_not_run_again_when_the_next_step_is_re_driven(tmp_path):
    # given a local call whose result was committed, then the task died before the next
    # model call (the model was away)
    runs: list[int] = []

    def count(args, ctx):
        runs.append(args["n"])
        return {"n": args["n"]}

    class ProcessLost(BaseException):
        pass
    h = _harness(tmp_path, [_module("counter", count)],
                 calls(("counter.run", {"n": 7})), ProcessLost(), text("seven"),
                 AGENTQ_LOCAL_MODULES="counter", AGENTQ_DEFAULT_MODULES="counter",
                 AGENTQ_STEP_DEADLINE_S="1")
    job_id = h.submit()
    with pytest.raises(ProcessLost):
        h.stepper.run(job_id, 0, "start")
    (call,) = h.rows(ToolCall, job_id)
    assert call.status == "succeeded" and runs == [7]
    # when the sweeper re-drives it
    _stalled(h, job_id)
    (redrive,) = h.sweep()
    assert h.stepper.run(redrive.job_id, redrive.iteration, redrive.cause) == [
        JobEnded(job_id, "completed")]
    # then the tool did not run again, and the model read its one result
    assert runs == [7]
    assert h.job(job_id).response["content"] == "seven"


GEVENT_PROBE = '''
from gevent import monkey
monkey.patch_all()
import json, sys, gevent
from agentq.config import Settings
from agentq.tools.manifest import ToolContext, define_module
from agentq.tools.registry import ToolRegistry

stop = []
def spin(args, ctx):  # computes without yielding until told to stop
    while not stop:
        pass
    return 1

module = define_module({"module": "spin", "description": "d", "local": True, "tools": [
    {"name": "spin.run", "description": "d", "function": spin,
     "parameters": {"type": "object"}}]})
registry = ToolRegistry(Settings.from_env({"AGENTQ_HOME": sys.argv[1],
                                           "AGENTQ_LOCAL_MODULES": "spin",
                                           "AGENTQ_LOCAL_TOOL_TIME_LIMIT_S": "0.3"}),
                        [module])
ticks = []
def tick():
    while not stop:
        ticks.append(1)
        gevent.sleep(0.01)
ticker = gevent.spawn(tick)
ctx = ToolContext(tool_use_id="t", job_id="j", user_id="u", conversation_id="c",
                  permission_level="user")
result = registry.execute("spin.run", {}, ctx, ["spin"])
stop.append(1)
print(json.dumps({"error": result.error, "attempts": result.attempts,
                  "ticked": len(ticks) > 0}))
'''


def test_under_gevent_a_computing_local_tool_times_out_and_holds_no_greenlet(tmp_path):
    # given a process on gevent's patched standard library (an orchestrator on
    # AGENTQ_ORCHESTRATOR_POOL=gevent) and a local tool that computes without yielding
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", GEVENT_PROBE, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    # then its call timed out (a greenlet thread would have held the hub: no timeout
    # fires, the process hangs) while the other greenlets ran
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["error"]["code"] == "tool_timeout" and out["attempts"] == 1
    assert out["ticked"]


def test_a_call_sent_again_goes_where_its_module_runs_now(tmp_path):
    # given a turn planned by chord (math on tools.math), whose task was lost
    h = _harness(tmp_path, discover(), calls(("math.evaluate", {"expression": "5*5"})),
                 AGENTQ_STEP_DEADLINE_S="1")
    job_id = h.submit()
    (dispatch,) = h.stepper.run(job_id, 0, "start")
    assert [q for _i, q, _limit in dispatch.calls] == ["tools.math"]
    # when the deployment has made math local since, and the sweeper re-drives the turn
    local = _harness(tmp_path, discover(), text("25"), AGENTQ_LOCAL_MODULES="math",
                     AGENTQ_STEP_DEADLINE_S="1")
    _stalled(local, job_id)
    (redrive,) = local.sweep()
    (again,) = local.stepper.run(redrive.job_id, redrive.iteration, redrive.cause)
    # then the call goes to the orchestrator's queue, which its workers consume (no tools
    # worker consumes tools.math any more), and the job completes
    assert [q for _i, q, _limit in again.calls] == [ORCHESTRATOR_QUEUE]
    local.runner.run_until_idle()
    assert local.runner.ended[job_id] == "completed"
    h.router.assert_done()
