"""A Redis restart must not kill a worker (issue 11, cause 1).

celery/kombu 5.7.0 crashed a worker with tasks in flight while reconnecting
(`AttributeError: 'NoneType' object has no attribute 'hostname'`, see tasks/consumer.py).
The first test reproduces kombu's failing close on a real Redis, deterministically; the
second restarts the suite's private Redis under load, repeatedly, and every process must
still be alive and every job completed.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue

from tasks.consumer import tolerant_close
from tests.support.services import PrivateRedis


@pytest.fixture
def private_redis():
    redis = PrivateRedis(Path(tempfile.mkdtemp(prefix="agentq-redis-"))).start()
    yield redis
    redis.stop()


def _connection_with_unacked_delivery(redis: PrivateRedis) -> Connection:
    conn = Connection(redis.url)
    queue = Queue("q", Exchange("q"), "q")
    conn.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key="q",
                            declare=[queue])
    assert conn.default_channel.basic_get("q", no_ack=False) is not None
    return conn


def test_close_after_collect_with_unacked_delivery_does_not_raise(private_redis):
    """The consumer's reconnect path: broker gone, transport collected, then close()."""
    conn = _connection_with_unacked_delivery(private_redis)
    private_redis.kill()
    conn._do_close_transport()  # what collect() leaves behind when the channel's close failed
    tolerant_close(conn)
    conn.close()  # kombu 5.7.0 alone: AttributeError('... no attribute hostname')


def test_tolerant_close_leaves_a_healthy_close_alone(private_redis):
    conn = _connection_with_unacked_delivery(private_redis)
    tolerant_close(conn)
    conn.close()  # a healthy close is unchanged
    assert conn._transport is None


def test_workers_use_the_tolerant_consumer():
    from tasks.app import app
    assert app.conf.worker_consumer == "tasks.consumer:Consumer"


def test_redis_restarts_under_load_kill_no_worker(run_fault):
    """Three restarts of Redis while jobs flow (each loses every key): all workers live on,
    all jobs complete (the sweeper re-drives what the restarts lost)."""
    def restarts(lab):
        import time
        for _ in range(3):
            lab.redis.restart(down_s=1.0)
            time.sleep(2.0)
    outcome = run_fault("redis_restart_x3", restarts)
    assert outcome.fault_s is not None


def test_submits_while_redis_is_down_are_written_and_complete(run_fault, fault_lab):
    """The broker away for a while: a submit still answers (202: the job is written, the
    sweeper sends it when Redis is back; or 503: it was not), never 500, never hangs."""
    import time

    import requests
    answers: list[requests.Response] = []

    def down_and_probe(lab):
        lab.redis.kill()
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {lab.key}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            answers.append(http.post(f"{lab.stack.base}/v1/messages", timeout=60, json={
                "platform": "api", "platform_user_id": "probe-broker",
                "platform_channel_id": f"p{len(answers)}", "content": "What is 6*7? turns=1"}))
            time.sleep(0.5)
        http.close()
        lab.redis.start()

    run_fault("redis_down_10s", down_and_probe)
    assert answers
    written = [r.json()["id"] for r in answers if r.status_code == 202]
    assert all(r.status_code in (202, 503) for r in answers), [
        (r.status_code, r.text) for r in answers]
    for r in answers:
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "unavailable" and r.headers["Retry-After"]
    # every job a 202 announced completes (the sweeper sent what the broker never got)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        statuses = fault_lab.statuses(written)
        if all(s == "completed" for s in statuses.values()):
            break
        time.sleep(1)
    assert statuses and set(statuses.values()) == {"completed"}, statuses


def test_an_ack_on_a_collected_channel_is_a_connection_error(private_redis):
    """The second path: a pool thread's ack runs on the old channel after the reconnect.
    kombu 5.7.0's own channel raises AttributeError('... no attribute hostname') there,
    which kills the worker; ours raises a connection error, which celery logs and skips."""
    import redis as redis_lib

    from tasks.consumer import Channel, Transport
    conn = Connection(private_redis.url, transport=Transport)
    channel = conn.default_channel
    assert isinstance(channel, Channel)
    queue = Queue("q", Exchange("q"), "q")
    conn.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key="q",
                            declare=[queue])
    message = channel.basic_get("q", no_ack=False)
    private_redis.kill()
    channel._disconnect_pools()  # as the lost connection left it
    conn._do_close_transport()
    with pytest.raises(redis_lib.exceptions.ConnectionError):
        message.ack()
    try:
        conn.close()  # (a connection error here is what the consumer ignores)
    except redis_lib.exceptions.ConnectionError:
        pass
    assert redis_lib.exceptions.ConnectionError in Transport.connection_errors or any(
        issubclass(redis_lib.exceptions.ConnectionError, e)
        for e in Transport.connection_errors)
