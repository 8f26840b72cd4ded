"""A gate for a tool call, opened by the test: the `flaky.gated` tool (tests/support/testtools)
says through Redis that it has started, then blocks until the test opens its gate. A test
that acts while a tool runs (steers, interrupts, cancels) waits for `started()` and opens the
gate after acting, so the tool is still running when the test acts however slow the machine
(a tool that merely sleeps may have ended first). It is `hold=` (agentq/testing/scripted_llm.py)
for tools: the tool runs in a worker process, so the gate lives in the stack's Redis, not in
a threading.Event of the test's process."""
from __future__ import annotations

import time
import uuid

import redis

PREFIX = "agentq:test:tool-gate:"
TTL_S = 600
"""Gate keys expire: a run that dies leaves nothing behind in the database."""
MAX_HOLD_S = 300.0
"""The most a gated tool waits (the tool's time limit): a gate never opened (a test that
failed before its teardown) frees its worker thread at last."""
POLL_S = 0.02


def keys(name: str) -> tuple[str, str]:
    """(list of the tool_use_ids of the calls that started, key that says the gate is open)."""
    return f"{PREFIX}{name}:started", f"{PREFIX}{name}:open"


def wait_at_gate(client: redis.Redis, name: str, tool_use_id: str) -> float:
    """In the tool: tell the test this call started, then wait until it opens the gate.
    Returns the seconds waited."""
    started, opened = keys(name)
    since = time.monotonic()
    client.rpush(started, tool_use_id)
    client.expire(started, TTL_S)
    while not client.exists(opened):
        if time.monotonic() - since > MAX_HOLD_S:
            raise TimeoutError(f"gate {name} was never opened")
        time.sleep(POLL_S)
    return time.monotonic() - since


class ToolGate:
    """The test's side of one gate (`name` goes into the tool call's arguments)."""

    def __init__(self, redis_url: str, name: str | None = None):
        self.name = name or uuid.uuid4().hex
        self._redis = redis.Redis.from_url(redis_url)
        self._started, self._open = keys(self.name)

    def args(self) -> dict:
        """The arguments of a `flaky.gated` call that waits at this gate."""
        return {"gate": self.name}

    def started(self) -> list[str]:
        """The tool_use_ids of the calls that have started and reached the gate."""
        return [v.decode() for v in self._redis.lrange(self._started, 0, -1)]

    def wait_started(self, count: int = 1, timeout_s: float = 120) -> list[str]:
        """Until `count` calls wait at the gate (`timeout_s` is only reached when the test
        fails: a loaded machine is slow, not wrong)."""
        deadline = time.monotonic() + timeout_s
        while True:
            started = self.started()
            if len(started) >= count:
                return started
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} call(s) at gate {self.name} in {timeout_s} s; "
                                     f"started: {started}")
            time.sleep(POLL_S)

    def open(self) -> None:
        """Let every call at the gate, and every later one, go on."""
        self._redis.set(self._open, "1", ex=TTL_S)

    def close(self) -> None:
        """Open the gate (a test that failed must not leave a worker blocked), then let go."""
        try:
            self.open()
        finally:
            self._redis.close()
