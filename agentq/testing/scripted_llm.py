"""A scripted OpenAI-compatible HTTP server for tests and benchmarks (agentq's and yours:
docs/testing.md). The model a real stack's workers talk to through the `openai` SDK.

It runs an asyncio server in a background thread: thousands of concurrent connections, each
waiting out an artificial latency with `asyncio.sleep`, cost next to nothing, so the server
is never what a benchmark measures. HTTP/1.1 with keep-alive; every response is one write
(headers and body together) on a socket with TCP_NODELAY, so no Nagle/delayed-ACK stalls.

    with ScriptedLLM() as llm:
        marker = llm.script("calc", [tool_calls(call("math.evaluate", {"expression": "1+1"})),
                                     text("2")])
        ...  # any request whose messages contain "script:calc" gets the next reply
        llm.assert_done()

Requests with no script entry go to `responder(request_json)` when one is given, else get
HTTP 500 and are recorded in `llm.unexpected`.

A provider outage lasts as long as a test says, not a number of requests:

    llm.storm(key, [error(429, headers={"retry-after": "1"}), error(429), error(500),
                    hang(10)])   # every request for `key` (None: every request) gets the
    ...                          # next of these, in a cycle, until
    llm.calm(key)                # the provider recovers: the script answers again

Standalone (benchmarks): `python -m agentq.testing.scripted_llm --port 8900 --latency 0.5
--responder react` prints its base_url; `GET /stats` (or SIGUSR1) reports its request rate.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import hashlib
import http
import itertools
import json
import math
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from agentq.llm.names import to_api_name

SCRIPT_KEY_RE = re.compile(r"script:([A-Za-z0-9_-]+)")
EMBEDDING_DIM = 16
LISTEN_BACKLOG = 4096
HEADER_MAX_BYTES = 64 * 1024
START_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
HANG_REPLY_TEXT = "(a late answer)"

Responder = Callable[[dict], "Reply"]


@dataclass
class Reply:
    """One scripted answer; build it with text(), tool_calls(), function_call(), error(), hang()."""
    kind: str = "message"  # "message" | "error" | "hang"
    content: str | None = ""
    tool_calls: list[dict] = field(default_factory=list)
    function_call: dict | None = None
    finish_reason: str = "stop"
    input_tokens: int = 10
    output_tokens: int = 5
    usage: bool = True
    model: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    expect_model: str | None = None
    check: Callable[[dict], Any] | None = None
    hold: threading.Event | None = None
    """Answer only once this is set (the test decides when the model has "thought" enough).
    Meanwhile the response has begun: its head is sent at once and a blank (JSON's leading
    whitespace; a comment line in a stream) every HOLD_KEEPALIVE_S, so the client's read
    timeout never runs out however long the test takes to set it."""
    stream_cut: bool = False
    """Asked to stream: send half the reply's pieces, then close the connection."""

    def describe(self) -> str:
        if self.kind == "error":
            return f"error({self.status})"
        if self.kind == "hang":
            return f"hang({self.delay_s:g})"
        if self.tool_calls or self.function_call:
            return "tool_calls(" + ", ".join(c["function"]["name"] for c in self.tool_calls
                                            or [{"function": self.function_call}]) + ")"
        return f"text({(self.content or '')[:30]!r})"


def text(content: str, *, input_tokens: int = 10, output_tokens: int = 5, delay_s: float = 0.0,
         expect_model: str | None = None, check: Callable[[dict], Any] | None = None,
         usage: bool = True, finish_reason: str = "stop", model: str | None = None,
         hold: threading.Event | None = None, stream_cut: bool = False) -> Reply:
    """A plain answer. `model` overrides the echoed request model; `usage=False` omits usage;
    `hold`: sent only once that event is set. A request with `stream: true` gets it as
    server-sent chunks, a word a chunk (cut halfway with `stream_cut`)."""
    return Reply(content=content, input_tokens=input_tokens, output_tokens=output_tokens,
                 delay_s=delay_s, expect_model=expect_model, check=check, usage=usage,
                 finish_reason=finish_reason, model=model, hold=hold, stream_cut=stream_cut)


def call(name: str, arguments: dict | str | None = None, id: str | None = None,  # noqa: A002
         *, raw: bool = False, omit_id: bool = False) -> dict:
    """One tool call. Dotted names are sent as API names unless `raw`; str arguments verbatim."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    entry: dict[str, Any] = {"type": "function",
                             "function": {"name": name if raw else to_api_name(name),
                                          "arguments": args}}
    if not omit_id:
        entry["id"] = id or f"call_{uuid.uuid4().hex[:24]}"
    return entry


def tool_calls(*calls: dict, content: str = "", input_tokens: int = 10, output_tokens: int = 5,
               delay_s: float = 0.0, expect_model: str | None = None,
               check: Callable[[dict], Any] | None = None, usage: bool = True,
               model: str | None = None, hold: threading.Event | None = None) -> Reply:
    """A reply asking for tool calls; `hold`: sent only once that event is set."""
    return Reply(content=content, tool_calls=list(calls), finish_reason="tool_calls",
                 input_tokens=input_tokens, output_tokens=output_tokens, delay_s=delay_s,
                 expect_model=expect_model, check=check, usage=usage, model=model, hold=hold)


def function_call(name: str, arguments: dict | str | None = None, *, content: str = "",
                  raw: bool = False, **options: Any) -> Reply:
    """The legacy `function_call` answer (no `tool_calls`)."""
    legacy = call(name, arguments, raw=raw, omit_id=True)["function"]
    return Reply(content=content, function_call=legacy, finish_reason="function_call", **options)


def error(status: int, message: str = "scripted error", headers: dict[str, str] | None = None,
          delay_s: float = 0.0, *, expect_model: str | None = None,
          check: Callable[[dict], Any] | None = None) -> Reply:
    return Reply(kind="error", status=status, content=message, headers=dict(headers or {}),
                 delay_s=delay_s, expect_model=expect_model, check=check)


def hang(seconds: float) -> Reply:
    """Sleep `seconds`, then answer 200 with a text: for client-timeout tests."""
    return Reply(kind="hang", delay_s=seconds, content=HANG_REPLY_TEXT)


def passes() -> Reply:
    """In a storm: this request is answered as if there were no storm (a partial outage)."""
    return Reply(kind="pass")


def held(reply: Reply, gate: threading.Event) -> Reply:
    """`reply`, sent only once `gate` is set (see `Reply.hold`): any kind of reply."""
    reply.hold = gate
    return reply


def react_responder(tool_name: str = "math.evaluate", arguments: dict | None = None,
                    tool_turns: int = 1, final_text: str = "The answer is 42.") -> Responder:
    """`tool_turns` tool-call replies (counted from the assistant tool calls already in the
    request), then a text reply."""
    arguments = {"expression": "6*7"} if arguments is None else arguments

    def respond(request: dict) -> Reply:
        done = sum(1 for m in request.get("messages") or ()
                   if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls"))
        if done < tool_turns:
            return tool_calls(call(tool_name, arguments))
        return text(final_text)
    return respond


def embedding_vector(text_: str) -> list[float]:
    """The deterministic unit vector the server returns for `text_`."""
    digest = hashlib.sha256(text_.encode("utf-8", "surrogatepass")).digest()
    values = [int.from_bytes(digest[2 * i:2 * i + 2], "big") / 32767.5 - 1.0
              for i in range(EMBEDDING_DIM)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def _script_key(texts: Any) -> str | None:
    for item in texts:
        match = SCRIPT_KEY_RE.search(item)
        if match:
            return match.group(1)
    return None


def _error_body(message: str, status: int) -> dict:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}


def _encode_stream(payload: dict, cut: bool) -> bytes:
    """A chat completion as OpenAI's streamed chunks (server-sent events), then the usage
    chunk and [DONE]; the connection closes after it (no Content-Length)."""
    base = {"id": payload["id"], "object": "chat.completion.chunk",
            "created": payload["created"], "model": payload["model"]}
    choice = payload["choices"][0]
    message = choice["message"]
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"},
                                    "finish_reason": None}]}]
    words = re.findall(r"\S+\s*|\s+", message.get("content") or "")
    for word in words:
        chunks.append({**base, "choices": [{"index": 0, "delta": {"content": word},
                                            "finish_reason": None}]})
    for i, call in enumerate(message.get("tool_calls") or []):
        chunks.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, **call}]}, "finish_reason": None}]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {},
                                        "finish_reason": choice["finish_reason"]}]})
    if payload.get("usage"):
        chunks.append({**base, "choices": [], "usage": payload["usage"]})
    if cut:
        chunks = chunks[:max(1, (len(words) + 1) // 2)]
    body = "".join(f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks)
    if not cut:
        body += "data: [DONE]\n\n"
    head = ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            "Cache-Control: no-cache\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body.encode()


HOLD_KEEPALIVE_S = 1.0
"""How often a held response sends a blank while it waits: well under any client's read
timeout (the tests' AGENTQ_LLM_TIMEOUT_S is 5)."""
HOLD_POLL_S = 0.05
HOLD_MAX_S = 600.0
"""The most a reply is held: a test that failed before letting it go frees the connection."""


async def _send_when_let_go(writer: asyncio.StreamWriter, response: bytes,
                            hold: threading.Event, streamed: bool,
                            keepalive_s: float = HOLD_KEEPALIVE_S,
                            gone: Callable[[], bool] | None = None) -> bool:
    """Send a held response: its head at once (its body then ends with the connection: no
    Content-Length), a blank every `keepalive_s` until `hold` is set, then the body. A
    client that went away meanwhile spent the reply, as with any reply a client drops:
    True then (`gone()` says whether the client closed its side)."""
    head, _, body = response.partition(b"\r\n\r\n")
    head = b"\r\n".join(line for line in head.split(b"\r\n")
                         if not line.lower().startswith((b"content-length:", b"connection:")))
    blank = b": held\n\n" if streamed else b" "  # an SSE comment; JSON's leading whitespace
    try:
        writer.write(head + b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        since = last = time.monotonic()
        while not hold.is_set() and time.monotonic() - since < HOLD_MAX_S:
            await asyncio.sleep(HOLD_POLL_S)
            if gone is not None and gone():
                return True
            if time.monotonic() - last >= keepalive_s:
                last = time.monotonic()
                writer.write(blank)
                await writer.drain()
        writer.write(body)
        await writer.drain()
    except ConnectionError:
        return True
    return False


def _encode(status: int, payload: dict, headers: dict[str, str], keep_alive: bool) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head = (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n{extra}\r\n")
    return head.encode("latin-1") + body


class ScriptedLLM:
    def __init__(self, latency_s: float = 0.0, responder: Responder | None = None, *,
                 host: str = "127.0.0.1", port: int = 0,
                 hold_keepalive_s: float = HOLD_KEEPALIVE_S):
        self.latency_s = latency_s
        self.hold_keepalive_s = hold_keepalive_s
        self.responder = responder
        self.host, self.port = host, port
        self.unexpected: list[dict] = []
        """Requests nothing answered: {"key", "reason", "request"}."""
        self.check_failures: list[dict] = []
        """{"key", "index", "problem"}: failed checks, wrong models, server errors."""
        self.calls = 0
        self.embedding_calls = 0
        self.abandoned = 0
        """Held replies whose client went away (closed the connection) before they were
        let go: a call the client aborted."""
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._scripts: dict[str, collections.deque[Reply]] = {}
        self._served: collections.Counter[str] = collections.Counter()
        self._requests: list[tuple[str | None, dict]] = []
        self.authorizations: collections.Counter[str | None] = collections.Counter()
        """The Authorization headers requests came with (what key a client sent)."""
        self._ids = itertools.count(1)
        self._first_t: float | None = None
        self._last_t: float | None = None
        self._cpu_start_s = time.process_time()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncio.Task] = set()
        self._storms: dict[str | None, tuple["itertools.cycle[Reply]",
                                              Callable[[dict], bool] | None]] = {}
        self.storm_served: collections.Counter[str | None] = collections.Counter()
        """Requests answered by a storm, per script key (None: a storm on every key)."""

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> "ScriptedLLM":
        if self._thread is not None:
            raise RuntimeError("ScriptedLLM already started")
        ready = threading.Event()
        failures: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failures),
                                        name="scripted-llm", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S):
            raise RuntimeError("ScriptedLLM did not start")
        if failures:
            self._thread.join()
            self._thread = None
            raise failures[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        self._thread = None

    def __enter__(self) -> "ScriptedLLM":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, ready: threading.Event, failures: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(asyncio.start_server(
                self._handle, self.host, self.port, backlog=LISTEN_BACKLOG,
                limit=HEADER_MAX_BYTES))
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            failures.append(exc)
            loop.close()
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._shutdown())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    # --- scripts and records -------------------------------------------------------------

    def script(self, key: str, replies: list[Reply]) -> str:
        """Queue `replies` for requests carrying `script:<key>`; returns that marker."""
        if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
            raise ValueError(f"script key {key!r} must match [A-Za-z0-9_-]+")
        if not all(isinstance(r, Reply) for r in replies):
            raise TypeError("replies must be built with text(), tool_calls(), error(), ...")
        with self._lock:
            self._scripts.setdefault(key, collections.deque()).extend(replies)
        return f"script:{key}"

    def storm(self, key: str | None, replies: list[Reply],
              when: Callable[[dict], bool] | None = None) -> None:
        """Until `calm(key)`, answer every chat request for `key` (every request when None)
        with the next of `replies` (errors, hangs), in a cycle; no script is consumed.
        `when(request)`, if given, picks the requests the storm hits (e.g. later turns)."""
        if not replies or not all(isinstance(r, Reply) for r in replies):
            raise TypeError("a storm needs replies built with error(), hang(), ...")
        with self._lock:
            self._storms[key] = (itertools.cycle(list(replies)), when)

    def calm(self, key: str | None = None) -> None:
        """End the storm on `key`: the provider answers again."""
        with self._lock:
            self._storms.pop(key, None)

    def _storm_reply(self, key: str | None, request: dict) -> tuple[Reply | None, str | None]:
        with self._lock:
            for which in (key, None):
                if which in self._storms:
                    replies, when = self._storms[which]
                    if when is not None and not when(request):
                        continue
                    self.storm_served[which] += 1
                    return next(replies), which
        return None, None

    def requests(self, key: str | None = None) -> list[dict]:
        """The chat request bodies received for `key` (all of them when None), in order."""
        with self._lock:
            return [body for k, body in self._requests if key is None or k == key]

    def assert_done(self, key: str | None = None) -> None:
        """Fail when replies were left unused, a request went unanswered or a check failed."""
        with self._lock:
            leftovers = {k: [r.describe() for r in q] for k, q in self._scripts.items()
                         if q and (key is None or k == key)}
            unexpected = [u for u in self.unexpected if key is None or u["key"] == key]
            failures = [f for f in self.check_failures if key is None or f["key"] == key]
        problems = [f"script {k!r} has unused replies {v}" for k, v in leftovers.items()]
        problems += [f"unexpected request (key={u['key']!r}): {u['reason']}" for u in unexpected]
        problems += [f"script {f['key']!r} reply #{f['index']}: {f['problem']}" for f in failures]
        if problems:
            raise AssertionError("ScriptedLLM: " + "; ".join(problems))

    def stats(self) -> dict[str, Any]:
        """Counters and the chat request rate between the first request and the last answer.
        `process_cpu_s` is this process's CPU time: the server's own only when standalone."""
        first, last = self._first_t, self._last_t
        elapsed = (last - first) if first is not None and last is not None else 0.0
        return {"calls": self.calls, "embedding_calls": self.embedding_calls,
                "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                "unexpected": len(self.unexpected), "elapsed_s": round(elapsed, 3),
                "requests_per_s": round(self.calls / elapsed, 1) if elapsed > 0 else 0.0,
                "process_cpu_s": round(time.process_time() - self._cpu_start_s, 3)}

    def reset_stats(self) -> None:
        self.calls = self.embedding_calls = self.max_in_flight = 0
        self._first_t = self._last_t = None
        self._cpu_start_s = time.process_time()

    def _take(self, key: str | None) -> tuple[Reply | None, int]:
        with self._lock:
            queue = self._scripts.get(key) if key is not None else None
            if not queue:
                return None, -1
            index = self._served[key]
            self._served[key] += 1
            return queue.popleft(), index

    def _record_failure(self, key: str | None, index: int, problem: str) -> None:
        with self._lock:
            self.check_failures.append({"key": key, "index": index, "problem": problem})

    def _run_checks(self, key: str | None, index: int, reply: Reply, request: dict) -> None:
        if reply.expect_model is not None and request.get("model") != reply.expect_model:
            self._record_failure(key, index, f"expected model {reply.expect_model!r}, "
                                             f"got {request.get('model')!r}")
        if reply.check is not None:
            try:
                reply.check(request)
            except AssertionError as exc:
                self._record_failure(key, index, f"check failed: {exc}")
            except Exception as exc:  # noqa: BLE001 - recorded, never raised in the server
                self._record_failure(key, index, f"check raised {type(exc).__name__}: {exc}")

    # --- HTTP ----------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    break
                lines = head[:-4].decode("latin-1").split("\r\n")
                method, target, version = (lines[0].split(" ", 2) + ["", ""])[:3]
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                with self._lock:
                    self.authorizations[headers.get("authorization")] += 1
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    body = await self._read_chunked(reader)
                else:
                    body = await reader.readexactly(int(headers.get("content-length") or 0))
                connection = headers.get("connection", "").lower()
                keep_alive = (connection != "close" if version == "HTTP/1.1"
                              else connection == "keep-alive")
                status, payload, extra = await self._route(method, target.split("?", 1)[0], body)
                if writer.is_closing():
                    break
                streamed = payload.pop("_stream", None) if isinstance(payload, dict) else None
                hold = payload.pop("_hold", None) if isinstance(payload, dict) else None
                if streamed is not None:
                    data = _encode_stream(payload, streamed["cut"])
                else:
                    data = _encode(status, payload, extra, keep_alive and hold is None)
                if hold is not None:  # its body ends with the connection
                    if await _send_when_let_go(writer, data, hold, streamed is not None,
                                               self.hold_keepalive_s, reader.at_eof):
                        with self._lock:
                            self.abandoned += 1
                    break
                writer.write(data)
                await writer.drain()
                if streamed is not None or not keep_alive:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await reader.readexactly(size + 2))
            parts[-1] = parts[-1][:-2]

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, dict, dict]:
        path = path[3:] if path.startswith("/v1/") else path
        try:
            if method == "GET" and path == "/models":
                return 200, {"object": "list", "data": [
                    {"id": "scripted", "object": "model", "created": 0, "owned_by": "tests"}]}, {}
            if method == "GET" and path == "/stats":
                return 200, self.stats(), {}
            if method == "POST" and path in ("/chat/completions", "/embeddings"):
                try:
                    request = json.loads(body or b"{}")
                except ValueError:
                    return 400, _error_body("the request body is not JSON", 400), {}
                if path == "/embeddings":
                    return await self._embeddings(request)
                return await self._chat(request)
            return 404, _error_body(f"no route {method} {path}", 404), {}
        except Exception as exc:  # noqa: BLE001 - a bug here must show in assert_done
            self._record_failure(None, -1, f"server error {type(exc).__name__}: {exc}")
            return 500, _error_body(f"scripted server error: {exc}", 500), {}

    @contextlib.contextmanager
    def _in_flight(self):
        """Counts one chat request: calls, the requests waiting at once, the request rate."""
        if self._first_t is None:
            self._first_t = time.perf_counter()
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1
            self._last_t = time.perf_counter()

    async def _chat(self, request: dict) -> tuple[int, dict, dict]:
        with self._in_flight():
            messages = request.get("messages") or []
            key = _script_key(_content_text(m.get("content")) for m in messages
                              if isinstance(m, dict))
            with self._lock:
                self._requests.append((key, request))
            stormy, _which = self._storm_reply(key, request)
            if stormy is not None and stormy.kind != "pass":
                if stormy.delay_s > 0:
                    await asyncio.sleep(stormy.delay_s)
                if stormy.kind == "error":
                    return (stormy.status, _error_body(stormy.content or "", stormy.status),
                            stormy.headers)
                return 200, self._completion(stormy, request.get("model") or "scripted"), {}
            reply, index = self._take(key)
            if reply is None and self.responder is not None:
                reply = self.responder(request)
            if reply is None:
                reason = ("no script:<key> marker" if key is None
                          else f"no script {key!r}" if key not in self._scripts
                          else f"script {key!r} is used up")
                with self._lock:
                    self.unexpected.append({"key": key, "reason": reason, "request": request})
                return 500, _error_body(f"ScriptedLLM: unexpected request: {reason}", 500), {}
            self._run_checks(key, index, reply, request)
            delay_s = self.latency_s + reply.delay_s
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if reply.kind == "error":
                body = _error_body(reply.content or "", reply.status)
                status = reply.status
            else:
                body, status = self._completion(reply, request.get("model") or "scripted"), 200
                if request.get("stream"):
                    body["_stream"] = {"cut": reply.stream_cut}
            if reply.hold is not None:  # the connection sends it once the hold is let go
                body["_hold"] = reply.hold
            return status, body, reply.headers

    def _completion(self, reply: Reply, model: str) -> dict:
        has_calls = bool(reply.tool_calls or reply.function_call)
        message: dict[str, Any] = {"role": "assistant",
                                   "content": None if has_calls and not reply.content
                                   else reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        if reply.function_call:
            message["function_call"] = reply.function_call
        body: dict[str, Any] = {
            "id": f"chatcmpl-scripted-{next(self._ids)}", "object": "chat.completion",
            "created": int(time.time()), "model": reply.model or model,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        }
        if reply.usage:
            body["usage"] = {"prompt_tokens": reply.input_tokens,
                             "completion_tokens": reply.output_tokens,
                             "total_tokens": reply.input_tokens + reply.output_tokens}
        return body

    async def _embeddings(self, request: dict) -> tuple[int, dict, dict]:
        """A vector per input; a `script:<key>` in the input may take an error() or hang()."""
        self.embedding_calls += 1
        raw = request.get("input")
        inputs = [raw] if isinstance(raw, str) else [str(i) for i in raw or []]
        key = _script_key(inputs)
        reply, index = self._take(key) if key is not None else (None, -1)
        if reply is not None:
            self._run_checks(key, index, reply, request)
            if reply.delay_s > 0:
                await asyncio.sleep(reply.delay_s)
            if reply.kind == "error":
                return reply.status, _error_body(reply.content or "", reply.status), reply.headers
        data = []
        for i, item in enumerate(inputs):
            vector: Any = embedding_vector(item)
            if request.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(math.ceil(len(i) / 4) for i in inputs)
        return 200, {"object": "list", "data": data, "model": request.get("model") or "scripted",
                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, {}


def _raise_open_files_limit() -> None:
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A scripted OpenAI-compatible server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds added to each chat reply")
    parser.add_argument("--responder", choices=("react", "text", "none"), default="react")
    parser.add_argument("--tool-name", default="math.evaluate")
    parser.add_argument("--tool-turns", type=int, default=1)
    parser.add_argument("--stats-interval", type=float, default=0.0,
                        help="print stats to stderr every N seconds (0: only on SIGUSR1 and exit)")
    args = parser.parse_args(argv)
    responder = {"react": lambda: react_responder(args.tool_name, tool_turns=args.tool_turns),
                 "text": lambda: (lambda request: text("ok")),
                 "none": lambda: None}[args.responder]()
    _raise_open_files_limit()
    llm = ScriptedLLM(args.latency, responder, host=args.host, port=args.port).start()
    print(llm.base_url, flush=True)

    def print_stats(*_: object) -> None:
        print(json.dumps(llm.stats()), file=sys.stderr, flush=True)

    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, print_stats)
    while not done.wait(args.stats_interval or 1.0):
        if args.stats_interval:
            print_stats()
    llm.stop()
    print_stats()


if __name__ == "__main__":
    main()
