"""RabbitMQ as the broker (DESIGN 1.2), restarted under load: a private RabbitMQ node (its
own node name, ports, cookie and data: tests/support/services.py PrivateRabbitMQ; the
machine's RabbitMQ is never touched) is killed with jobs in flight and started again on the
same data. Durable quorum queues keep what they confirmed; every worker reconnects; every
job completes once, no tool runs twice, no 5xx but 503 (run_fault asserts all of it).

The rest of the fault suite runs on RabbitMQ with AGENTQ_FAULT_BROKER=amqp."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.stack import StackError


@pytest.fixture(scope="module")
def rabbit_lab(servers_up):
    """A fault lab whose broker is a private RabbitMQ node (the session's lab, when
    AGENTQ_FAULT_BROKER=amqp already made it so, is not reused: it may be on Redis)."""
    from benchmarks.faults import FaultLab
    scratch = Path(tempfile.mkdtemp(prefix="agentq-faults-amqp-"))
    lab = FaultLab(scratch, broker="amqp")
    try:
        lab.start()
    except StackError as exc:
        lab.stop()
        pytest.fail(str(exc))
    yield lab
    lab.stop()
    if os.environ.get("AGENTQ_FAULT_KEEP"):
        print(f"fault lab kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def run_on_rabbit(rabbit_lab):
    from tests.faults.conftest import make_runner
    return make_runner(rabbit_lab)


def test_the_lab_runs_on_quorum_queues(rabbit_lab):
    """What the broker holds, read from RabbitMQ itself: the lab's queues are durable quorum
    queues, module queues (tools.<module>) included."""
    queues = rabbit_lab.rabbit.queues()
    names = {q["name"] for q in queues}
    assert {"orchestrator", "maintenance", "webhooks"} <= names, queues
    assert any(n.startswith("tools.") for n in names), queues
    task_queues = [q for q in queues if not q["name"].startswith(("celery", "celeryev"))
                   and "pidbox" not in q["name"]]
    assert all(q["type"] == "quorum" and q["durable"] for q in task_queues), task_queues


def test_rabbitmq_restarts_under_load(run_on_rabbit, rabbit_lab):
    """Two kills of the RabbitMQ node while jobs flow (2 s down each, then its recovery):
    all workers live on (the same processes), every job completes, none twice."""
    pids: list[int] = []

    def restarts(lab):
        for _ in range(2):
            lab.rabbit.restart(down_s=2.0)
            pids.append(lab.rabbit.proc.pid)
            time.sleep(3.0)
    workers = {n: p.pid for n, p in rabbit_lab.stack.procs.items()}
    outcome = run_on_rabbit("rabbitmq_restart_x2", restarts)
    assert outcome.statuses == {"completed": outcome.jobs}
    assert outcome.duplicates.get("non_idempotent_tool_runs") == 0, outcome.as_dict()
    assert len(set(pids)) == 2, pids
    assert {n: p.pid for n, p in rabbit_lab.stack.procs.items()} == workers
