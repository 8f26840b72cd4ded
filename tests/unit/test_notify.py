"""Event pushes under many threads (issue 11, cause 5): one bounded pool per process that
waits, so 1,000 orchestrator threads never see "Too many connections", and a push never
raises into its step, even with Redis gone. On a private Redis (its client count is ours)."""
from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest
import redis

from agentq.notify import PUBLISH_POOL_SIZE, RedisHub
from tests.support.services import PrivateRedis

THREADS = 400
PUSHES = 5


@pytest.fixture
def private_redis():
    server = PrivateRedis(Path(tempfile.mkdtemp(prefix="agentq-notify-"))).start()
    yield server
    server.stop()


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
