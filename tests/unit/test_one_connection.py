"""A step and a tool call hold at most one pooled database connection at any moment, on real
Postgres.

The in-flight benchmark (300 jobs submitted at once, the model taking 10 s) saw 270 of its
300 first steps fail with "QueuePool limit of size 10 overflow 20 reached": the
orchestrator's first look at the registered tool modules (`RemoteModules.known`, which reads
the `tool_modules` table in a session of its own) was made inside the step's transaction.
The first thread to look read the table; every other step, each holding its transaction's
connection, waited for that first reading; the reader waited for a connection, and all
thirty were held by the waiters. The reader gave up after the pool's 30 s (its view then
held no registered module), the waiters' own checkouts timed out, and their jobs sat
until the sweeper re-drove them five minutes later. A thread that needs two connections at
once can starve itself whenever the pool is shared by as many threads as it has
connections: the view is read before the transaction begins."""
from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import event

from agentq.db import engine_for
from agentq.loop import uow
from agentq.loop.step import Stepper
from agentq.runner import InProcessRunner
from agentq.testing.harness import calls, text
from agentq.tools.registry import ToolRegistry, discover
from agentq.tools.remote import RemoteModules, Store


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: the
    connections counted are Postgres's."""
    return make_pg


class Checkouts:
    """The most connections one thread held at once, from the pool's own events."""

    def __init__(self, engine):
        self._engine = engine
        self._lock = threading.Lock()
        self._held: Counter[int] = Counter()
        self._owner: dict[int, int] = {}
        self.most = 0

    def _out(self, _dbapi, record, _proxy) -> None:
        with self._lock:
            me = threading.get_ident()
            self._owner[id(record)] = me
            self._held[me] += 1
            self.most = max(self.most, self._held[me])

    def _in(self, _dbapi, record) -> None:
        with self._lock:
            owner = self._owner.pop(id(record), None)
            if owner is not None:
                self._held[owner] -= 1

    def __enter__(self) -> "Checkouts":
        self._engine.pool.dispose()  # none checked out before we listen
        event.listen(self._engine, "checkout", self._out)
        event.listen(self._engine, "checkin", self._in)
        return self

    def __exit__(self, *exc_info) -> None:
        event.remove(self._engine, "checkout", self._out)
        event.remove(self._engine, "checkin", self._in)


@pytest.fixture
def fresh_view(make):
    """A harness whose registry has never looked at the registered modules, as in a worker
    that has just started: the view is read from the `tool_modules` table at first use."""
    def factory(*replies):
        h = make(*replies)
        remote = RemoteModules(h.settings, store=Store(None))
        h.registry = ToolRegistry(h.settings, discover(), remote=remote)
        h.stepper = Stepper(h.settings, h.router, h.registry, h.sessions)
        h.runner = InProcessRunner(h.stepper, h.settings)
        uow.set_dispatcher(h.runner)
        return h, remote
    return factory


def test_a_one_tool_job_never_holds_two_connections_at_once(fresh_view):
    # given a worker's first job, its registry's view of the modules never read
    h, remote = fresh_view(calls(("math.evaluate", {"expression": "6*7"})), text("42"))
    job_id = h.submit("What is 6*7?")
    # when its steps and its tool call run
    with Checkouts(engine_for(h.settings)) as checkouts:
        h.drive(job_id)
    # then it completed, the view was read, and no thread ever held two connections
    assert h.job(job_id).status == "completed"
    assert remote._version != -1
    assert checkouts.most == 1
