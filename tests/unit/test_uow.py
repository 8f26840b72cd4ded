"""The unit of work (agentq.loop.uow) keeps commit → announce → dispatch, and the two effect
dispatchers (the in-process runner, Celery's) each handle every effect type."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import typing
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from agentq.db import session_factory, utcnow
from agentq.loop import store
from agentq.loop import uow as units
from agentq.loop.effects import (
    Effect,
    NextStep,
    RevokeTools,
)
from agentq.loop.identity import Incoming
from agentq.loop.submit import Submission, create_job
from agentq.loop.uow import NoDispatcher, UnitOfWork
from agentq.models import Job, JobEvent
from agentq.runner import InProcessRunner
from tests.support import unit_db
from tests.support.effects import one_of_each

ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_LIMIT_S = 120
"""A failure bound for the dispatcher's own process, never a measured margin."""


@pytest.fixture
def settings(tmp_path):
    return unit_db.settings({"AGENTQ_HOME": str(tmp_path)})


@pytest.fixture
def heard(monkeypatch):
    """What the event observers were told, and when (rows visible then or not)."""
    told: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(store, "_event_hooks", [
        lambda job_id, events: told.append((job_id, [e["type"] for e in events]))])
    return told


def _job(settings) -> Job:
    with UnitOfWork(session_factory(settings)) as uow:
        return create_job(uow, settings, Submission(Incoming("t", "u", "c"), "hi"))


def _events(settings, job_id) -> list[str]:
    with session_factory(settings)() as session:
        return list(session.execute(select(JobEvent.type).where(JobEvent.job_id == job_id)
                                    .order_by(JobEvent.seq)).scalars())


def test_events_and_effects_go_out_only_after_the_commit(settings, heard, effects):
    job = _job(settings)
    sessions = session_factory(settings)
    seen_at_dispatch: list[list[str]] = []

    def dispatcher(sent):  # what a worker would find when the message arrives
        seen_at_dispatch.append(_events(settings, job.id))
        effects(sent)

    units.set_dispatcher(dispatcher)
    with UnitOfWork(sessions) as uow:
        uow.event(job.id, "job_start")
        uow.event(job.id, "turn_start", turn=1)
        uow.effect(NextStep(str(job.id), 0, "continue"))
        assert heard == [] and effects.sent[-1:] != [NextStep(str(job.id), 0, "continue")]
    assert _events(settings, job.id) == ["job_start", "turn_start"]
    assert heard == [(str(job.id), ["job_start", "turn_start"])]
    assert seen_at_dispatch == [["job_start", "turn_start"]]  # committed before it was sent
    assert uow.sent == [NextStep(str(job.id), 0, "continue")]


def test_a_unit_that_raises_writes_announces_and_sends_nothing(settings, heard, effects):
    job = _job(settings)
    before = len(effects.sent)
    with pytest.raises(RuntimeError), UnitOfWork(session_factory(settings)) as uow:
        uow.session.get(Job, job.id).content = "changed"
        uow.event(job.id, "job_start")
        uow.effect(NextStep(str(job.id), 0, "continue"))
        raise RuntimeError("a bug half-way")
    assert _events(settings, job.id) == [] and heard == []
    assert effects.sent[before:] == [] and uow.sent == []
    with session_factory(settings)() as session:
        assert session.get(Job, job.id).content == "hi"


def test_a_failing_dispatcher_is_logged_and_the_rows_stay_committed(settings, caplog):
    job = _job(settings)

    def broker_away(_effects):
        raise ConnectionError("broker down")

    units.set_dispatcher(broker_away)
    with caplog.at_level(logging.ERROR), UnitOfWork(session_factory(settings)) as uow:
        uow.event(job.id, "cancel_requested")
        uow.effect(NextStep(str(job.id), 0, "continue"))
    assert _events(settings, job.id) == ["cancel_requested"]  # the sweeper re-drives it
    assert "effects not sent after commit" in caplog.text


def test_effects_committed_with_no_dispatcher_are_a_loud_wiring_bug(settings):
    job = _job(settings)
    units.set_dispatcher(None)
    with pytest.raises(NoDispatcher):
        with UnitOfWork(session_factory(settings)) as uow:
            uow.effect(NextStep(str(job.id), 0, "continue"))
    with UnitOfWork(session_factory(settings)):  # nothing to send: no dispatcher needed
        pass


# --- every effect type, every dispatcher ---------------------------------------------------

def test_the_examples_name_every_effect_type():
    assert {type(e) for e in one_of_each("j")} == set(typing.get_args(Effect))


class _Stepper:
    """A stepper double that records the steps it is asked to run (sessions: none are
    opened for these effects' ids, which match no rows)."""

    def __init__(self, settings):
        self.settings = settings
        self.steps: list[tuple] = []
        self.registry = None
        self.sessions = session_factory(settings)

    def run(self, job_id, iteration, cause):
        self.steps.append((job_id, iteration, cause))
        return []


def test_the_in_process_runner_handles_every_effect_type(settings, monkeypatch):
    from agentq.loop import execute
    ran: list[str] = []
    monkeypatch.setattr(execute, "execute_tool_call",
                        lambda tool_use_id, *_: ran.append(tool_use_id) or {})
    stepper = _Stepper(settings)
    # chord: the runner runs the callback step (with tool_join=database the call that
    # stores a turn's last result sends it: agentq.loop.execute)
    runner = InProcessRunner(stepper, settings.replace(tool_join="chord"))
    job_id = str(uuid.uuid4())
    runner(one_of_each(job_id))
    runner(one_of_each(job_id)[:2])  # after the revoke: a revoked call is not run
    runner([RevokeTools(("tool_unit_b",)), one_of_each(job_id)[1]])
    runner([NextStep(job_id, 3, "provider", not_before=utcnow())])
    runner.run_until_idle()
    assert stepper.steps == [(job_id, 0, "continue"), (job_id, 1, "callback"),
                             (job_id, 0, "continue"), (job_id, 1, "callback"),
                             (job_id, 1, "callback")]
    assert ran == ["tool_unit_a", "tool_unit_b", "tool_unit_a", "tool_unit_b",
                   "tool_unit_a"]
    assert runner.ended == {job_id: "completed"}
    assert len(runner.webhooks) == 1 and runner.revoked == {"tool_unit_c", "tool_unit_b"}
    assert list(runner.batches_ended.values()) == ["completed"]
    assert [s.iteration for s in runner.delayed] == [3]  # waits for `run_delayed`
    runner.run_delayed()
    assert stepper.steps[-1] == (job_id, 3, "provider")


CELERY_DISPATCH = """
import json, sys, uuid
from kombu import Connection
import agentq.db
from api import create_app

TASK_MODULES = ("tasks.orchestrator", "tasks.tools", "tasks.webhooks", "tasks.maintenance")
create_app()  # the API process: its dispatcher registered, no task module loaded


def no_sessions(*_a, **_k):
    raise AssertionError("the dispatcher opened a session")
agentq.db.session_factory = no_sessions
from tasks import dispatch, embedded_transport
from tasks.app import app
assert app.conf.broker_url.startswith(embedded_transport.register()), app.conf.broker_url
from tests.support.effects import one_call, one_of_each
effects = one_call if sys.argv[1:] == ["one-call"] else one_of_each


def callback(signature):
    options = signature["options"]
    return {"task": signature["task"], "queue": options.get("queue"),
            "ignore_result": options.get("ignore_result"),
            "immutable": signature.get("immutable"),
            "link_error": [callback(s) for s in options.get("link_error") or ()]}


queues = {"orchestrator": [], "unit-tools": [], "webhooks": []}
with Connection(embedded_transport.register()) as connection:
    for name in queues:  # the queues exist before the messages
        connection.SimpleQueue(name).close()
    dispatch.dispatch(effects(str(uuid.uuid4())))
    for name, got in queues.items():
        queue = connection.SimpleQueue(name)
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                break
            embed = message.payload[2]
            chord = embed.get("chord")
            got.append({"task": message.headers["task"], "id": message.headers.get("id"),
                        "ignore_result": message.headers.get("ignore_result"),
                        "time_limit_s": message.headers.get("timelimit")[0],
                        "chord": callback(chord) if chord else None,
                        **({"link": [callback(s) for s in embed["callbacks"]],
                            "link_error": [callback(s) for s in embed.get("errbacks") or ()]}
                           if embed.get("callbacks") else {})})
            message.ack()
        queue.close()
print(json.dumps({"loaded": [m for m in TASK_MODULES if m in sys.modules],
                  "queues": queues}))
"""


def _dispatched(tmp_path, tool_join: str, *args: str) -> dict:
    """What the Celery dispatcher of an API process sends for one effect of each type, read
    off the embedded (in-memory) broker. In a process of its own: this one's Celery app may
    have been made on another test's real broker, and this one has loaded task modules."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTQ_")}
    env.update(AGENTQ_HOME=str(tmp_path), AGENTQ_BROKER_URL="memory://",
               AGENTQ_TOOL_JOIN=tool_join, PYTHONPATH=str(ROOT))
    if tool_join == "chord":  # a backend that counts a chord's parts, as Redis does
        env["AGENTQ_RESULT_BACKEND_URL"] = "cache+memory://"
    done = subprocess.run([sys.executable, "-c", CELERY_DISPATCH, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=SUBPROCESS_LIMIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sent(task: str, task_id=None, ignore_result=True, time_limit_s=None, chord=None) -> dict:
    return {"task": task, "id": task_id, "ignore_result": ignore_result,
            "time_limit_s": time_limit_s, "chord": chord}


TOOL_TIME_LIMIT_S = 2 * 5 + 30
"""one_of_each's calls: a limit of 5 s, the hard limit twice that and a margin."""


def test_the_celery_dispatcher_sends_every_effect_type_as_messages(tmp_path):
    """Each effect becomes the messages a worker consumes, on the queue it listens to, sent
    by task name: none opens a database session, none loads a task module, and each says
    that nothing reads its result."""
    sent = _dispatched(tmp_path, "database")
    assert sent["loaded"] == []
    queues = sent["queues"]
    assert [{**m, "id": None} for m in queues["orchestrator"]] == [
        _sent("orchestrator.step"), _sent("orchestrator.advance_batch")]
    assert queues["unit-tools"] == [
        _sent("tools.execute", "tool_unit_a", time_limit_s=TOOL_TIME_LIMIT_S),
        _sent("tools.execute", "tool_unit_b", time_limit_s=TOOL_TIME_LIMIT_S)]
    assert [{**m, "id": None} for m in queues["webhooks"]] == [_sent("webhooks.deliver")]


def test_a_chord_s_tool_calls_keep_their_results_for_its_callback(tmp_path):
    """With tool calls joined by a chord, each call's result is stored (the chord reads
    them); the callback and its error callback, the next step, store none."""
    sent = _dispatched(tmp_path, "chord")
    assert sent["loaded"] == []
    after_tools = {"task": "orchestrator.after_tools", "queue": "orchestrator",
                   "ignore_result": True, "immutable": False,
                   "link_error": [{"task": "orchestrator.tools_failed",
                                   "queue": "orchestrator", "ignore_result": True,
                                   "immutable": True, "link_error": []}]}
    assert sent["queues"]["unit-tools"] == [
        _sent("tools.execute", tool_use_id, ignore_result=False,
              time_limit_s=TOOL_TIME_LIMIT_S, chord=after_tools)
        for tool_use_id in ("tool_unit_a", "tool_unit_b")]


def test_a_turn_of_one_call_links_the_next_step_to_it_without_a_chord(tmp_path):
    """A chord of one joins nothing: the call goes out with the next step linked (the
    worker hands it the call's return value) and the same error callback a chord has; no
    result is stored, so none is counted in the backend."""
    sent = _dispatched(tmp_path, "chord", "one-call")
    assert sent["loaded"] == []
    failed = {"task": "orchestrator.tools_failed", "queue": "orchestrator",
              "ignore_result": True, "immutable": True, "link_error": []}
    after_tools = {"task": "orchestrator.after_tools", "queue": "orchestrator",
                   "ignore_result": True, "immutable": False, "link_error": []}
    assert sent["queues"]["unit-tools"] == [
        {**_sent("tools.execute", "tool_unit_a", ignore_result=True,
                 time_limit_s=TOOL_TIME_LIMIT_S),
         "link": [after_tools], "link_error": [failed]}]
    assert sent["queues"]["orchestrator"] == []


def test_a_step_s_units_of_work_announce_each_commit(settings, heard, effects):
    """The first transaction's events (the turn began) are heard before the model is
    called; the rest after the reply is stored."""
    from agentq.testing.harness import Harness, ScriptedModel, text
    from agentq.tools.registry import discover
    told_at_model_call: list = []

    def answer():
        told_at_model_call.extend(heard)
        return text("4")

    h = Harness(settings, discover(), ScriptedModel(answer))
    job_id = h.submit()
    h.drive(job_id)
    assert [kinds for _, kinds in told_at_model_call] == [
        ["job_start", "message_start", "message_end", "turn_start", "message_start"]]
    assert heard[-1] == (job_id, ["message_end", "turn_end", "job_end"])
    with session_factory(settings)() as session:
        assert session.execute(select(func.count()).select_from(JobEvent)).scalar_one() == 8
