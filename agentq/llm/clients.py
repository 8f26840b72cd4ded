"""The HTTP clients a process's model calls go through: one per group of threads.

One `openai.OpenAI` client holds one connection pool, and httpcore's pool walks every
connection it holds on each request and on each response's close, probing the socket of
each idle one, and keeps at most 100 idle: after a wave of 1,000 calls, 900 connections are
closed and the next wave opens them again. With 1,000 jobs in flight the orchestrator spent
29.1-29.6 ms of CPU per job on one client and 22.2-23.7 ms on 16 (`docs/benchmarks.md`, the
fifth pass). One pool also holds at most 1,000 connections (the SDK's limit), so more
threads than that would wait for one another.

So the calls are spread: the first `THREADS_PER_CLIENT` threads to call share the first
client, the next ones the second, and so on up to `clients` clients, then around again (a
gevent pool's greenlets are counted the same way, `threading.local` being theirs under
gevent). A thread keeps its client; a client is made on first use (about 19 ms: its TLS
context), so a web process with a few threads makes one.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import socket
import ssl
import threading
from typing import Any, Callable, Iterable

import httpcore2
import httpx2
import openai

from agentq.llm import cancel

THREADS_PER_CLIENT = 64


def clients_for(threads: int, per_client: int | None = None) -> int:
    """How many clients `threads` threads are spread over."""
    return max(1, math.ceil(threads / (per_client or THREADS_PER_CLIENT)))


class ClientShards:
    """Up to `clients` HTTP clients made by `make`, `per_client` threads to each."""

    def __init__(self, make: Callable[[], openai.OpenAI], clients: int,
                 per_client: int | None = None) -> None:
        self._make = make
        self._per_client = max(1, per_client or THREADS_PER_CLIENT)
        self._clients: list[openai.OpenAI | None] = [None] * max(1, clients)
        self._arrivals = itertools.count()  # next() is atomic under the GIL and gevent
        self._mine = threading.local()
        self._lock = threading.Lock()

    def client(self) -> openai.OpenAI:
        """This thread's client."""
        slot = getattr(self._mine, "slot", None)
        if slot is None:
            slot = self._mine.slot = (next(self._arrivals) // self._per_client
                                      % len(self._clients))
        client = self._clients[slot]
        if client is None:
            with self._lock:
                client = self._clients[slot]
                if client is None:
                    client = self._clients[slot] = self._make()
        return client

    def made(self) -> int:
        """How many clients have been made so far."""
        return sum(client is not None for client in self._clients)

    def close(self) -> None:
        """Close every client made; a later call makes its client again."""
        with self._lock:
            made, self._clients = self._clients, [None] * len(self._clients)
        for client in made:
            if client is not None:
                client.close()


# --- calls aborted on cancel ------------------------------------------------------------

class _AbortableStream(httpcore2.NetworkStream):
    """A connection whose reads and writes, made while a cancel token is current
    (`agentq.llm.cancel.cancellable`), end when the token is set: its socket is shut down,
    so the thread blocked on it wakes and the server sees the client go away."""

    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with self._abortable():
            return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with self._abortable():
            return self._inner.write(buffer, timeout)

    def _abortable(self) -> contextlib.AbstractContextManager[None]:
        """While the block runs, a set cancel token (if one is current) aborts this
        connection."""
        token = cancel.current()
        return token.aborting(self.abort) if token is not None else contextlib.nullcontext()

    def abort(self) -> None:
        sock = self._inner.get_extra_info("socket")
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        return _AbortableStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class AbortableBackend(httpcore2.NetworkBackend):
    """httpcore's blocking backend, its connections `_AbortableStream`s."""

    def __init__(self, inner: httpcore2.NetworkBackend | None = None) -> None:
        self._inner = inner or httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore2.NetworkStream:
        return _AbortableStream(self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address,
            socket_options=socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None
                            ) -> httpcore2.NetworkStream:
        return _AbortableStream(self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def abortable_http_client() -> httpx2.Client:
    """The SDK's default HTTP client (its connection limits, redirects followed), its
    connections abortable by a cancel (`agentq.llm.cancel`)."""
    transport = httpx2.HTTPTransport(limits=openai.DEFAULT_CONNECTION_LIMITS)
    pool = transport._pool  # httpx builds the pool; its network backend is httpcore's option
    if not isinstance(pool, httpcore2.ConnectionPool) or not hasattr(
            pool, "_network_backend"):
        raise RuntimeError("httpx's transport has changed: no connection pool to wrap")
    pool._network_backend = AbortableBackend(pool._network_backend)
    return openai.DefaultHttpxClient(transport=transport)
