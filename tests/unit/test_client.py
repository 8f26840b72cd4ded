"""agentq.client with no agentq server: how calls become requests, how answers and errors are
read, and which requests are retried (against a real local HTTP server that answers from a
plan)."""
from __future__ import annotations

import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentq.client import (
    AgentQ,
    AgentQError,
    ApiError,
    Conflict,
    Job,
    NotFound,
    TransportError,
    Unavailable,
    _core,
)

JOB = {"id": "j1", "status": "completed", "finish_reason": "end_turn",
       "conversation_id": "c1", "created_at": "2026-11-22T10:00:00+00:00",
       "started_at": "2026-11-22T10:00:01+00:00", "finished_at": "2026-11-22T10:00:02+00:00",
       "iterations": 2,
       "usage": {"input_tokens": 30, "output_tokens": 7, "cost_estimate": 0.0001},
       "response": {"content": "42", "files": [{"filename": "a.txt", "url": "http://x/a"}],
                    "error": None,
                    "metadata": {"tool_calls": [{"name": "math.evaluate", "success": True,
                                                 "tool_use_id": "t1"}]}},
       "replay_of": None, "batch_id": None, "metadata": {"k": "v"}, "limits": {}}


class Plan:
    """A local HTTP server answering each request with the next planned (status, headers,
    body); it records what it was sent."""

    def __init__(self, *answers):
        self.answers = deque(answers)
        self.seen: list[dict] = []
        plan = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                plan.seen.append({"method": self.command, "path": self.path,
                                  "headers": dict(self.headers), "body": body})
                status, headers, payload = plan.answers.popleft()
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def plan():
    servers = []

    def make(*answers):
        servers.append(Plan(*answers))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


def error(code, message="m", **details):
    return {"error": {"code": code, "message": message, "details": details}}


def test_a_job_object_is_read_into_typed_fields():
    job = Job.parse(JOB)
    assert job.ended and job.content == "42" and job.finish_reason == "end_turn"
    assert job.usage.input_tokens == 30 and job.usage.cost_estimate == pytest.approx(0.0001)
    assert job.response.files[0].filename == "a.txt"
    assert job.response.tool_calls[0].tool_use_id == "t1"
    assert job.finished_at.isoformat() == "2026-11-22T10:00:02+00:00"
    assert job.raw["limits"] == {}  # fields the client does not type stay reachable


def test_a_responses_tool_calls_say_what_was_done():
    """API.md 1.2: each call's arguments, result (cut at 2 KB: truncated), error, status."""
    call = {"name": "flaky.echo", "success": True, "tool_use_id": "t2",
            "status": "succeeded", "arguments": {"text": "hi"}, "result": "x" * 2048,
            "error": None, "truncated": True}
    raw = {**JOB, "response": {**JOB["response"], "metadata": {"tool_calls": [call]}}}
    [parsed] = Job.parse(raw).response.tool_calls
    assert (parsed.status, parsed.arguments, parsed.result, parsed.error, parsed.truncated) \
        == ("succeeded", {"text": "hi"}, "x" * 2048, None, True)
    [old] = Job.parse(JOB).response.tool_calls  # a server before 1.2: the fields default
    assert (old.status, old.arguments, old.truncated) == (None, None, False)


def test_a_queued_job_has_no_response():
    job = Job.parse({**JOB, "status": "queued", "response": None, "finished_at": None})
    assert not job.ended and job.content is None and job.finished_at is None


def test_a_message_call_carries_only_what_was_given():
    call = _core.message_call("hi", user="u", channel="c", thread="t", on_busy="steer",
                              idempotency_key="k1", wait_s=90)
    assert call.json == {"platform": "api", "platform_user_id": "u",
                         "platform_channel_id": "c", "content": "hi",
                         "platform_thread_id": "t", "on_busy": "steer"}
    assert call.headers == {"Idempotency-Key": "k1"} and call.retry_safe
    assert call.params == {"wait": 60}  # API.md caps ?wait at 60
    assert not _core.message_call("hi", user="u", channel="c").retry_safe


def test_a_batch_call_is_jsonl_with_its_options_in_the_query():
    call = _core.batch_call([{"content": "a"}, {"content": "b"}], max_concurrency=2)
    assert call.content == b'{"content": "a"}\n{"content": "b"}\n'
    assert call.headers["Content-Type"] == "application/x-ndjson"
    assert call.params == {"max_concurrency": 2}


def test_errors_are_typed_by_status_and_keep_the_error_shape(plan):
    server = plan((404, {}, error("not_found", "No job x.")),
                  (409, {}, error("conflict", "ended", status="completed")),
                  (422, {}, error("validation_failed", "bad", fields={"content": ["x"]})))
    with AgentQ(server.url, api_key="k", attempts=1) as aq:
        with pytest.raises(NotFound) as not_found:
            aq.job("x")
        with pytest.raises(Conflict) as conflict:
            aq.cancel("x")
        with pytest.raises(ApiError) as invalid:
            aq.submit("", user="u", channel="c")
    assert not_found.value.message == "No job x."
    assert conflict.value.details == {"status": "completed"}
    assert invalid.value.status == 422 and invalid.value.code == "validation_failed"
    assert server.seen[0]["headers"]["Authorization"] == "Bearer k"


def test_a_get_is_retried_after_503_honouring_retry_after(plan):
    server = plan((503, {"Retry-After": "0"}, error("unavailable", "db away")),
                  (200, {}, JOB))
    with AgentQ(server.url, api_key="k") as aq:
        assert aq.job("j1").id == "j1"
    assert [s["path"] for s in server.seen] == ["/v1/jobs/j1", "/v1/jobs/j1"]


def test_a_submit_without_an_idempotency_key_is_never_sent_twice(plan):
    server = plan((503, {"Retry-After": "0"}, error("unavailable", "broker away")))
    with AgentQ(server.url, api_key="k") as aq:
        with pytest.raises(Unavailable) as caught:
            aq.submit("hi", user="u", channel="c")
    assert caught.value.retry_after == 0 and len(server.seen) == 1


def test_a_submit_with_an_idempotency_key_is_retried_with_the_same_key(plan):
    server = plan((503, {"Retry-After": "0"}, error("unavailable")), (202, {}, JOB))
    with AgentQ(server.url, api_key="k") as aq:
        assert aq.submit("hi", user="u", channel="c", idempotency_key="same").id == "j1"
    assert [s["headers"]["Idempotency-Key"] for s in server.seen] == ["same", "same"]
    assert server.seen[0]["body"] == server.seen[1]["body"]


def test_retries_end_and_the_last_error_is_raised(plan):
    server = plan(*[(503, {"Retry-After": "0"}, error("unavailable"))] * 3)
    with AgentQ(server.url, api_key="k", attempts=3) as aq:
        with pytest.raises(Unavailable):
            aq.job("j1")
    assert len(server.seen) == 3


def test_an_unreachable_api_is_a_transport_error():
    with AgentQ("http://127.0.0.1:9", api_key="k", attempts=2) as aq:
        with pytest.raises(TransportError):
            aq.job("j1")


def test_no_key_is_refused_before_any_request(monkeypatch):
    monkeypatch.delenv("AGENTQ_API_KEY", raising=False)
    with pytest.raises(AgentQError, match="no API key"):
        AgentQ("http://127.0.0.1:9")


def test_an_error_names_the_request_it_answers(plan):
    server = plan((401, {}, error("unauthorized", "Invalid API key.")))
    with AgentQ(server.url, api_key="k", attempts=1) as aq:
        with pytest.raises(ApiError) as caught:
            aq.job("j1")
    assert (caught.value.method, caught.value.path, caught.value.status) == (
        "GET", "/v1/jobs/j1", 401)


def test_a_batch_given_as_bytes_is_sent_as_it_is():
    call = _core.batch_call(b'{"content": "a"}\nnot json\n', callback_url="http://x/h")
    assert call.content == b'{"content": "a"}\nnot json\n'
    assert call.params == {"callback_url": "http://x/h"}


def test_a_replay_batch_may_name_another_model():
    call = _core.replay_batch_call(None, {"status": "failed"}, "live", model="m2")
    assert call.json == {"mode": "live", "model": "m2", "filter": {"status": "failed"}}


def test_ready_says_what_is_down(plan):
    server = plan((503, {}, {"status": "not ready", "down": ["broker"]}),
                  (200, {}, {"status": "ok"}))
    with AgentQ(server.url, api_key="k", attempts=1) as aq:
        assert aq.down() == ["broker"]
        assert aq.down() == []


def test_server_sent_events_are_read_with_their_keep_alives():
    lines = ["retry: 1000", "", ": keep-alive", "", "id: 1", "event: turn_start",
             'data: {"seq": 1, "type": "turn_start"}', "", "event: message_delta",
             'data: {"type": "message_delta",', 'data:  "delta": "4"}', ""]
    assert list(_core.sse_items(lines)) == [
        None, {"seq": 1, "type": "turn_start"}, {"type": "message_delta", "delta": "4"}]


def test_watch_is_one_connection_with_a_tick_at_each_keep_alive():
    import httpx

    body = (": keep-alive\n\n"
            'id: 1\nevent: turn_start\ndata: {"seq": 1, "type": "turn_start", "data": {}}\n\n'
            'event: message_delta\ndata: {"type": "message_delta", "delta": "4"}\n\n'
            'id: 2\nevent: job_end\ndata: {"seq": 2, "type": "job_end", "data": {}}\n\n')
    seen = []

    def answer(request):
        seen.append(dict(request.headers))
        return httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"})
    http = httpx.Client(base_url="http://api", transport=httpx.MockTransport(answer))
    with AgentQ("http://api", api_key="k", http=http) as aq:
        items = list(aq.watch("j1", after=7))
    assert [None if i is None else (i.seq, i.type) for i in items] == [
        None, (1, "turn_start"), None, (2, "job_end")]
    assert seen[0]["last-event-id"] == "7" and seen[0]["accept"] == "text/event-stream"
