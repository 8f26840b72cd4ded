"""A Redis restart must not kill a worker (issue 11, cause 1).

celery/kombu 5.7.0 crashed a worker with tasks in flight while reconnecting
(`AttributeError: 'NoneType' object has no attribute 'hostname'`, see tasks/consumer.py).
The first tests reproduce kombu's failing close (and ack) on a real Redis,
deterministically, each with a control showing that stock kombu still raises there (when a
control fails, kombu fixed it: drop the work-around); the others restart the suite's private
Redis under load, repeatedly, and every process must still be alive and every job completed.
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


def _collected_after_broker_loss(redis: PrivateRedis) -> Connection:
    """The consumer's reconnect path: a delivery unacknowledged, the broker gone, the
    transport collected (what collect() leaves behind when the channel's close failed)."""
    conn = _connection_with_unacked_delivery(redis)
    redis.kill()
    conn._do_close_transport()
    return conn


def test_control_stock_kombu_close_after_collect_raises(private_redis):
    """The bug the work-around is for, on plain kombu: this close kills a worker. When this
    test fails, kombu handles a detached transport: drop tasks.consumer's work-around."""
    conn = _collected_after_broker_loss(private_redis)
    with pytest.raises(AttributeError, match="hostname"):
        conn.close()


def test_close_after_collect_with_unacked_delivery_does_not_raise(private_redis):
    """The same sequence as the control, with the consumer's tolerant close."""
    conn = _collected_after_broker_loss(private_redis)
    tolerant_close(conn)
    conn.close()


def test_tolerant_close_leaves_a_healthy_close_alone(private_redis):
    conn = _connection_with_unacked_delivery(private_redis)
    tolerant_close(conn)
    conn.close()  # a healthy close is unchanged
    assert conn._transport is None


def test_a_redis_broker_connection_gets_the_tolerant_transport(private_redis):
    """What kombu builds from the app's settings for a redis:// broker (not just what the
    settings say): our transport, whose channel raises a connection error."""
    from celery.utils.imports import symbol_by_name

    from agentq.config import Settings
    from tasks.app import make_celery
    from tasks.consumer import Channel, Consumer, Transport
    app = make_celery(Settings.from_env({"AGENTQ_BROKER_URL": private_redis.url}))
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)
        assert isinstance(conn.default_channel, Channel)
    # and the consumer the worker loads (it resolves the setting the same way)
    assert symbol_by_name(app.conf.worker_consumer) is Consumer


def test_redis_restarts_under_load_kill_no_worker(run_fault, fault_lab):
    """Three restarts of Redis while jobs flow (each loses every key): all workers live on,
    all jobs complete (the sweeper re-drives what the restarts lost)."""
    from tests.support.fault_lab import restarted_under_load
    restarted_under_load(run_fault, fault_lab, "redis_restart_x3", "redis", times=3,
                         down_s=1.0, pause_s=2.0)


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


def _ack_after_collect(redis: PrivateRedis, transport=None) -> BaseException | None:
    """A pool thread's ack running on the old channel after the reconnect: what it
    raises (None: nothing)."""
    conn = Connection(redis.url, transport=transport)
    channel = conn.default_channel
    queue = Queue("q", Exchange("q"), "q")
    conn.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key="q",
                            declare=[queue])
    message = channel.basic_get("q", no_ack=False)
    assert message is not None
    redis.kill()
    channel._disconnect_pools()  # as the lost connection left it
    conn._do_close_transport()
    try:
        message.ack()
    except Exception as exc:  # noqa: BLE001 - the answer
        return exc
    return None


def test_control_stock_kombu_ack_on_a_collected_channel_raises(private_redis):
    """The second path's bug on plain kombu: AttributeError, which celery's ack does not
    swallow (it kills the worker). When this fails, kombu fixed it: drop our Transport."""
    raised = _ack_after_collect(private_redis)
    assert isinstance(raised, AttributeError) and "hostname" in str(raised), repr(raised)


def test_an_ack_on_a_collected_channel_is_a_connection_error(private_redis):
    """Ours raises a connection error there, which celery logs and skips."""
    import redis as redis_lib

    from tasks.consumer import Transport
    raised = _ack_after_collect(private_redis, Transport)
    assert isinstance(raised, redis_lib.exceptions.ConnectionError), repr(raised)
