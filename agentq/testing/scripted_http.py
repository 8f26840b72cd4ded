"""The scripted model's HTTP side (`agentq.testing.scripted_llm.ScriptedLLM`): an asyncio
HTTP/1.1 server in a background thread that reads each request, asks a route for its
`Response` and writes the bytes of it.

Thousands of concurrent connections, each waiting out an artificial latency with
`asyncio.sleep`, cost next to nothing, so the server is never what a benchmark measures.
Keep-alive; every response is one write (headers and body together) on a socket with
TCP_NODELAY, so no Nagle/delayed-ACK stalls. A streamed answer is OpenAI's server-sent
chat chunks; a held one begins at once and ends when its test lets it go.
"""
from __future__ import annotations

import asyncio
import http
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

LISTEN_BACKLOG = 4096
HEADER_MAX_BYTES = 64 * 1024
START_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
HOLD_KEEPALIVE_S = 1.0
"""How often a held response sends a blank while it waits: well under any client's read
timeout (the tests' AGENTQ_LLM_TIMEOUT_S is 5)."""
HOLD_POLL_S = 0.05
HOLD_MAX_S = 600.0
"""The most a reply is held: a test that failed before letting it go frees the connection."""


@dataclass
class Request:
    method: str
    path: str
    """The target without its query string."""
    headers: dict[str, str]
    """By lower-case name."""
    body: bytes


@dataclass
class Response:
    status: int
    payload: dict[str, Any]
    """The JSON body (a chat completion when streamed)."""
    headers: dict[str, str] = field(default_factory=dict)
    stream_cut: bool | None = None
    """None: a JSON body; else the completion as streamed chunks, cut halfway when True."""
    hold: threading.Event | None = None
    """Sent only once this is set (see `send_when_let_go`)."""


Route = Callable[[Request], Awaitable[Response]]


def encode_json(status: int, payload: dict[str, Any], headers: dict[str, str],
                keep_alive: bool) -> bytes:
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


def encode_stream(payload: dict[str, Any], cut: bool) -> bytes:
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


async def send_when_let_go(writer: asyncio.StreamWriter, response: bytes,
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


class HTTPServer:
    """Serves `route` on `host`:`port` (0: a free port, set once started) from a thread of
    its own. `connections_opened` counts the connections clients made; `abandoned` the
    held responses whose client went away before they were let go."""

    def __init__(self, route: Route, host: str = "127.0.0.1", port: int = 0,
                 hold_keepalive_s: float = HOLD_KEEPALIVE_S):
        self.route = route
        self.host, self.port = host, port
        self.hold_keepalive_s = hold_keepalive_s
        self.connections_opened = 0
        self.abandoned = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the server is started already")
        ready = threading.Event()
        failures: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failures),
                                        name="scripted-llm", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the server did not start")
        if failures:
            self._thread.join()
            self._thread = None
            raise failures[0]

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        self._thread = None

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

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        with self._lock:
            self.connections_opened += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        try:
            while await self._answer_one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _answer_one(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> bool:
        """Read one request and write its response; whether the connection stays open."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return False
        lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, version = (lines[0].split(" ", 2) + ["", ""])[:3]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(reader)
        else:
            body = await reader.readexactly(int(headers.get("content-length") or 0))
        connection = headers.get("connection", "").lower()
        keep_alive = (connection != "close" if version == "HTTP/1.1"
                      else connection == "keep-alive")
        response = await self.route(Request(method, target.split("?", 1)[0], headers, body))
        if writer.is_closing():
            return False
        streamed = response.stream_cut is not None
        if response.stream_cut is not None:
            data = encode_stream(response.payload, response.stream_cut)
        else:
            data = encode_json(response.status, response.payload, response.headers,
                               keep_alive and response.hold is None)
        if response.hold is not None:  # its body ends with the connection
            if await send_when_let_go(writer, data, response.hold, streamed,
                                      self.hold_keepalive_s, reader.at_eof):
                with self._lock:
                    self.abandoned += 1
            return False
        writer.write(data)
        await writer.drain()
        return keep_alive and not streamed


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size + 2))
        parts[-1] = parts[-1][:-2]
