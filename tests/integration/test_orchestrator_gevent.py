"""The orchestrator on the gevent pool (AGENTQ_ORCHESTRATOR_POOL=gevent): real jobs through
HTTP, Celery's gevent pool, Postgres through psycogreen, Redis and the real openai SDK, on a
stack of its own (its own Redis and database). The shared stack keeps the thread pool."""
from __future__ import annotations

import json
import threading
import uuid

import pytest
import redis
from sqlalchemy import select
from sqlalchemy import text as sql

from agentq.models import Job
from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import TEST_ENV, Client, assert_one_tool_turn_told, uid, wait_until
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration

CONCURRENCY = 40


@pytest.fixture(scope="module")
def green(servers_up, llm, tmp_path_factory):
    env = {**TEST_ENV, "AGENTQ_ORCHESTRATOR_POOL": "gevent",
           "AGENTQ_ORCHESTRATOR_CONCURRENCY": str(CONCURRENCY)}
    with own_stack("gevent", llm.base_url, tmp_path_factory.mktemp("gevent"), env) as stack:
        yield stack, Client(stack, stack.create_key("gevent", admin=True))


@pytest.fixture()
def gate():
    """Model replies held with it wait until the test sets it."""
    event = threading.Event()
    yield event
    event.set()


def held(reply, gate):
    reply.hold = gate
    return reply


def test_the_orchestrator_runs_greenlets_and_green_psycopg2(green):
    stack, _client = green
    log = stack.logs["orchestrator"].read_text()
    assert f"{CONCURRENCY} (gevent)" in log  # Celery's banner: concurrency and pool
    assert "psycopg2 waits through gevent" in log


def test_a_one_tool_job_completes(green, script):
    _stack, client = green
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("It is 42.")])
    job = client.wait(client.submit(f"{marker} what is 6*7?")["id"])
    assert job["status"] == "completed" and job["finish_reason"] == "end_turn", job
    assert job["response"]["content"] == "It is 42." and job["iterations"] == 2
    history = assert_one_tool_turn_told(client, job)
    assert json.loads(history[2]["content"])["result"] == {"result": 42, "expression": "6*7"}


def test_parallel_tool_calls_and_a_failing_tool(green, script):
    _stack, client = green

    def sees_results(request):
        results = [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]
        assert results[0] == {"expression": "1+1", "result": 2}
        assert results[2]["error"]["code"] == "tool_error"
    marker = script([tool_calls(call("math.evaluate", {"expression": "1+1"}),
                                call("time.now", {"timezone": "UTC"}),
                                call("flaky.always_fail", {})),
                     text("done", check=sees_results)])
    job = client.wait(client.submit(f"{marker} all three")["id"])
    assert job["status"] == "completed" and job["response"]["content"] == "done", job
    calls = job["response"]["metadata"]["tool_calls"]
    assert [c["name"] for c in calls] == ["math.evaluate", "time.now", "flaky.always_fail"]
    assert [c["success"] for c in calls] == [True, True, False]


def test_tool_turns_leave_no_redis_connections_behind(green, script):
    # given a warmed-up stack on a Redis of its own
    stack, client = green
    broker = redis.Redis.from_url(stack.env["AGENTQ_BROKER_URL"])

    def tool_job() -> None:  # two calls: a chord (a turn of one call is linked instead)
        marker = script([tool_calls(call("math.evaluate", {"expression": "2+2"}),
                                    call("time.now", {"timezone": "UTC"})),
                         text("4")])
        assert client.wait(client.submit(f"{marker} add")["id"])["status"] == "completed"
    try:
        tool_job()
        before = len(broker.client_list())
        # when tool turns run one after another
        for _ in range(15):
            tool_job()
        # then the orchestrator's greenlets share one result backend: a chord's result
        # drainer and its pub/sub connection are not left behind per greenlet (two Redis
        # connections per chord when Celery kept a backend per greenlet)
        assert len(broker.client_list()) - before < 10
    finally:
        broker.close()


def test_cancel_mid_model_call_aborts_it_under_gevent(green, script, gate):
    _stack, client = green
    marker = script([held(tool_calls(call("math.evaluate", {"expression": "1+1"}),
                                     input_tokens=7, output_tokens=3), gate)])
    job = client.submit(f"{marker} go")
    wait_until(lambda: client.get(f"/v1/jobs/{job['id']}").json()["status"] == "running",
               what="the job runs")
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    # the call in flight is aborted (issue 31): the job ends while the model still holds it
    ended = client.wait(job["id"])
    gate.set()
    assert ended["status"] == "cancelled" and ended["finish_reason"] == "cancelled"
    assert (ended["usage"]["input_tokens"], ended["usage"]["output_tokens"]) == (0, 0)
    assert "tool_execution_start" not in [e["type"] for e in client.events(job["id"])]


def test_many_model_calls_wait_at_once_in_one_process(green, llm, gate):
    # given more jobs than a thread-per-core pool would hold, each model call held open
    _stack, client = green
    jobs = CONCURRENCY - 10
    keys = [uid("wait").replace("-", "_") for _ in range(jobs)]
    for key in keys:
        llm.script(key, [held(text(f"answer {key}"), gate)])
    try:
        ids = [client.submit(f"script:{key} go")["id"] for key in keys]
        # then every one of their model calls reaches the model while none has an answer
        wait_until(lambda: all(llm.requests(key) for key in keys), timeout_s=120,
                   what="every job's model call waiting at once")
        gate.set()
        ended = [client.wait(job_id) for job_id in ids]
        assert [j["status"] for j in ended] == ["completed"] * jobs
        assert [j["response"]["content"] for j in ended] == [f"answer {k}" for k in keys]
    finally:
        gate.set()
        for key in keys:
            llm.assert_done(key)


def test_a_step_waiting_on_a_row_lock_does_not_stop_the_others(green, script, gate):
    # given a job whose step, once its model answers, must write a row the test has locked
    stack, client = green
    marker = script([held(text("first"), gate), text("second")])
    first = client.submit(f"{marker} one")
    wait_until(lambda: client.get(f"/v1/jobs/{first['id']}").json()["status"] == "running",
               what="the first job runs")
    locker = stack.sessions()()
    try:
        locker.execute(select(Job.id).where(Job.id == uuid.UUID(first["id"]))
                       .with_for_update())
        gate.set()
        wait_until(lambda: _lock_waits(stack) > 0,
                   what="the first job's step waiting on the lock")
        # when another job runs meanwhile, then it completes: the waiting greenlet holds
        # neither the process nor the others (psycopg2 waits through gevent)
        second = client.wait(client.submit(f"{marker} two")["id"])
        assert second["status"] == "completed" and second["response"]["content"] == "second"
        assert client.get(f"/v1/jobs/{first['id']}").json()["status"] == "running"
    finally:
        locker.rollback()
        locker.close()
    done = client.wait(first["id"])
    assert done["status"] == "completed" and done["response"]["content"] == "first"


def _lock_waits(stack) -> int:
    """Backends of the stack's database waiting on a lock, looked at in a transaction of its
    own (Postgres keeps one snapshot of pg_stat_activity per transaction: the locker's own
    would never show a backend opened after its first look)."""
    with stack.sessions()() as session:
        return session.execute(sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'")).scalar_one()
