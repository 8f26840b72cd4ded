"""Token streaming through the real stack: with `stream: true` (or a streaming persona) the
model's reply reaches an SSE client as `message_delta` events while it is written; they
concatenate to the stored final message, are never stored as events, and usage and replay
are as without streaming. A stream cut mid-reply is retried as a whole call.

To be listening before the model writes, each test's job first calls an approval-gated
tool: it waits (no worker involved) until the SSE stream is open, then it is approved."""
from __future__ import annotations

import json
import threading

import pytest

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import Client, uid, wait_until

pytestmark = pytest.mark.integration
WAIT_S = 60


class Listener:
    """GET /v1/jobs/<id>/events as text/event-stream, in a thread, until job_end."""

    def __init__(self, client: Client, job_id: str):
        self.events: list[tuple[str, str | None, dict]] = []
        self.open = threading.Event()
        self.done = threading.Event()
        self.response = client.http.get(client.url(f"/v1/jobs/{job_id}/events"),
                                        headers={"Accept": "text/event-stream"},
                                        stream=True, timeout=(5, 70))
        assert self.response.status_code == 200
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        kind, ident, data = None, None, []
        try:
            for raw in self.response.iter_lines(decode_unicode=True):
                if raw.startswith("retry:"):
                    self.open.set()  # the server subscribed before it sent this
                if raw == "":
                    if data:
                        self.events.append((kind, ident, json.loads("\n".join(data))))
                        if kind == "job_end":
                            return
                    kind, ident, data = None, None, []
                elif raw.startswith("event:"):
                    kind = raw[6:].strip()
                elif raw.startswith("id:"):
                    ident = raw[3:].strip()
                elif raw.startswith("data:"):
                    data.append(raw[5:].strip())
        finally:
            self.done.set()
            self.response.close()

    def deltas(self) -> list[dict]:
        """Each delta's `data` ({turn, attempt, index, delta}), in arrival order."""
        return [event["data"] for kind, _ident, event in self.events
                if kind == "message_delta" and event["type"] == "message_delta"
                and event["seq"] is None]


def wait_for(predicate, what: str):
    return wait_until(predicate, WAIT_S, what=what)


def gated_then_streamed(client: Client, marker: str, **fields) -> tuple[dict, Listener]:
    """Submit; once the job waits for approval, listen, then approve; the job's end."""
    job = client.submit(f"{marker} tell me", **fields)
    approval = wait_for(lambda: next((e["data"] for e in client.events(job["id"])
                                      if e["type"] == "approval_required"), None),
                        "approval_required")
    listener = Listener(client, job["id"])
    assert listener.open.wait(WAIT_S)
    approved = client.post(f"/v1/jobs/{job['id']}/tool_calls/{approval['tool_use_id']}"
                           "/approve")
    assert approved.status_code == 202, approved.text
    ended = client.wait(job["id"])
    assert listener.done.wait(WAIT_S)
    return ended, listener


ANSWER = "The quick brown fox jumps over the lazy dog, streamed a word at a time."


def test_streamed_deltas_concatenate_to_the_stored_message(client, script):
    marker = script([tool_calls(call("flaky.guarded", {"text": "x"})),
                     text(ANSWER, input_tokens=40, output_tokens=16)])
    ended, listener = gated_then_streamed(client, marker, stream=True)
    assert ended["status"] == "completed" and ended["response"]["content"] == ANSWER
    deltas = listener.deltas()
    assert len(deltas) > 3
    assert "".join(d["delta"] for d in deltas) == ANSWER
    assert [d["index"] for d in deltas] == sorted(d["index"] for d in deltas)
    assert {d["turn"] for d in deltas} == {2}
    # deltas carry no id: the record's events are numbered as without streaming
    assert all(ident is None for kind, ident, _ in listener.events if kind == "message_delta")
    stored = client.events(ended["id"])
    assert "message_delta" not in {e["type"] for e in stored}
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    # deltas come before the turn's message_end on the stream
    kinds = [kind for kind, _, _ in listener.events]
    last_delta = max(i for i, k in enumerate(kinds) if k == "message_delta")
    assert kinds.index("message_end", last_delta) > last_delta
    messages = client.get(f"/v1/conversations/{ended['conversation_id']}/messages").json()
    assert [m["content"] for m in messages["data"] if m["role"] == "assistant"][-1] == ANSWER
    # usage is the provider's, as without streaming (10+5 for the first turn)
    assert ended["usage"]["input_tokens"] == 50 and ended["usage"]["output_tokens"] == 21


def test_a_recorded_replay_of_a_streamed_job_answers_the_same(client, script):
    marker = script([tool_calls(call("flaky.guarded", {"text": "x"})), text(ANSWER)])
    ended, _listener = gated_then_streamed(client, marker, stream=True)
    replay = client.post(f"/v1/jobs/{ended['id']}/replay", json={"mode": "recorded"})
    assert replay.status_code == 202, replay.text
    replay_id = replay.json()["id"]
    approval = wait_for(lambda: next((e["data"] for e in client.events(replay_id)
                                      if e["type"] == "approval_required"), None),
                        "the replay's approval_required")
    client.post(f"/v1/jobs/{replay_id}/tool_calls/{approval['tool_use_id']}/approve")
    replayed = client.wait(replay_id)
    assert replayed["status"] == "completed" and replayed["response"]["content"] == ANSWER
    compare = client.get(f"/v1/jobs/{replay_id}/compare").json()
    assert compare["same_answer"] is True


def test_a_cut_stream_is_retried_whole_with_a_streaming_persona(stack, script):
    tenant = stack.create_tenant(uid("stream-t"))
    client = Client(stack, stack.create_key("stream", admin=True, tenant=tenant))
    persona = client.post("/v1/personas", json={"name": "Streamer", "stream": True})
    assert persona.status_code == 201 and persona.json()["stream"] is True
    marker = script([tool_calls(call("flaky.guarded", {"text": "x"})),
                     text("this stream will be cut off midway", stream_cut=True),
                     text(ANSWER)])
    ended, listener = gated_then_streamed(client, marker)  # no stream flag: the persona's
    assert ended["status"] == "completed" and ended["response"]["content"] == ANSWER
    deltas = listener.deltas()
    attempts = sorted({d["attempt"] for d in deltas})
    assert len(attempts) == 2
    first = "".join(d["delta"] for d in deltas if d["attempt"] == attempts[0])
    assert first and "this stream will be cut off midway".startswith(first)
    assert first != "this stream will be cut off midway"
    assert "".join(d["delta"] for d in deltas if d["attempt"] == attempts[1]) == ANSWER
    # billed once: the cut call had no usage to bill
    assert ended["usage"]["input_tokens"] == 20 and ended["usage"]["output_tokens"] == 10


def test_without_stream_no_deltas_are_sent(client, script):
    marker = script([tool_calls(call("flaky.guarded", {"text": "x"})), text(ANSWER)])
    ended, listener = gated_then_streamed(client, marker)
    assert ended["response"]["content"] == ANSWER and listener.deltas() == []


def test_stream_must_be_a_boolean(client):
    response = client.post("/v1/messages", json={
        "platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
        "content": "hi", "stream": "yes please"})
    assert response.status_code == 422
    assert "stream" in response.json()["error"]["details"]["fields"]
