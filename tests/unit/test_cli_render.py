"""`agentq submit --wait` reading server-sent events and rendering them, against an in-memory
HTTP transport (no server)."""
from __future__ import annotations

import json

import httpx
from click.testing import CliRunner

from agentq import cli

JOB_ID = "7a3c2f9e-0000-4000-8000-000000000001"


def _sse(events: list[dict]) -> bytes:
    out = ["retry: 1000", ""]
    for event in events:
        out += [f"id: {event['seq']}", f"event: {event['type']}",
                f"data: {json.dumps(event)}", "", ": keep-alive", ""]
    return ("\n".join(out) + "\n").encode()


EVENTS = [
    {"seq": 1, "type": "job_start", "data": {}},
    {"seq": 2, "type": "turn_start", "data": {"turn": 1}},
    {"seq": 3, "type": "message_end", "data": {"model": "m", "tool_calls": ["math.evaluate"]}},
    {"seq": 4, "type": "tool_execution_start",
     "data": {"name": "math.evaluate", "arguments": {"expression": "6*7"}}},
    {"seq": 5, "type": "tool_execution_end", "data": {"name": "math.evaluate", "ok": True}},
    {"seq": 6, "type": "job_end", "data": {"status": "completed", "finish_reason": "end_turn"}},
]
JOB = {"id": JOB_ID, "status": "completed", "conversation_id": "c-1",
       "response": {"content": "It is 42.", "error": None,
                    "files": [{"filename": "a.txt", "url": "http://x/v1/files/1"}]}}


def _transport(seen: list[httpx.Request], drop_after: int | None = None):
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST" and request.url.path == "/v1/messages":
            return httpx.Response(202, json={**JOB, "status": "queued", "response": None})
        if request.url.path.endswith("/events"):
            after = int(request.headers.get("Last-Event-ID", "0"))
            rest = [e for e in EVENTS if e["seq"] > after]
            if drop_after is not None and after < drop_after:
                rest = [e for e in rest if e["seq"] <= drop_after]  # the stream ends early
            return httpx.Response(200, content=_sse(rest),
                                  headers={"Content-Type": "text/event-stream"})
        if request.url.path == f"/v1/jobs/{JOB_ID}":
            return httpx.Response(200, json=JOB)
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no",
                                                   "details": {}}})
    return httpx.MockTransport(handle)


def _run(monkeypatch, seen, drop_after=None, *args):
    real = httpx.Client

    def client(**kw):
        return real(transport=_transport(seen, drop_after), **kw)
    monkeypatch.setattr(httpx, "Client", client)
    return CliRunner().invoke(cli.main, ["submit", "what is 6*7?", "--url", "http://api",
                                         "--key", "k", *args])


def test_submit_wait_renders_events_on_stderr_and_the_answer_on_stdout(monkeypatch):
    seen: list[httpx.Request] = []
    result = _run(monkeypatch, seen, None, "--wait")
    assert result.exit_code == 0, result.output
    assert result.stdout == "It is 42.\n  file: a.txt http://x/v1/files/1\n"
    lines = result.stderr.splitlines()
    assert lines[0] == f"job {JOB_ID} (queued)"
    assert [line.split("s ", 1)[1] for line in lines[1:]] == [
        "· job_start", "· turn 1", "  model m: calls math.evaluate",
        '  → math.evaluate {"expression": "6*7"}', "  ← math.evaluate ok",
        "· completed (end_turn)"]
    submitted = json.loads(seen[0].content)
    assert submitted["content"] == "what is 6*7?" and submitted["platform"] == "cli"
    assert seen[0].headers["Authorization"] == "Bearer k"
    # the events are read as a stream (a readiness probe of the API may come before it)
    streams = [r for r in seen[1:] if r.url.path.endswith("/events")]
    assert streams and all(r.headers["Accept"] == "text/event-stream" for r in streams)


def test_a_dropped_stream_resumes_after_the_last_event(monkeypatch):
    seen: list[httpx.Request] = []
    result = _run(monkeypatch, seen, 3, "--wait")
    assert result.exit_code == 0, result.output
    streams = [r for r in seen if r.url.path.endswith("/events")]
    assert [r.headers.get("Last-Event-ID") for r in streams] == [None, "3"]
    assert result.stderr.count("· turn 1") == 1 and "· completed" in result.stderr


def test_submit_without_wait_prints_the_id(monkeypatch):
    result = _run(monkeypatch, [], None)
    assert result.exit_code == 0 and result.stdout == f"{JOB_ID}\n"


def test_a_waiting_provider_event_says_when_the_job_tries_again():
    line = cli._describe("waiting_provider", {"error": "HTTP 429",
                                              "next_attempt_at": "2026-11-23T10:00:05+00:00"})
    assert "HTTP 429" in line and "2026-11-23T10:00:05+00:00" in line


def test_the_users_own_message_is_not_echoed_as_a_model_line():
    # (seen in `agentq run`: "· message_start" and "model None: answers" for the question)
    assert cli._describe("message_start", {"role": "user"}) is None
    assert cli._describe("message_start", {"role": "assistant", "turn": 1}) is None
    assert cli._describe("message_end", {"role": "user", "kind": "question"}) is None
    assert cli._describe("message_end", {"role": "user", "kind": "steering"}) == \
        "· steering message taken"
    assert cli._describe("message_end", {"role": "assistant", "model": "m",
                                         "tool_calls": []}) == "  model m: answers"
