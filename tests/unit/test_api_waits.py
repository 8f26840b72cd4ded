"""A view that waits (`?wait=S` on a submit or a job, an event stream) holds no database
connection while it waits: at each moment it listens on the hub (agentq.notify), its engine's
pool has given out no more connections than before the request. A connection held for the
whole of a wait (up to 60 s) would let a few waiting clients drain the web process's pool
(AGENTQ_DB_POOL_SIZE) and stall every other request."""
from __future__ import annotations

import uuid

import pytest

from agentq.db import engine_for, session_scope
from agentq.keys import create_key
from agentq.notify import Subscription

SHORT_WAIT_S = 0.05
"""How long each wait lasts here: nothing ends the job, so every wait runs out; the test
looks at what the wait holds, never at how long it takes."""


@pytest.fixture
def at_each_wait(monkeypatch):
    """The pool's checked-out connection count, each time a view waits on the hub (the wait
    itself is cut to SHORT_WAIT_S)."""
    seen: list[int] = []
    engines = []
    real_get = Subscription.get

    def observed_get(self, timeout_s: float):
        seen.append(engines[0].pool.checkedout())
        return real_get(self, min(timeout_s, SHORT_WAIT_S))
    monkeypatch.setattr(Subscription, "get", observed_get)

    def watch(engine) -> list[int]:
        engines.append(engine)
        return seen
    return watch


def _client(h):
    from api import create_app
    with session_scope(h.settings) as session:
        _, key = create_key(session, "waits")
    return create_app(h.settings).test_client(), {"Authorization": f"Bearer {key}"}


def _message(content: str = "What is 2+2?") -> dict:
    return {"platform": "api", "platform_user_id": "u-1", "platform_channel_id": "c-1",
            "content": content}


def test_an_idempotent_replay_that_waits_holds_no_connection_while_it_waits(
        make, at_each_wait):
    # given a job submitted with an Idempotency-Key, which has not ended
    h = make()
    client, auth = _client(h)
    headers = {**auth, "Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = client.post("/v1/messages", json=_message(), headers=headers)
    assert first.status_code == 202, first.get_data(as_text=True)
    engine = engine_for(h.settings)
    before = engine.pool.checkedout()
    waits = at_each_wait(engine)
    # when the same request is sent again, asking to wait for the job's end
    again = client.post("/v1/messages?wait=1", json=_message(), headers=headers)
    # then it answers the first job, and held no connection while it waited
    assert again.status_code == 202, again.get_data(as_text=True)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["id"] == first.get_json()["id"]
    assert waits and all(out == before for out in waits), (before, waits)
    assert engine.pool.checkedout() == before


def test_a_new_submit_and_a_job_read_that_wait_hold_no_connection_while_they_wait(
        make, at_each_wait):
    h = make()
    client, auth = _client(h)
    engine = engine_for(h.settings)
    before = engine.pool.checkedout()
    waits = at_each_wait(engine)
    submitted = client.post("/v1/messages?wait=1", json=_message(), headers=auth)
    assert submitted.status_code == 202, submitted.get_data(as_text=True)
    read = client.get(f"/v1/jobs/{submitted.get_json()['id']}?wait=1", headers=auth)
    assert read.status_code == 200 and read.get_json()["status"] == "queued"
    assert len(waits) >= 2 and all(out == before for out in waits), (before, waits)


def test_an_event_stream_holds_no_connection_while_it_waits_for_events(make, at_each_wait):
    h = make()
    client, auth = _client(h)
    job = client.post("/v1/messages", json=_message(), headers=auth).get_json()
    engine = engine_for(h.settings)
    before = engine.pool.checkedout()
    waits = at_each_wait(engine)
    stream = client.get(f"/v1/jobs/{job['id']}/events", buffered=False,
                        headers={**auth, "Accept": "text/event-stream"})
    assert stream.status_code == 200
    chunks = iter(stream.response)
    pieces = [next(chunks) for _ in range(3)]  # retry:, then a keep-alive after each wait
    stream.close()
    assert any(b"keep-alive" in p for p in pieces), pieces
    assert len(waits) >= 2 and all(out == before for out in waits), (before, waits)
