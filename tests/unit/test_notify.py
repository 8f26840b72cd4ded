"""Event pushes under many threads (issue 11, cause 5): one bounded pool per process that
waits, so 1,000 orchestrator threads never see "Too many connections", and a push never
raises into its step, even with Redis gone. On a private Redis (its client count is ours)."""
from __future__ import annotations

import logging
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
import redis

from agentq.notify import PUBLISH_POOL_SIZE, RedisHub
from tests.support.services import PrivateRedis

THREADS = 400
PUSHES = 5


@pytest.fixture
def private_redis():
    scratch = Path(tempfile.mkdtemp(prefix="agentq-notify-"))
    server = PrivateRedis(scratch).start()
    yield server
    server.stop()
    shutil.rmtree(scratch, ignore_errors=True)  # the suite leaves nothing behind


def _clients(server: PrivateRedis) -> int:
    admin = redis.Redis(port=server.port)
    try:
        return len(admin.client_list()) - 1  # not this one
    finally:
        admin.close()


def test_many_threads_push_through_a_bounded_pool(private_redis):
    # given one hub, listening, and a watcher on every job
    hub = RedisHub(private_redis.url)
    subs = {f"job-{i}": hub.subscribe(f"job-{i}") for i in range(THREADS)}
    peak, errors = [0], []
    start = threading.Barrier(THREADS + 1)

    def pushes(i: int) -> None:
        start.wait()
        try:
            for n in range(PUSHES):
                hub.publish(f"job-{i}", [{"type": "turn_start", "n": n}])
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=pushes, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    start.wait()
    while any(t.is_alive() for t in threads):
        peak[0] = max(peak[0], _clients(private_redis))
        threads[0].join(0.01)
    for t in threads:
        t.join()

    # then every push went out, none raised or was dropped
    assert errors == [] and hub.dropped == 0
    # and every watcher got its job's events, in order
    for job_id, sub in subs.items():
        got = []
        while len(got) < PUSHES:
            batch = sub.get(10)
            assert batch, f"{job_id} got {got}"
            got += [e["n"] for e in batch]
        assert got == list(range(PUSHES))
        sub.close()
    # and the process never held more connections than its pool (+ the listener)
    assert 0 < peak[0] <= PUBLISH_POOL_SIZE + 1
    assert hub.pool.max_connections == PUBLISH_POOL_SIZE + 1
    hub.close()


def test_a_push_with_redis_gone_is_dropped_not_raised(private_redis):
    hub = RedisHub(private_redis.url, pool_wait_s=0.5)
    hub.publish("job", [{"type": "turn_start"}])
    private_redis.kill()
    # when Redis is away, pushes are dropped and counted, never raised into the step
    for _ in range(3):
        hub.publish("job", [{"type": "turn_end"}])
    assert hub.dropped == 3
    # and once it is back, pushes go through again
    private_redis.start()
    hub.publish("job", [{"type": "job_end"}])
    assert hub.dropped == 3
    hub.close()


def _records(caplog, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == message]


def _await_record(caplog, message: str, within_s: float = 60.0) -> logging.LogRecord:
    deadline = time.monotonic() + within_s
    while not _records(caplog, message):
        assert time.monotonic() < deadline, f"never logged: {message!r}"
        time.sleep(0.05)
    return _records(caplog, message)[0]


def test_the_listener_says_an_outage_once_in_one_line_and_when_it_ends(private_redis,
                                                                       caplog):
    # given a hub whose listener is subscribed
    caplog.set_level(logging.INFO, logger="agentq.notify")
    hub = RedisHub(private_redis.url)
    sub = hub.subscribe("job")
    # when Redis goes away for three of the listener's retries at least (its port taken
    # by a stand-in that closes each connection it accepts, counting them)
    private_redis.kill()
    lost = _await_record(caplog, "event listener lost Redis; reconnecting")
    with socket.create_server(("127.0.0.1", private_redis.port)) as stand_in:
        for _ in range(3):
            conn, _addr = stand_in.accept()
            conn.close()
    # then the outage is said once, as a warning naming the Redis and what failed (the
    # error's text is the socket's: refused, reset, closed), with no traceback (3.11's
    # traceback printing parses source: CPython gh-106905, and a retry a second must not
    # flood the log)
    assert len(_records(caplog, "event listener lost Redis; reconnecting")) == 1
    assert lost.levelno == logging.WARNING and lost.exc_info is None
    assert lost.redis == private_redis.url and lost.error
    # and once Redis is back, the listener says so and events reach their watcher again
    private_redis.start()
    _await_record(caplog, "event listener reconnected to Redis")
    hub.publish("job", [{"type": "job_end"}])
    assert [e["type"] for e in sub.get(10)] == ["job_end"]
    sub.close()
    hub.close()
    # and a closed hub stops listening
    hub._listener.join(10)
    assert not hub._listener.is_alive()
