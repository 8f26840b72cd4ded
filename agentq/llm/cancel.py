"""A model call that stops when its job is cancelled.

A step that calls the model holds a `CancelToken` (`agentq.loop.cancel_watch` sets it when
the job's cancel is recorded) and makes its calls inside `cancellable(token)`. The router
then checks the token before each attempt (retries and fallbacks alike), ends a backoff
early, and aborts the HTTP call in flight: the socket the call reads from is shut down
(`agentq.llm.clients.AbortableBackend`), so the model server sees the client go away and
the thread waiting for its answer wakes at once. The call then raises `CallCancelled`,
which is no provider failure: it is neither retried nor counted against the provider.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Callable, Iterator


class CallCancelled(Exception):
    """The job of this model call was cancelled: the call was not made, or was aborted."""


class CancelToken:
    """Set once, by another thread; what is registered with `aborting` runs when it is."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._aborts: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to `timeout_s`, or less when the token is set meanwhile."""
        return self._event.wait(timeout_s)

    def sleep(self, timeout_s: float) -> None:
        """`wait` as a retry's sleep (tenacity's), which returns nothing."""
        self._event.wait(timeout_s)

    def cancel(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            aborts = list(self._aborts)
        for abort in aborts:
            abort()

    def check(self) -> None:
        if self._event.is_set():
            raise CallCancelled("the job was cancelled")

    @contextlib.contextmanager
    def aborting(self, abort: Callable[[], None]) -> Iterator[None]:
        """Run `abort` if the token is set while the block runs (at once if it is set
        already)."""
        with self._lock:
            self._aborts.append(abort)
            already = self._event.is_set()
        if already:
            abort()
        try:
            yield
        finally:
            with self._lock:
                self._aborts.remove(abort)


_current: contextvars.ContextVar[CancelToken | None] = contextvars.ContextVar(
    "agentq_cancel_token", default=None)


def current() -> CancelToken | None:
    """The token of the model calls this thread (or greenlet) makes now, if any."""
    return _current.get()


@contextlib.contextmanager
def cancellable(token: CancelToken | None) -> Iterator[CancelToken | None]:
    """Model calls made in the block stop when `token` is set (None: they do not)."""
    reset = _current.set(token)
    try:
        yield token
    finally:
        _current.reset(reset)
