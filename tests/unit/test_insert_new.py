"""`db.insert_new` and `db.write_changes`: a new object's row written with one Core INSERT,
and a loaded object's changes with one Core UPDATE, must be what the ORM's flush would have
written (SQLite)."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from sqlalchemy import event, inspect, select

from agentq.db import dispose_engines, insert_new, session_scope, write_changes
from agentq.loop.identity import Incoming, resolve
from agentq.loop.lifecycle import new_job
from agentq.models import Job, UserPlatformLink
from agentq.tenants import DEFAULT_TENANT_ID as T
from tests.support import unit_db

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def place(tmp_path):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path)})
    with session_scope(settings) as session:
        user, _, conversation = resolve(session, T, Incoming("cli", "u1", "c1"), settings)
        ids = user.id, conversation.id
    yield settings, ids
    dispose_engines()


def _job(user_id, conversation_id):
    # the columns new_job leaves to their defaults (claimed_attempts, pending_inputs,
    # provider_attempts, …) and one whose column is named otherwise (meta → "metadata")
    return new_job(tenant_id=T, conversation_id=conversation_id, user_id=user_id,
                   content="hello", now=T0, meta={"source": "test"},
                   limits={"max_iterations": 3})


def _row(session, job_id) -> dict:
    job = session.get(Job, job_id)
    return {attr.key: getattr(job, attr.key) for attr in inspect(Job).column_attrs
            if attr.key != "id"}


def test_a_row_written_by_insert_new_is_the_row_a_flush_writes(place):
    settings, (user_id, conversation_id) = place
    # given the same job made twice
    flushed, inserted = _job(user_id, conversation_id), _job(user_id, conversation_id)
    # when one is flushed by the ORM and the other written by insert_new
    with session_scope(settings) as session:
        session.add(flushed)
        session.flush()
        assert insert_new(session, inserted) is True
        # then the written object is in the session, as if loaded: nothing left to read
        assert inspect(inserted).persistent
        assert not inspect(inserted).expired_attributes
        assert inserted.meta == {"source": "test"} and inserted.pending_inputs == 0
    # and the two stored rows are the same, column by column
    with session_scope(settings) as session:
        assert _row(session, inserted.id) == _row(session, flushed.id)
        assert _row(session, inserted.id)["meta"] == {"source": "test"}
        # stored alike, not only read back alike: a JSON column left unset is SQL NULL in
        # both, not JSON's null in one (both read back as None)
        assert _nulls(session, inserted.id) == _nulls(session, flushed.id)


def _nulls(session, job_id) -> dict:
    table = Job.__table__
    row = session.execute(select(*[c.is_(None).label(c.key) for c in table.c if c.key != "id"])
                          .where(table.c.id == job_id)).one()
    return row._asdict()


def test_insert_new_on_a_taken_unique_key_writes_nothing_and_keeps_the_transaction(place):
    settings, (user_id, _) = place
    link = dict(tenant_id=T, user_id=user_id, platform="cli", platform_user_id="u1",
                platform_username="u1", created_at=T0)
    # when a second link for the same platform user is written
    with session_scope(settings) as session:
        second = UserPlatformLink(id=uuid.uuid4(), **link)
        written = insert_new(session, second, ("tenant_id", "platform", "platform_user_id"))
        # then it is not, and the transaction goes on
        assert written is False
        assert not inspect(second).persistent
        rows = session.execute(select(UserPlatformLink.id)).scalars().all()
    assert rows and second.id not in rows


def _change(job) -> None:
    """What a step does to its job: plain columns, one named otherwise (meta → metadata),
    a JSON column set (response) and one set back to None (the error)."""
    job.status, job.phase, job.event_seq = "completed", "tools", job.event_seq + 3
    job.meta = {"source": "test", "changed": True}
    job.response = {"content": "4", "tool_calls": []}
    job.error = None


def test_changes_written_by_write_changes_are_the_changes_a_flush_writes(place):
    settings, (user_id, conversation_id) = place
    with session_scope(settings) as session:
        flushed, written = _job(user_id, conversation_id), _job(user_id, conversation_id)
        session.add_all([flushed, written])
    # when the same changes are flushed by the ORM to one job, written by write_changes to
    # the other
    statements: list[str] = []

    def seen(_conn, _cursor, statement, *_rest) -> None:
        statements.append(statement)

    with session_scope(settings) as session:
        a, b = session.get(Job, flushed.id), session.get(Job, written.id)
        _change(a)
        session.flush()
        _change(b)
        event.listen(session.bind, "before_cursor_execute", seen)
        try:
            assert write_changes(session, b) is True
            # then nothing is left for the commit's flush to write
            assert b not in session.dirty and not inspect(b).modified
            session.flush()
        finally:
            event.remove(session.bind, "before_cursor_execute", seen)
    assert [s.split()[0] for s in statements] == ["UPDATE"], statements
    # and the two stored rows are the same, column by column, NULLs alike
    with session_scope(settings) as session:
        assert _row(session, written.id) == _row(session, flushed.id)
        assert _row(session, written.id)["meta"] == {"source": "test", "changed": True}
        assert _nulls(session, written.id) == _nulls(session, flushed.id)
