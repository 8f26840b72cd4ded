"""RabbitMQ as the broker (DESIGN 1.2), restarted under load: a private RabbitMQ node (its
own node name, ports, cookie and data: tests/support/services.py PrivateRabbitMQ; the
machine's RabbitMQ is never touched) is killed with jobs in flight and started again on the
same data. Durable quorum queues keep what they confirmed; every worker reconnects; every
job completes once, no tool runs twice, no 5xx but 503 (run_fault asserts all of it).

The rest of the fault suite runs on RabbitMQ with AGENTQ_FAULT_BROKER=amqp."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def rabbit_lab(servers_up):
    """A fault lab whose broker is a private RabbitMQ node (the session's lab, when
    AGENTQ_FAULT_BROKER=amqp already made it so, is not reused: it may be on Redis)."""
    from tests.support.fault_lab import started_lab
    yield from started_lab("amqp")


@pytest.fixture
def run_on_rabbit(rabbit_lab):
    from tests.support.fault_lab import make_runner
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
    from tests.support.fault_lab import restarted_under_load
    outcome = restarted_under_load(run_on_rabbit, rabbit_lab, "rabbitmq_restart_x2", "rabbit",
                                   times=2, down_s=2.0, pause_s=3.0)
    assert outcome.duplicates.get("non_idempotent_tool_runs") == 0, outcome.as_dict()
