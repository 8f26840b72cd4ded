"""A node cut off from the broker and Postgres, and back (issue 35): a second node (an
orchestrator and a tools worker in a network namespace of their own, reaching the lab's
Postgres, broker and model server over a veth pair: benchmarks/netns.py) loses its link for
AGENTQ_FAULT_CUT_S (60 s) while jobs flow, then gets it back.

While it is away its packets go nowhere and nothing tells it so (the link is down at the
host's end, as a switch port that died): the steps it held stop advancing, their leases run
out, and the sweeper re-drives their jobs to the host's orchestrator. Back, its connections
carry on from where they stood and its late writes must lose to the worker that took over.
run_fault asserts every job completed once, no duplicate message, tool result, event, token
log or webhook event, no tool run twice, no 5xx; the test, that while the node was away jobs
were re-driven and jobs completed. The cut comes while the node runs steps (its orchestrator
says so through the broker). Then the node alone (the host's orchestrator
and tools worker stopped) completes jobs: it is back in the cluster.

The namespace, the veth pair, the bridge and the node's cgroup are removed after the test,
whatever happens (FaultLab.stop, and an exit hook). Root only: elsewhere the test says so
and is skipped (benchmarks.netns.available)."""
from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from benchmarks import netns

CUT_S = float(os.environ.get("AGENTQ_FAULT_CUT_S", "60"))
"""seven step deadlines of the lab (8 s) and two RabbitMQ heartbeats (30 s)"""
BUSY_TIMEOUT_S = 120
"""How long the cut waits for the node to run a step (the jobs flow for about 5 s)."""

pytestmark = pytest.mark.skipif(netns.available() is not None,
                                reason=f"nodes cannot be made here: {netns.available()}")


@pytest.fixture(scope="module")
def node_lab(servers_up):
    """A fault lab on the suite's broker (AGENTQ_FAULT_BROKER) with one node beside the
    host's processes."""
    from tests.support.fault_lab import BROKER, started_lab
    yield from started_lab(BROKER, nodes=1)


@pytest.fixture
def run_on_node_lab(node_lab):
    from tests.support.fault_lab import make_runner
    return make_runner(node_lab)


def test_a_node_cut_off_for_a_minute_loses_and_doubles_nothing(run_on_node_lab, node_lab):
    node = node_lab.nodes[0]
    node_stack = node_lab.node_stacks[0]
    pg_port, node_pids = node_lab.pg.port, {n: p.pid for n, p in node_stack.procs.items()}
    ask = _inspector(node_lab, f"{node.name}-orchestrator@{socket.gethostname()}")
    seen: dict = {}

    def cut_then_restore(lab):
        # the node is cut while it runs steps: the jobs flow until its orchestrator says so
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while not (active := ask()):
            if time.monotonic() > deadline:
                seen["node_steps_at_cut"] = 0  # never busy, never cut: asserted below
                return
            time.sleep(0.05)
        node.cut()
        seen["node_steps_at_cut"] = len(active)
        seen["before"] = _counts(lab)
        try:
            # it really is cut off: nothing on the host answers it
            seen["reached_while_cut"] = node.reaches(pg_port)
            time.sleep(CUT_S)
            seen["while_cut"] = _counts(lab)
        finally:
            node.restore()
        seen["reached_after"] = node.reaches(pg_port)

    outcome = run_on_node_lab(f"node_cut_{int(CUT_S)}s", cut_then_restore)
    seen["after"] = _counts(node_lab)
    print({"node": seen})
    assert seen["node_steps_at_cut"] > 0, seen
    assert seen["reached_while_cut"] is False and seen["reached_after"] is True, seen
    # while it was away the host carried on: the steps it held were re-driven (their leases
    # ran out) and jobs completed
    assert seen["while_cut"]["redriven"] > seen["before"]["redriven"], seen
    assert seen["while_cut"]["completed"] > seen["before"]["completed"], seen
    # run_on_node_lab: every job completed, once; nothing written twice; no 5xx
    assert outcome.statuses == {"completed": outcome.jobs}
    assert outcome.duplicates.get("non_idempotent_tool_runs") == 0, outcome.as_dict()
    # the node's processes lived through it (the same processes: none died and came back)
    assert {n: p.pid for n, p in node_stack.procs.items()} == node_pids
    assert all(p.poll() is None for p in node_stack.procs.values())

    # and it is back in the cluster: with the host's orchestrator and tools worker stopped,
    # the node alone takes and completes new jobs
    host = node_lab.stack
    for name in ("orchestrator", "tools"):
        os.killpg(host.procs[name].pid, signal.SIGTERM)
        host.procs[name].wait(timeout=60)
    try:
        from benchmarks.faults import run_scenario
        from tests.support.fault_lab import DRAIN_TIMEOUT_S
        alone = run_scenario(node_lab, "node_alone_after_the_cut", None, 10, 10,
                             DRAIN_TIMEOUT_S)
        print(alone.as_dict())
        assert alone.statuses == {"completed": 10}, alone.as_dict()
        assert not any(alone.duplicates.values()), alone.as_dict()
    finally:
        for name in ("orchestrator", "tools"):
            host.spawn(name)


def _inspector(lab, worker: str):
    """ask(): the tasks `worker` is running now, as it answers through the broker."""
    from agentq.config import Settings
    from tasks.app import make_celery
    app = make_celery(Settings.from_env(lab.stack.env))

    def ask() -> list:
        replies = app.control.inspect(destination=[worker], timeout=2.0).active() or {}
        return replies.get(worker) or []
    return ask


def _counts(lab) -> dict[str, int]:
    [(completed, redriven)] = lab.sql(
        "SELECT (SELECT COUNT(*) FROM jobs WHERE status = 'completed'), "
        "(SELECT COUNT(*) FROM job_events WHERE type = 'job_redriven')")
    return {"completed": completed, "redriven": redriven, "at": time.strftime("%H:%M:%S")}
