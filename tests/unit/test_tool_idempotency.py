"""Tools are at-least-once, and say so: manifests declare `idempotent`, each call's context
carries its tool_use_id as the idempotency key, and files.create_document writes once per
key even when the same call runs twice."""
from __future__ import annotations

import dataclasses
import importlib
import threading
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select, update

from agentq.errors import ManifestError
from agentq.loop.effects import DispatchTools
from agentq.loop.execute import CallOutcome, execute_tool_call
from agentq.models import FileRecord, JobEvent, ToolCall
from agentq.testing.harness import calls, text
from agentq.tools.manifest import ToolContext, define_module


def _spec(**extra) -> dict:
    return {"module": "demo", "description": "d", "tools": [
        {"name": "demo.act", "description": "Acts.", "function": lambda a, c: None,
         "parameters": {"type": "object"}, **extra}]}


def test_a_manifest_declares_idempotent_and_it_defaults_to_false():
    assert define_module(_spec(idempotent=True)).tools[0].idempotent is True
    assert define_module(_spec()).tools[0].idempotent is False


def test_idempotent_must_be_a_boolean():
    with pytest.raises(ManifestError, match="idempotent must be true or false"):
        define_module(_spec(idempotent="yes"))


@pytest.mark.parametrize("module, tool, idempotent", [
    ("files", "files.create_document", True), ("files", "files.read_document", True),
    ("math", "math.evaluate", True), ("time", "time.now", True),
    ("code", "code.run_python", False)])
def test_the_shipped_tools_declare_it(module, tool, idempotent):
    tools = {t.name: t for t in importlib.import_module(f"tool_workers.{module}").MODULE.tools}
    assert tools[tool].idempotent is idempotent


def test_the_context_carries_the_tool_use_id_as_idempotency_key():
    ctx = ToolContext(tool_use_id="tool_abc", job_id="j", user_id="u", conversation_id="c",
                      permission_level="guest")
    assert ctx.idempotency_key == "tool_abc"


_LONG_AGO = datetime(2000, 1, 1, tzinfo=timezone.utc)


def _files(h, job_id: str) -> list[FileRecord]:
    with h.sessions() as session:
        return session.execute(select(FileRecord).where(
            FileRecord.job_id == uuid.UUID(job_id))).scalars().all()


def test_create_document_run_twice_for_one_call_writes_one_file(make):
    h = make(calls(("files.create_document", {"title": "Report", "content": "# Hi"})))
    job_id = h.submit("write it")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    assert isinstance(dispatch, DispatchTools)
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    tool = h.registry.tools["files.create_document"]
    job = h.job(job_id)
    ctx = ToolContext(tool_use_id=tool_use_id, job_id=job_id, user_id=str(job.user_id),
                      conversation_id=str(job.conversation_id), permission_level="guest",
                      session_factory=h.sessions, public_url=h.settings.public_url)
    # the same call, run twice directly: the same file, stored once
    first = tool.function({"title": "Report", "content": "# Hi"}, ctx)
    second = tool.function({"title": "Report", "content": "# Hi"}, ctx)
    assert first == second
    assert len(_files(h, job_id)) == 1
    # and through the task: a delivery that died after the tool ran (before the result was
    # stored) is delivered again, and runs the tool again
    execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    with h.sessions() as session, session.begin():
        session.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id).values(
            status="pending", result=None, finished_at=None, lease_until=_LONG_AGO))
    outcome = execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    assert outcome.status == "succeeded"
    [record] = _files(h, job_id)
    assert str(record.id) == first["file_id"]
    with h.sessions() as session:
        call = session.execute(select(ToolCall).where(
            ToolCall.tool_use_id == tool_use_id)).scalar_one()
        assert call.attempts == 2 and call.result["result"]["file_id"] == first["file_id"]
        [start] = session.execute(select(JobEvent).where(
            JobEvent.job_id == uuid.UUID(job_id),
            JobEvent.type == "tool_execution_start")).scalars().all()
    assert start.data["idempotent"] is True


def test_another_call_writes_another_file(make):
    h = make(calls(("files.create_document", {"title": "A", "content": "a"}),
                   ("files.create_document", {"title": "A", "content": "a"})),
             text("done"))
    job_id = h.submit("write two")
    h.drive(job_id)
    assert h.job(job_id).status == "completed"
    assert len({f.id for f in _files(h, job_id)}) == 2
    with h.sessions() as session:
        assert session.execute(select(func.count()).select_from(ToolCall)).scalar_one() == 2


def _started(h, tool_use_id: str, lease_until: datetime) -> None:
    """As if a delivery had begun running the call, its lease running out at `lease_until`,
    and had not answered."""
    with h.sessions() as session, session.begin():
        session.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id)
                        .values(attempts=1, started_at=_LONG_AGO, lease_until=lease_until))


def _call(h, tool_use_id: str) -> ToolCall:
    with h.sessions() as session:
        return session.execute(select(ToolCall).where(
            ToolCall.tool_use_id == tool_use_id)).scalar_one()


def test_a_copy_delivered_while_the_call_runs_waits_for_its_result_and_runs_nothing(make):
    """A re-driven copy of a call whose first delivery is still running (its lease is live)
    does not run the tool again: it waits, and answers `duplicate` once the first stores."""
    h = make(calls(("files.create_document", {"title": "A", "content": "a"})))
    job_id = h.submit("write it")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    _started(h, tool_use_id, datetime.now(timezone.utc) + timedelta(hours=1))
    answers: list[CallOutcome] = []
    copy = threading.Thread(target=lambda: answers.append(
        execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)))
    copy.start()
    copy.join(timeout=1.0)
    assert copy.is_alive() and not answers  # it waits while the first delivery may run
    first_result = {"ok": True, "result": {"stdout": "1\n"}, "error": None}
    with h.sessions() as session, session.begin():  # the first delivery stores its result
        session.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id)
                        .values(status="succeeded", result=first_result))
    copy.join(timeout=60)
    assert answers == [CallOutcome(tool_use_id, "duplicate")]
    call = _call(h, tool_use_id)
    assert call.attempts == 1 and call.result == first_result


def test_a_not_idempotent_call_whose_worker_died_is_not_run_again(make):
    """The delivery that started a side-effecting call died (its lease ran out without a
    result): the next one stores `tool_interrupted` for the model instead of acting twice."""
    h = make(calls(("files.create_document", {"title": "A", "content": "a"})))
    tool = h.registry.tools["files.create_document"]  # as a tool with side effects
    h.registry.tools[tool.name] = dataclasses.replace(tool, idempotent=False)
    job_id = h.submit("write it")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    _started(h, tool_use_id, _LONG_AGO)
    outcome = execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    assert outcome.status == "failed"
    call = _call(h, tool_use_id)
    assert call.attempts == 1 and call.status == "failed"  # no second execution began
    assert call.result["error"]["code"] == "tool_interrupted"
    assert "not run again" in call.result["error"]["message"]
    assert _files(h, job_id) == []  # the tool did not act


def test_a_tool_longer_than_the_deadline_is_neither_re_driven_nor_run_twice(make):
    """While a slow tool runs, its worker renews the call's lease and holds the sweeper off
    the job; once the tool answers, nothing is held."""
    from agentq.loop.execute import tool_leases
    from agentq.models import Job
    h = make(calls(("files.create_document", {"title": "Slow", "content": "x"})))
    job_id = h.submit("write it")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    keeper = tool_leases(h.settings, h.sessions)
    tool = h.registry.tools["files.create_document"]
    real = tool.function
    seen: dict = {}

    def slow(arguments, ctx):
        # a whole deadline passes while the tool runs (the job's progress and the call's
        # lease are behind us); the worker's keeper renews (driven here by hand)
        long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
        with h.sessions() as session, session.begin():
            session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
                last_progress_at=long_ago, redrive_after=long_ago))
            session.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id)
                            .values(lease_until=long_ago))
        seen["renewed"] = keeper.renew([tool_use_id])
        seen["swept"] = h.sweep()
        return real(arguments, ctx)

    h.registry.tools["files.create_document"] = dataclasses.replace(tool, function=slow)
    try:
        outcome = execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    finally:
        h.registry.tools["files.create_document"] = tool
    assert seen == {"renewed": 1, "swept": []}
    assert outcome.status == "succeeded"
    call = _call(h, tool_use_id)
    assert call.attempts == 1 and call.lease_until > datetime.now(timezone.utc)
    assert keeper.renew([tool_use_id]) == 0  # nothing held once the tool answered


def test_a_call_of_a_cancelled_job_is_answered_cancelled_and_not_run(make):
    """A call delivered after its job was asked to stop stores `cancelled` for the model
    and does not run the tool."""
    from agentq.db import utcnow
    from agentq.models import Job
    h = make(calls(("files.create_document", {"title": "A", "content": "a"})))
    job_id = h.submit("write it")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    with h.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == uuid.UUID(job_id))
                        .values(cancel_requested_at=utcnow()))
    outcome = execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    assert outcome == CallOutcome(tool_use_id, "cancelled")
    call = _call(h, tool_use_id)
    assert (call.status, call.attempts, call.result["error"]["code"]) == (
        "cancelled", 0, "cancelled")
    assert _files(h, job_id) == []
    with h.sessions() as session:
        [end] = session.execute(select(JobEvent).where(
            JobEvent.job_id == uuid.UUID(job_id),
            JobEvent.type == "tool_execution_end")).scalars().all()
    assert (end.data["tool_use_id"], end.data["ok"], end.data["error"]) == (
        tool_use_id, False, "cancelled")


def test_a_call_that_crashed_its_worker_every_time_is_answered_tool_crashed(make):
    """An idempotent call whose deliveries all died without a result is not run once more
    than MAX_DELIVERIES: the model reads `tool_crashed`."""
    from agentq.loop.execute import MAX_DELIVERIES
    h = make(calls(("files.create_document", {"title": "A", "content": "a"})))
    job_id = h.submit("write it")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    with h.sessions() as session, session.begin():
        session.execute(update(ToolCall).where(ToolCall.tool_use_id == tool_use_id).values(
            attempts=MAX_DELIVERIES, started_at=_LONG_AGO, lease_until=_LONG_AGO))
    outcome = execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    assert outcome == CallOutcome(tool_use_id, "failed")
    call = _call(h, tool_use_id)
    assert (call.status, call.attempts, call.result["error"]["code"]) == (
        "failed", MAX_DELIVERIES + 1, "tool_crashed")
    assert _files(h, job_id) == []


def test_an_unknown_call_is_answered_missing(make):
    h = make()
    assert execute_tool_call("tool_nobody_made", h.settings, h.registry,
                             h.sessions) == CallOutcome("tool_nobody_made", "missing")


def test_a_call_runs_with_its_caller_place_and_persona_modules(make):
    """The tool's context names the job's user (with their level), the conversation's place
    and the tenant; a rerun after a lost delivery counts its attempt."""
    from agentq.models import Conversation, Job, User
    h = make(calls(("files.create_document", {"title": "A", "content": "a"})))
    job_id = h.submit("write it")
    [dispatch] = h.stepper.run(job_id, 0, "start")
    [(tool_use_id, _queue, _limit)] = dispatch.calls
    tool = h.registry.tools["files.create_document"]
    seen: list[ToolContext] = []

    def spy(arguments, ctx):
        seen.append(ctx)
        return tool.function(arguments, ctx)

    h.registry.tools[tool.name] = dataclasses.replace(tool, function=spy)
    try:
        assert execute_tool_call(tool_use_id, h.settings, h.registry,
                                 h.sessions).status == "succeeded"
    finally:
        h.registry.tools[tool.name] = tool
    [ctx] = seen
    with h.sessions() as session:
        job = session.get(Job, uuid.UUID(job_id))
        user = session.get(User, job.user_id)
        place = session.get(Conversation, job.conversation_id)
        assert (ctx.tool_use_id, ctx.job_id, ctx.user_id, ctx.conversation_id,
                ctx.permission_level, ctx.platform, ctx.platform_channel_id,
                ctx.platform_thread_id, ctx.tenant_id) == (
            tool_use_id, job_id, str(user.id), str(place.id), user.permission_level,
            place.platform, place.platform_channel_id, place.platform_thread_id,
            str(job.tenant_id))
    assert ctx.session_factory is h.sessions
    call = _call(h, tool_use_id)
    assert call.attempts == 1 and call.started_at is not None
