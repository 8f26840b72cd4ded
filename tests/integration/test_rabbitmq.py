"""RabbitMQ as agentq configures it (DESIGN 1.2, docs/deploying.md), on a stack of its own
in a vhost of its own on the machine's RabbitMQ, with no result backend set (so the
database: tool calls join in Postgres), whatever AGENTQ_TEST_BROKER says for the others:

- a job with tool calls on two module queues completes;
- a module registered while the workers run gets its queue, and RabbitMQ holds every task
  queue as a durable quorum queue: the fixed three, the built-in modules' and the new one.

Countdowns through RabbitMQ's delayed-delivery queues (webhook retries a fraction of a second
apart, which Celery's native delayed delivery could not send) are shown by
test_webhooks.py on RabbitMQ (AGENTQ_TEST_BROKER=amqp, .ci/run's second run).
"""
from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import TEST_ENV, Client, uid
from tests.support.stack import (
    RABBITMQ_URL,
    ROOT,
    WORKERS,
    die_with_parent,
    free_port,
    own_stack,
    rabbitmq_vhost,
    rabbitmqctl,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def amqp(servers_up, llm, tmp_path_factory):
    """No AGENTQ_RESULT_BACKEND_URL: the default, the database."""
    vhost = rabbitmq_vhost("own")
    with own_stack("amqp", llm.base_url, tmp_path_factory.mktemp("amqp"), TEST_ENV,
                   workers=WORKERS, beat=True, broker_url=f"{RABBITMQ_URL}/{vhost}") as stack:
        yield stack, vhost, Client(stack, stack.create_key("amqp", admin=True))


def queues(vhost: str) -> dict[str, tuple[str, bool]]:
    """RabbitMQ's own list of the vhost's queues: name -> (type, durable)."""
    out = rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", "name", "type",
                      "durable").stdout
    rows = [line.split("\t") for line in out.splitlines() if line.strip()]
    return {r[0]: (r[1], r[2] == "true") for r in rows}


def test_the_defaults_of_an_amqp_broker(amqp):
    stack, _vhost, _client = amqp
    settings = stack.settings()
    assert settings.result_backend_url.startswith("db+postgresql")
    assert settings.tool_join == "database"


def test_a_job_with_tools_on_two_module_queues_completes(amqp, script):
    stack, _vhost, client = amqp
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"}),
                                call("time.now", {"timezone": "UTC"})),
                     text("42, and the time")])
    job = client.wait(client.submit(f"{marker} go")["id"])
    assert job["status"] == "completed", job
    assert job["response"]["content"] == "42, and the time"
    from sqlalchemy import select

    from agentq.models import ToolCall
    with stack.sessions()() as session:
        ran = session.execute(select(ToolCall.name, ToolCall.queue, ToolCall.status).where(
            ToolCall.job_id == uuid.UUID(job["id"]))).all()
    assert {(n, q, st) for n, q, st in ran} == {("math.evaluate", "tools.math", "succeeded"),
                                                ("time.now", "tools.time", "succeeded")}, ran


def test_every_task_queue_is_a_durable_quorum_queue_a_module_added_at_run_time_too(amqp):
    stack, vhost, client = amqp
    name = uid("m").replace("-", "_")
    port = free_port()
    module = subprocess.Popen([sys.executable, "-m", "examples.http_module", "--port",
                               str(port), "--name", name], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, preexec_fn=die_with_parent)
    try:
        assert module.stdout.readline().strip() == f"http://127.0.0.1:{port}"
        answer = client.post("/v1/modules", json={"name": name, "kind": "http",
                                                  "url": f"http://127.0.0.1:{port}"})
        assert answer.status_code == 201, answer.text
        # the tools worker follows it (tasks.app's module watcher: add_consumer)
        deadline = time.monotonic() + 60
        while f"tools.{name}" not in queues(vhost):
            assert time.monotonic() < deadline, queues(vhost)
            time.sleep(1)
        held = queues(vhost)
        task_queues = {q: kind for q, kind in held.items()
                       if not q.endswith(".pidbox") and not q.startswith("celery_delayed_")}
        assert {"orchestrator", "maintenance", "webhooks", "tools.math", "tools.time",
                "tools.slow.code", f"tools.{name}"} <= set(task_queues), held
        assert set(task_queues.values()) == {("quorum", True)}, task_queues
    finally:
        client.http.delete(client.url(f"/v1/modules/{name}"), timeout=30)
        module.terminate()
        module.wait(timeout=10)
        module.stdout.close()
