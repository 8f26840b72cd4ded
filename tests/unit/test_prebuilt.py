"""Prebuilt statements (`agentq.prebuilt`): run on the session's cursor on Postgres, they
answer what `session.execute` of the same statement answers, raise what it raises, and keep
its transaction and its events; on SQLite they are `session.execute`."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import bindparam, exc, insert, select, text, update

from agentq.db import DATABASE_UNREACHABLE
from agentq.models import Job, JobEvent
from agentq.prebuilt import Prebuilt, literal_in
from agentq.testing.harness import text as answer
from tests.support.sql import sql_sent

_jobs, _events = Job.__table__, JobEvent.__table__

_EVENTS_OF = Prebuilt(
    select(_events.c.seq, _events.c.type, _events.c.data, _events.c.job_id.label("of"))
    .where(_events.c.job_id == bindparam("job_id"), _events.c.type != "never")
    .order_by(_events.c.seq))
"""Rows with a JSON column, a UUID column under a label and a literal the statement holds."""
_APPEND = Prebuilt(
    insert(_events).values(job_id=bindparam("job_id", type_=_events.c.job_id.type),
                           seq=bindparam("seq_now", type_=_events.c.seq.type),
                           type="probe", data=bindparam("payload", type_=_events.c.data.type))
    .returning(_events.c.seq, _events.c.data))
"""A JSON parameter serialized by its column's processor; RETURNING answered."""
_TOUCH = Prebuilt(update(_jobs).where(_jobs.c.id == bindparam("ident"),
                                      literal_in(_jobs.c.status, ("queued", "running")))
                  .values(redrive_after=None))
"""No rows answered; a None the statement holds; a fixed list written as literals."""


@pytest.fixture(params=["sqlite", "postgres"])
def any_db(request):
    return request.getfixturevalue("make" if request.param == "sqlite" else "make_pg")


def _events_by_session(session, job_id):
    return [tuple(row) for row in session.execute(_EVENTS_OF.statement, {"job_id": job_id})]


def test_rows_are_those_session_execute_answers(any_db):
    # given a job that ran, and wrote its events
    h = any_db(answer("4"))
    job_id = h.submit(thread=f"prebuilt-{uuid.uuid4().hex}")
    h.drive(job_id)
    job_id = uuid.UUID(job_id)
    with h.sessions() as session, session.begin():
        # when the prebuilt statement and session.execute read them
        rows = _EVENTS_OF.rows(session, {"job_id": job_id})
        expected = _events_by_session(session, job_id)
    # then both answer the same rows, by index and by name, the JSON parsed and the UUID
    # a UUID
    assert [tuple(row) for row in rows] == expected and expected
    assert rows[0].seq == 1 and rows[0].of == job_id and isinstance(rows[0].of, uuid.UUID)
    assert isinstance(rows[0].data, dict)


def test_a_write_serializes_its_json_and_answers_its_returning(any_db):
    h = any_db()
    job_id = uuid.UUID(h.submit(thread=f"prebuilt-{uuid.uuid4().hex}"))
    with h.sessions() as session, session.begin():
        seq = session.execute(select(_jobs.c.event_seq).where(_jobs.c.id == job_id)).scalar()
        row = _APPEND.first(session, {"job_id": job_id, "seq_now": seq + 1,
                                      "payload": {"a": [1, "two"], "b": None}})
    assert row.seq == seq + 1 and row.data == {"a": [1, "two"], "b": None}
    with h.sessions() as session:  # committed with the session's transaction
        stored = session.execute(select(_events.c.data).where(
            _events.c.job_id == job_id, _events.c.seq == seq + 1)).scalar_one()
    assert stored == {"a": [1, "two"], "b": None}


def test_a_statement_with_no_rows_runs_in_the_sessions_transaction(any_db):
    h = any_db()
    job_id = uuid.UUID(h.submit(thread=f"prebuilt-{uuid.uuid4().hex}"))
    with h.sessions() as session, session.begin():
        session.execute(update(_jobs).where(_jobs.c.id == job_id)
                        .values(redrive_after=text("CURRENT_TIMESTAMP")))
    with h.sessions() as session:
        session.begin()
        assert _TOUCH.rows(session, {"ident": job_id}) == []
        assert _TOUCH.first(session, {"ident": job_id}) is None
        session.rollback()  # the write goes with its transaction
    with h.sessions() as session:
        assert session.execute(select(_jobs.c.redrive_after).where(
            _jobs.c.id == job_id)).scalar_one() is not None
    with h.sessions() as session, session.begin():
        _TOUCH.execute(session, {"ident": job_id})
    with h.sessions() as session:
        assert session.execute(select(_jobs.c.redrive_after).where(
            _jobs.c.id == job_id)).scalar_one() is None


def test_sqlalchemy_events_hear_the_statement(make_pg):
    h = make_pg()
    job_id = uuid.UUID(h.submit(thread=f"prebuilt-{uuid.uuid4().hex}"))
    with sql_sent(h.sessions.kw["bind"]) as sent, h.sessions() as session, session.begin():
        _EVENTS_OF.rows(session, {"job_id": job_id})
    assert len(sent) == 1 and sent[0].startswith("SELECT job_events.seq")


def test_a_missing_parameter_is_refused_before_anything_is_sent(make_pg):
    h = make_pg()
    with sql_sent(h.sessions.kw["bind"]) as sent, h.sessions() as session:
        with pytest.raises(exc.ArgumentError, match="job_id"):
            _EVENTS_OF.rows(session, {})
    assert sent == []


def test_a_list_bound_per_call_runs_through_sqlalchemy(any_db):
    # given a statement whose SQL holds a list bound per run
    expanding = Prebuilt(select(_jobs.c.id).where(_jobs.c.status.in_(bindparam(
        "statuses", expanding=True)), _jobs.c.id == bindparam("ident")))
    h = any_db()
    job_id = uuid.UUID(h.submit(thread=f"prebuilt-{uuid.uuid4().hex}"))
    with h.sessions() as session:
        # when it runs with two lists
        hit = expanding.rows(session, {"statuses": ["queued", "running"], "ident": job_id})
        miss = expanding.rows(session, {"statuses": ["completed"], "ident": job_id})
    # then each run expands its own
    assert [row.id for row in hit] == [job_id] and miss == []


def test_literal_in_takes_plain_strings_only():
    with pytest.raises(ValueError):
        literal_in(_jobs.c.status, ["it's"])


def test_a_driver_error_is_raised_as_sqlalchemys(make_pg):
    # given an event whose key is taken
    h = make_pg(answer("4"))
    job_id = h.submit(thread=f"prebuilt-{uuid.uuid4().hex}")
    h.drive(job_id)
    job_id = uuid.UUID(job_id)
    with h.sessions() as session:
        # when a prebuilt insert writes the same key
        with pytest.raises(exc.IntegrityError) as raised:
            with session.begin():
                _APPEND.first(session, {"job_id": job_id, "seq_now": 1, "payload": {}})
    # then it is SQLAlchemy's IntegrityError, the driver's error its cause
    assert raised.value.orig.pgcode == "23505"


def test_a_dead_connection_is_unreachable_and_never_handed_out_again(make_pg):
    # given a session whose server connection is ended by the server
    h = make_pg(answer("4"))
    job_id = h.submit(thread=f"prebuilt-{uuid.uuid4().hex}")
    h.drive(job_id)
    job_id = uuid.UUID(job_id)
    engine = h.sessions.kw["bind"]
    with h.sessions() as session:
        session.begin()
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            other.commit()
        # when a prebuilt statement runs on it
        with pytest.raises(DATABASE_UNREACHABLE) as raised:
            _EVENTS_OF.rows(session, {"job_id": job_id})
        # then it is the error every retry of agentq's knows, the connection invalidated
        assert raised.value.connection_invalidated
    # and the next session gets a live connection
    with h.sessions() as session:
        assert _EVENTS_OF.rows(session, {"job_id": job_id})
        assert session.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid


def test_a_run_naming_a_column_to_write_runs_through_sqlalchemy(any_db):
    # given an UPDATE, and a run given a parameter named as a column of its table (which
    # SQLAlchemy writes too: it compiles an UPDATE for the keys it is given)
    h = any_db()
    job_id = uuid.UUID(h.submit(thread=f"prebuilt-{uuid.uuid4().hex}"))
    with h.sessions() as session, session.begin():
        _TOUCH.execute(session, {"ident": job_id, "model": "named-by-the-run"})
    # then the column is written, as SQLAlchemy writes it
    with h.sessions() as session:
        assert session.execute(select(_jobs.c.model).where(
            _jobs.c.id == job_id)).scalar_one() == "named-by-the-run"


def test_the_statements_every_job_runs_are_compiled_once():
    # the tool call's start and result, the messages and events appended, the job's end
    # and its conversation's release, the key check and the poll's read: none of them
    # falls back to SQLAlchemy's execution (an expanding list, columns from parameters)
    from sqlalchemy.dialects import postgresql

    from agentq.loop import busy, execute, store
    from agentq.prebuilt import prebuilt
    from agentq.tenants import RUNNING_NOW
    from agentq.views import _JOB_WITH_CHILDREN
    from api.auth import _LIVE_KEY
    dialect = postgresql.psycopg2.dialect()
    statements = {
        "tool start": execute._LOCK_AND_START_FIRST,
        "tool call read": execute._LOCK_CALL_BY_ID[True],
        "tool start again": execute._START_CALL, "tool result": execute._STORE_RESULT,
        "tool result and event": execute._STORE_WITH_EVENT,
        "turn pending": execute._PENDING_OF_TURN,
        "message": prebuilt(store._APPEND_ONE),
        "message unread": prebuilt(store._APPEND_ONE_UNREAD),
        "message after": prebuilt(store._APPEND_AFTER),
        "event": prebuilt(store._APPEND_ONE_EVENT),
        "answer and release": prebuilt(busy.ANSWER_AND_RELEASE),
        "after answer": prebuilt(busy.AFTER_ANSWER),
        "next and quota waiters": prebuilt(busy.NEXT_AND_QUOTA_WAITERS),
        "calls": prebuilt(busy.CALLS_OF), "release": prebuilt(busy.RELEASE),
        "hand on": prebuilt(busy.HAND_ON), "poll": _JOB_WITH_CHILDREN, "key": _LIVE_KEY,
        "submit's running count": prebuilt(select(RUNNING_NOW))}
    fallen_back = [name for name, statement in statements.items()
                   if statement._plan(dialect) is None]
    assert fallen_back == []
