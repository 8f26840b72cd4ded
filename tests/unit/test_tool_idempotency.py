"""Tools are at-least-once, and say so: manifests declare `idempotent`, each call's context
carries its tool_use_id as the idempotency key, and files.create_document writes once per
key even when the same call runs twice."""
from __future__ import annotations

import importlib
import uuid

import pytest
from sqlalchemy import func, select, update

from agentq.errors import ManifestError
from agentq.loop.effects import DispatchTools
from agentq.loop.execute import execute_tool_call
from agentq.models import FileRecord, JobEvent, ToolCall
from agentq.tools.manifest import ToolContext, define_module
from tests.unit.test_step import _engines, calls, make, modules, text  # noqa: F401


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


def _files(h, job_id: str) -> list[FileRecord]:
    with h.sessions() as session:
        return session.execute(select(FileRecord).where(
            FileRecord.job_id == uuid.UUID(job_id))).scalars().all()


def test_create_document_run_twice_for_one_call_writes_one_file(make):
    h = make(calls(("files.create_document", {"title": "Report", "content": "# Hi"})),
             text("done"))
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
            status="pending", result=None, finished_at=None))
    outcome = execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    assert outcome["status"] == "succeeded"
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
