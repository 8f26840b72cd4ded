"""Exact recall on SQLite: the user's memories ranked by cosine similarity, top k, only the
embedding model asked for, only this user's; recalled ones are marked."""
from __future__ import annotations

import uuid

import pytest

from agentq import memory
from agentq.db import dispose_engines, session_factory, session_scope, utcnow
from agentq.models import Memory, Tenant, User
from agentq.tenants import DEFAULT_TENANT_ID
from tests.support import unit_db


@pytest.fixture
def settings(tmp_path):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path)})
    yield settings
    dispose_engines()


def _user(session) -> uuid.UUID:
    if session.get(Tenant, DEFAULT_TENANT_ID) is None:
        session.add(Tenant(id=DEFAULT_TENANT_ID, name="default"))
    user = User(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID, permission_level="guest",
                tokens_used_this_month=0, budget_reset_at=utcnow())
    session.add(user)
    session.flush()
    return user.id


def test_recall_ranks_by_cosine_and_keeps_to_the_user_and_model(settings):
    with session_scope(settings) as session:
        me, other = _user(session), _user(session)
        vectors = {"north": [1.0, 0.0, 0.0], "north-east": [0.7, 0.7, 0.0],
                   "east": [0.0, 1.0, 0.0], "south": [-1.0, 0.0, 0.0],
                   "up": [0.0, 0.0, 1.0], "near-north": [0.9, 0.1, 0.0]}
        for content, vector in vectors.items():
            memory.remember(session, tenant_id=DEFAULT_TENANT_ID, user_id=me, content=content,
                            embedding=vector, model="m", source="tool")
        memory.remember(session, tenant_id=DEFAULT_TENANT_ID, user_id=other,
                        content="theirs", embedding=[1.0, 0.0, 0.0], model="m", source="tool")
        memory.remember(session, tenant_id=DEFAULT_TENANT_ID, user_id=me,
                        content="other model", embedding=[1.0, 0.0, 0.0], model="x",
                        source="tool")
    with session_scope(settings) as session:
        found = memory.recall(session, me, [1.0, 0.05, 0.0], "m")
        assert [m.content for m, _ in found] == ["north", "near-north", "north-east", "east",
                                                 "up"]
        assert memory.has_memories(session, me) and not memory.has_memories(session, uuid.uuid4())
    with session_factory(settings)() as session:
        marked = {m.content for m in session.query(Memory).filter(
            Memory.last_recalled_at.isnot(None))}
    assert marked == {"north", "near-north", "north-east", "east", "up"}


def test_the_search_backend_is_the_one_the_database_has(settings):
    # SQLite searches in this process; Postgres without pgvector (the unit suite's) in SQL
    expected = (memory.IN_PROCESS, None) if settings.is_sqlite else ("exact_sql", None)
    with session_factory(settings)() as session:
        assert memory.search_backend(session) == expected


def test_memory_remember_writes_once_per_tool_call(settings, monkeypatch):
    """A remember call delivered twice (its worker lost, the call sent again) stores one
    memory: its id is made from the call's tool_use_id."""
    import tool_workers.memory as tools
    from agentq.loop.identity import Incoming
    from agentq.loop.submit import Submission, create_job
    from agentq.loop.uow import UnitOfWork
    from agentq.tools.manifest import ToolContext

    class Router:
        def embed(self, text, model=None):
            return [1.0, 0.0]
    monkeypatch.setattr(memory, "router_for", lambda _settings: Router())
    with UnitOfWork(session_factory(settings)) as uow:
        job = create_job(uow, settings, Submission(Incoming("t", "u", "c", None), "hi"))
        uow.session.flush()
        ids = (str(job.id), str(job.user_id), str(job.conversation_id))
    ctx = ToolContext(tool_use_id="tool_abc", job_id=ids[0], user_id=ids[1],
                      conversation_id=ids[2], permission_level="guest",
                      session_factory=session_factory(settings),
                      extra={"settings": settings})
    first = tools.remember({"content": "likes teal"}, ctx)
    again = tools.remember({"content": "likes teal"}, ctx)
    assert first == again
    with session_factory(settings)() as session:
        assert session.query(Memory).count() == 1
    other = tools.remember({"content": "likes teal"},
                           ToolContext(**{**ctx.__dict__, "tool_use_id": "tool_def"}))
    assert other["memory_id"] != first["memory_id"]
