"""A scripted OpenAI-compatible HTTP server for tests and benchmarks (agentq's and yours:
docs/testing.md). The model a real stack's workers talk to through the `openai` SDK.

It serves from a background thread (agentq.testing.scripted_http: asyncio, keep-alive,
thousands of concurrent connections at next to no cost, so the server is never what a
benchmark measures); this module says what each request is answered.

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
import itertools
import json
import math
import re
import signal
import struct
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal, NotRequired, TypedDict

from agentq.llm.names import to_api_name
from agentq.testing.scripted_http import HOLD_KEEPALIVE_S, HTTPServer, Request, Response

SCRIPT_KEY_RE = re.compile(r"script:([A-Za-z0-9_-]+)")
EMBEDDING_DIM = 16
HANG_REPLY_TEXT = "(a late answer)"

RequestBody = dict[str, Any]
"""A request's JSON body, as the client sent it."""
Responder = Callable[[RequestBody], "Reply"]
Check = Callable[[RequestBody], Any]
"""Asserts on a request: an AssertionError (or any exception) is recorded as a failure."""


class FunctionCall(TypedDict):
    name: str
    arguments: str
    """JSON, or any string a test sends verbatim."""


class ToolCall(TypedDict):
    type: str
    function: FunctionCall
    id: NotRequired[str]


class Unexpected(TypedDict):
    """A request nothing answered."""
    key: str | None
    reason: str
    request: RequestBody


class CheckFailure(TypedDict):
    """A failed check, a wrong model or a server error (index -1: no reply of a script)."""
    key: str | None
    index: int
    problem: str


@dataclass
class Reply:
    """One scripted answer; build it with text(), tool_calls(), function_call(), error(), hang()."""
    kind: Literal["message", "error", "hang", "pass"] = "message"
    content: str | None = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    function_call: FunctionCall | None = None
    finish_reason: str = "stop"
    input_tokens: int = 10
    output_tokens: int = 5
    usage: bool = True
    model: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    expect_model: str | None = None
    check: Check | None = None
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
        if self.tool_calls:
            return "tool_calls(" + ", ".join(c["function"]["name"] for c in self.tool_calls) + ")"
        if self.function_call:
            return f"tool_calls({self.function_call['name']})"
        return f"text({(self.content or '')[:30]!r})"


def text(content: str, *, input_tokens: int = 10, output_tokens: int = 5, delay_s: float = 0.0,
         expect_model: str | None = None, check: Check | None = None,
         usage: bool = True, finish_reason: str = "stop", model: str | None = None,
         hold: threading.Event | None = None, stream_cut: bool = False) -> Reply:
    """A plain answer. `model` overrides the echoed request model; `usage=False` omits usage;
    `hold`: sent only once that event is set. A request with `stream: true` gets it as
    server-sent chunks, a word a chunk (cut halfway with `stream_cut`)."""
    return Reply(content=content, input_tokens=input_tokens, output_tokens=output_tokens,
                 delay_s=delay_s, expect_model=expect_model, check=check, usage=usage,
                 finish_reason=finish_reason, model=model, hold=hold, stream_cut=stream_cut)


def call(name: str, arguments: dict[str, Any] | str | None = None,
         id: str | None = None,  # noqa: A002
         *, raw: bool = False, omit_id: bool = False) -> ToolCall:
    """One tool call. Dotted names are sent as API names unless `raw`; str arguments verbatim."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    entry: ToolCall = {"type": "function",
                       "function": {"name": name if raw else to_api_name(name), "arguments": args}}
    if not omit_id:
        entry["id"] = id or f"call_{uuid.uuid4().hex[:24]}"
    return entry


def tool_calls(*calls: ToolCall, content: str = "", input_tokens: int = 10, output_tokens: int = 5,
               delay_s: float = 0.0, expect_model: str | None = None,
               check: Check | None = None, usage: bool = True,
               model: str | None = None, hold: threading.Event | None = None) -> Reply:
    """A reply asking for tool calls; `hold`: sent only once that event is set."""
    return Reply(content=content, tool_calls=list(calls), finish_reason="tool_calls",
                 input_tokens=input_tokens, output_tokens=output_tokens, delay_s=delay_s,
                 expect_model=expect_model, check=check, usage=usage, model=model, hold=hold)


def function_call(name: str, arguments: dict[str, Any] | str | None = None, *, content: str = "",
                  raw: bool = False, **options: Any) -> Reply:
    """The legacy `function_call` answer (no `tool_calls`)."""
    legacy = call(name, arguments, raw=raw, omit_id=True)["function"]
    return Reply(content=content, function_call=legacy, finish_reason="function_call", **options)


def error(status: int, message: str = "scripted error", headers: dict[str, str] | None = None,
          delay_s: float = 0.0, *, expect_model: str | None = None,
          check: Check | None = None) -> Reply:
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


def react_responder(tool_name: str = "math.evaluate", arguments: dict[str, Any] | None = None,
                    tool_turns: int = 1, final_text: str = "The answer is 42.") -> Responder:
    """`tool_turns` tool-call replies (counted from the assistant tool calls already in the
    request), then a text reply."""
    arguments = {"expression": "6*7"} if arguments is None else arguments

    def respond(request: RequestBody) -> Reply:
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


def _script_key(texts: Iterable[str]) -> str | None:
    for item in texts:
        match = SCRIPT_KEY_RE.search(item)
        if match:
            return match.group(1)
    return None


def _error_body(message: str, status: int) -> dict[str, Any]:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}

class ScriptedLLM:
    def __init__(self, latency_s: float = 0.0, responder: Responder | None = None, *,
                 host: str = "127.0.0.1", port: int = 0,
                 hold_keepalive_s: float = HOLD_KEEPALIVE_S):
        self.latency_s = latency_s
        self.responder = responder
        self.http = HTTPServer(self._route, host, port, hold_keepalive_s)
        """The HTTP side: its connections, and the held replies its clients abandoned."""
        self.unexpected: list[Unexpected] = []
        self.check_failures: list[CheckFailure] = []
        self.calls = 0
        self.embedding_calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._scripts: dict[str, collections.deque[Reply]] = {}
        self._served: collections.Counter[str] = collections.Counter()
        self._requests: list[tuple[str | None, RequestBody]] = []
        self.authorizations: collections.Counter[str | None] = collections.Counter()
        """The Authorization headers requests came with (what key a client sent)."""
        self._ids = itertools.count(1)
        self._first_t: float | None = None
        self._last_t: float | None = None
        self._cpu_start_s = time.process_time()
        self._storms: dict[str | None, tuple[itertools.cycle[Reply],
                                             Callable[[RequestBody], bool] | None]] = {}
        self.storm_served: collections.Counter[str | None] = collections.Counter()
        """Requests answered by a storm, per script key (None: a storm on every key)."""

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self.http.host

    @property
    def port(self) -> int:
        """The port it listens on (once started, when it was asked for port 0)."""
        return self.http.port

    @property
    def abandoned(self) -> int:
        """Held replies whose client went away (closed the connection) before they were
        let go: a call the client aborted."""
        return self.http.abandoned

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> ScriptedLLM:
        self.http.start()
        return self

    def stop(self) -> None:
        self.http.stop()

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

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
              when: Callable[[RequestBody], bool] | None = None) -> None:
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

    def _storm_reply(self, key: str | None,
                     request: RequestBody) -> tuple[Reply | None, str | None]:
        with self._lock:
            for which in (key, None):
                if which in self._storms:
                    replies, when = self._storms[which]
                    if when is not None and not when(request):
                        continue
                    self.storm_served[which] += 1
                    return next(replies), which
        return None, None

    def requests(self, key: str | None = None) -> list[RequestBody]:
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
        if key is None:
            return None, -1
        with self._lock:
            queue = self._scripts.get(key)
            if not queue:
                return None, -1
            index = self._served[key]
            self._served[key] += 1
            return queue.popleft(), index

    def _record_failure(self, key: str | None, index: int, problem: str) -> None:
        with self._lock:
            self.check_failures.append({"key": key, "index": index, "problem": problem})

    def _run_checks(self, key: str | None, index: int, reply: Reply,
                    request: RequestBody) -> None:
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

    # --- answers -------------------------------------------------------------------------

    async def _route(self, request: Request) -> Response:
        with self._lock:
            self.authorizations[request.headers.get("authorization")] += 1
        method, path = request.method, request.path
        path = path[3:] if path.startswith("/v1/") else path
        try:
            if method == "GET" and path == "/models":
                return Response(200, {"object": "list", "data": [
                    {"id": "scripted", "object": "model", "created": 0, "owned_by": "tests"}]})
            if method == "GET" and path == "/stats":
                return Response(200, self.stats())
            if method == "POST" and path in ("/chat/completions", "/embeddings"):
                try:
                    body = json.loads(request.body or b"{}")
                except ValueError:
                    return Response(400, _error_body("the request body is not JSON", 400))
                if path == "/embeddings":
                    return await self._embeddings(body)
                return await self._chat(body)
            return Response(404, _error_body(f"no route {method} {path}", 404))
        except Exception as exc:  # noqa: BLE001 - a bug here must show in assert_done
            self._record_failure(None, -1, f"server error {type(exc).__name__}: {exc}")
            return Response(500, _error_body(f"scripted server error: {exc}", 500))

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
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

    async def _chat(self, request: RequestBody) -> Response:
        with self._in_flight():
            messages = request.get("messages") or []
            model = request.get("model") or "scripted"
            key = _script_key(_content_text(m.get("content")) for m in messages
                              if isinstance(m, dict))
            with self._lock:
                self._requests.append((key, request))
            stormy, _which = self._storm_reply(key, request)
            if stormy is not None and stormy.kind != "pass":
                if stormy.delay_s > 0:
                    await asyncio.sleep(stormy.delay_s)
                if stormy.kind == "error":
                    return Response(stormy.status,
                                    _error_body(stormy.content or "", stormy.status),
                                    stormy.headers)
                return Response(200, self._completion(stormy, model))
            reply, index = self._take(key)
            if reply is None and self.responder is not None:
                reply = self.responder(request)
            if reply is None:
                reason = ("no script:<key> marker" if key is None
                          else f"no script {key!r}" if key not in self._scripts
                          else f"script {key!r} is used up")
                with self._lock:
                    self.unexpected.append({"key": key, "reason": reason, "request": request})
                return Response(500, _error_body(f"ScriptedLLM: unexpected request: {reason}",
                                                 500))
            self._run_checks(key, index, reply, request)
            delay_s = self.latency_s + reply.delay_s
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            # a held reply: the connection sends it once the hold is let go
            if reply.kind == "error":
                return Response(reply.status, _error_body(reply.content or "", reply.status),
                                reply.headers, hold=reply.hold)
            return Response(200, self._completion(reply, model),
                            reply.headers, hold=reply.hold,
                            stream_cut=reply.stream_cut if request.get("stream") else None)

    def _completion(self, reply: Reply, model: str) -> dict[str, Any]:
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

    async def _embeddings(self, request: RequestBody) -> Response:
        """A vector per input; a `script:<key>` in the input may take an error() or hang()."""
        self.embedding_calls += 1
        raw = request.get("input")
        inputs = [raw] if isinstance(raw, str) else [str(i) for i in raw or []]
        key = _script_key(inputs)
        reply, index = self._take(key)
        if reply is not None:
            self._run_checks(key, index, reply, request)
            if reply.delay_s > 0:
                await asyncio.sleep(reply.delay_s)
            if reply.kind == "error":
                return Response(reply.status, _error_body(reply.content or "", reply.status),
                                reply.headers)
        data = []
        for i, item in enumerate(inputs):
            vector: Any = embedding_vector(item)
            if request.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(math.ceil(len(i) / 4) for i in inputs)
        return Response(200, {"object": "list", "data": data,
                              "model": request.get("model") or "scripted",
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


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
