"""A poll (`GET /v1/jobs/<id>` without `wait`) reads its job and the job's children in one
statement on Postgres, after the key check: two round trips a poll, whatever the job
(issue 34: a client polling every 20 ms paid a third for the children)."""
from __future__ import annotations

import uuid

import pytest

from agentq.db import session_scope
from agentq.keys import create_key
from agentq.loop.execute import execute_tool_call
from agentq.testing.harness import calls
from tests.support.sql import wire_sent

AGENTS = {"AGENTQ_DEFAULT_MODULES": "agents,math", "AGENTQ_QUOTA_REQUESTS_PER_SECOND": "0"}


def _delegating(make, **extra):
    """A parent that delegated two tasks, each child started: (harness, parent id)."""
    h = make(calls(("agents.delegate", {"task": "first"}),
                   ("agents.delegate", {"task": "second"})), **AGENTS, **extra)
    parent = h.submit("delegate two", thread=f"poll-{uuid.uuid4().hex}")  # a place of its own
    [dispatch] = h.stepper.run(parent, 0, "start")
    for tool_use_id, _queue, _limit in dispatch.calls:
        h.sent_by(execute_tool_call, tool_use_id, h.settings, h.registry, h.sessions)
    return h, parent


def _client(h, admin: bool = True):
    from api import create_app
    with session_scope(h.settings) as session:
        _, key = create_key(session, "poller", admin=admin)
    return create_app(h.settings).test_client(), {"Authorization": f"Bearer {key}"}


def _children_by_call_order(h, parent: str) -> list[str]:
    from agentq.views import children_of
    with h.sessions() as session:
        return children_of(session, uuid.UUID(parent))


@pytest.fixture(params=["make", "make_pg"])
def any_db(request):
    """The harness factory on the suite's database (SQLite unless AGENTQ_UNIT_DB) and on
    Postgres: the poll answers the same on both (each case sets up only its own)."""
    return request.getfixturevalue(request.param)


def test_a_poll_lists_the_jobs_children_in_call_order(any_db):
    h, parent = _delegating(any_db)
    client, auth = _client(h)
    expected = _children_by_call_order(h, parent)
    assert len(expected) == 2
    body = client.get(f"/v1/jobs/{parent}", headers=auth).get_json()
    assert body["children"] == expected
    assert body["status"] == "waiting" and body["waiting_for"] == "children"
    # and a child lists none, with its parent named
    child = client.get(f"/v1/jobs/{expected[0]}", headers=auth).get_json()
    assert child["children"] == [] and child["parent_job_id"] == parent


def test_a_poll_is_the_key_check_and_one_read_on_postgres(make_pg):
    h, parent = _delegating(make_pg)
    client, auth = _client(h)
    client.get(f"/v1/jobs/{parent}", headers=auth)  # the connections' statements prepared
    client.get(f"/v1/jobs/{parent}", headers=auth)
    with wire_sent() as sent:
        answer = client.get(f"/v1/jobs/{parent}", headers=auth)
    assert answer.status_code == 200 and len(answer.get_json()["children"]) == 2
    reads = [s for s in sent if not s.startswith(("PREPARE", "DEALLOCATE"))]
    assert len(reads) == 2, reads  # the key, then the job with its children
    assert not any(s.strip().upper().startswith(("BEGIN", "COMMIT")) for s in reads)


def test_a_poll_of_a_job_the_key_may_not_see_is_404_as_if_absent(make_pg):
    h, parent = _delegating(make_pg)
    client, auth = _client(h, admin=False)  # a plain key sees only the jobs it made
    answer = client.get(f"/v1/jobs/{parent}", headers=auth)
    absent = client.get(f"/v1/jobs/{uuid.uuid4()}", headers=auth)
    assert answer.status_code == absent.status_code == 404
    body = answer.get_json()
    assert body["error"]["code"] == absent.get_json()["error"]["code"]
    assert "children" not in answer.get_data(as_text=True)


def test_a_polls_job_object_is_the_orm_jobs(make_pg):
    # given a job that ended with usage, a response and metadata (every kind of column the
    # job object shows: timestamps, a float, JSON, enums as text)
    from agentq.models import Job
    from agentq.testing.harness import text
    from agentq.views import job_object, read_job
    h = make_pg(text("4", input_tokens=12, output_tokens=3))
    job_id = h.submit("What is 2+2?", thread=f"poll-{uuid.uuid4().hex}")
    h.drive(job_id)
    # when the poll reads it as a row of its columns, and the ORM loads it
    with h.sessions() as session:
        row, children = read_job(session, uuid.UUID(job_id))
        polled = job_object(row, children)
    with h.sessions() as session:
        loaded = job_object(session.get(Job, uuid.UUID(job_id)))
    # then both make the same job object
    assert polled == loaded
    assert polled["status"] == "completed" and polled["usage"]["input_tokens"] == 12
    assert isinstance(polled["usage"]["cost_estimate"], float)
