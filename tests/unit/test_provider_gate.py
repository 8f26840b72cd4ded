"""The provider gate's Redis script against a real Redis (the test database named by
AGENTQ_TEST_REDIS), with a clock the test moves: no sleeping, no timing margins."""
from __future__ import annotations

import os
import time
import uuid

import pytest
import redis

from agentq.llm.gate import GateLimits, NullGate, ProviderBusy, RedisGate, provider_name
from tests.support.stack import REDIS_URL


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def client():
    c = redis.Redis.from_url(REDIS_URL)
    try:
        c.ping()
    except redis.ConnectionError:
        if os.environ.get("CI"):
            raise
        pytest.skip("Redis is not answering")
    yield c
    c.close()


@pytest.fixture
def make(client):
    """Gates on providers of this test's own: a run sharing the Redis database (another
    test run, a stack) never sees or clears their keys, and the test clears only them."""
    clock = Clock()
    providers: list[str] = []

    def factory(**limits) -> RedisGate:
        provider = f"test-{uuid.uuid4().hex}"
        providers.append(provider)
        return RedisGate(client, provider, GateLimits(**limits), sleep=clock.sleep,
                         clock=clock)
    factory.clock = clock
    yield factory
    for provider in providers:
        for key in client.scan_iter(f"agentq:provider:{provider}:*"):
            client.delete(key)


def fail(gate: RedisGate, transient: bool = True) -> None:
    with gate.call("m") as permit:
        permit.failed(transient)


def succeed(gate: RedisGate) -> None:
    with gate.call("m") as permit:
        permit.succeeded()


def test_a_storm_opens_the_circuit_then_one_probe_closes_it(make):
    gate = make(breaker_failures=3, breaker_window_s=10, breaker_open_s=5)
    fail(gate)
    fail(gate)
    assert gate.state()["state"] == "closed"
    fail(gate)
    assert gate.state()["state"] == "open"
    # while open, no call goes through: the job parks, told when to come back
    with pytest.raises(ProviderBusy) as info:
        succeed(gate)
    assert info.value.reason == "circuit_open"
    assert 4.9 <= info.value.retry_after_s <= 5.0
    # after the open period: one probe, and only one, is let through
    make.clock.sleep(5.1)
    with gate.call("m") as probe:
        with pytest.raises(ProviderBusy) as other:
            succeed(gate)
        assert other.value.reason == "half_open_probing"
        probe.succeeded()
    assert gate.state()["state"] == "closed"
    succeed(gate)
    succeed(gate)


def test_a_failed_probe_opens_the_circuit_again(make):
    gate = make(breaker_failures=1, breaker_open_s=5)
    fail(gate)
    make.clock.sleep(6)
    fail(gate)  # the probe
    assert gate.state()["state"] == "open"
    assert int(gate.state()["opened"]) == 2
    with pytest.raises(ProviderBusy):
        succeed(gate)


def test_a_crashed_probe_frees_its_turn_after_its_lease(make):
    gate = make(breaker_failures=1, breaker_open_s=1, lease_s=30)
    fail(gate)
    make.clock.sleep(2)
    gate._take()  # a probe whose process died: never released
    with pytest.raises(ProviderBusy):
        succeed(gate)
    make.clock.sleep(31)
    succeed(gate)
    assert gate.state()["state"] == "closed"


def test_failures_outside_the_window_do_not_add_up(make):
    gate = make(breaker_failures=3, breaker_window_s=10)
    for _ in range(5):
        fail(gate)
        fail(gate)
        make.clock.sleep(11)
    assert gate.state()["state"] == "closed"


def test_non_transient_errors_and_successes_never_open_it(make):
    gate = make(breaker_failures=2)
    for _ in range(5):
        fail(gate, transient=False)
        succeed(gate)
    assert gate.state().get("state", "closed") == "closed"


def test_an_end_that_changes_nothing_is_not_sent_to_redis(make):
    """No slot taken (no concurrency limit), not the probe, not a transient failure: the
    release script would change nothing, so a call costs one round trip, not two."""
    gate = make(breaker_failures=2)
    released = []
    script = gate._release_script
    gate._release_script = lambda **kw: released.append(kw["args"][2]) or script(**kw)
    succeed(gate)
    fail(gate, transient=False)
    assert released == []
    fail(gate)
    assert released == ["transient"]


def test_concurrency_is_shared_and_a_full_provider_makes_the_job_park(make, client):
    gate = make(max_concurrency=2, breaker_failures=0)
    other_process = RedisGate(client, gate.provider, gate.limits, sleep=make.clock.sleep,
                              clock=make.clock)
    with gate.call("m"), other_process.call("m"):
        assert gate.in_flight() == 2
        with pytest.raises(ProviderBusy) as info:
            succeed(gate)
        assert info.value.reason == "concurrency"
    assert gate.in_flight() == 0
    succeed(other_process)


def test_a_slot_of_a_crashed_caller_frees_itself(make):
    gate = make(max_concurrency=1, lease_s=10, breaker_failures=0)
    gate._take()  # never released
    with pytest.raises(ProviderBusy):
        succeed(gate)
    make.clock.sleep(11)
    succeed(gate)


def test_the_rate_limit_counts_calls_per_second(make):
    gate = make(rate_per_s=3, breaker_failures=0)
    second = int(make.clock.now) + 1
    make.clock.now = second + 0.1  # at the start of a second
    for _ in range(3):
        succeed(gate)
    assert int(make.clock.now) == second
    # a fourth call waits for the next second (briefly, in-thread) and goes through
    succeed(gate)
    assert int(make.clock.now) == second + 1


def test_redis_away_never_blocks_a_call():
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    gate = RedisGate(dead, "test-dead", GateLimits(max_concurrency=1))
    with gate.call("m") as permit:
        permit.failed(True)
    with NullGate().call("m") as permit:
        permit.succeeded()


def test_provider_name_is_the_host():
    assert provider_name("http://127.0.0.1:8900/v1") == "127.0.0.1:8900"
    assert provider_name(None) == "api.openai.com"


def test_the_router_stops_calling_a_provider_whose_circuit_is_open(make):
    import openai

    from agentq.config import Settings
    from agentq.errors import ProviderError
    from agentq.llm.router import LLMRouter
    from agentq.testing.scripted_llm import ScriptedLLM, error, text
    gate = make(breaker_failures=4, breaker_window_s=60, breaker_open_s=30)
    settings = Settings.from_env({"AGENTQ_MODEL": "m1", "AGENTQ_FALLBACK_MODELS": "m2",
                                  "AGENTQ_LLM_RETRIES": "1", "AGENTQ_LLM_RETRY_BASE_S": "0.001",
                                  "AGENTQ_LLM_RETRY_MAX_S": "0.01"})
    with ScriptedLLM() as llm, openai.OpenAI(api_key="sk-test", base_url=llm.base_url,
                                             max_retries=0) as sdk:
        router = LLMRouter(settings, sdk, gate=gate)
        llm.storm("gs", [error(500)])
        messages = [{"role": "user", "content": "hi script:gs"}]
        with pytest.raises(ProviderError) as first:
            router.chat(messages, [])
        assert first.value.transient and llm.storm_served["gs"] == 4
        assert gate.state()["state"] == "open"
        # the next job's call parks without reaching the provider
        with pytest.raises(ProviderError) as second:
            router.chat(messages, [])
        assert second.value.transient and llm.storm_served["gs"] == 4
        assert 29 <= second.value.retry_after_s <= 30
        assert "circuit open" in second.value.attempts[-1]["error"]
        # the provider recovers; after the open period one probe closes the circuit
        llm.calm("gs")
        llm.script("gs", [text("back")])
        make.clock.sleep(31)
        assert router.chat(messages, []).content == "back"
        assert gate.state()["state"] == "closed"
        llm.assert_done()


def test_on_rabbitmq_the_gate_lives_in_the_result_backends_redis():
    """A RabbitMQ deployment's Redis (its result backend) holds the gate: the circuit and
    the limits are shared by every process as with a Redis broker; with no Redis at all
    there is no gate (issue 35)."""
    from agentq.config import Settings
    from agentq.llm.gate import gate_for
    amqp = "amqp://guest:guest@127.0.0.1:5672/agentq"
    database = "postgresql://postgres@127.0.0.1:5432/agentq"
    with_redis = Settings.from_env({"AGENTQ_BROKER_URL": amqp, "AGENTQ_DATABASE_URL": database,
                                    "AGENTQ_RESULT_BACKEND_URL": REDIS_URL})
    gate = gate_for(with_redis, "https://api.example.com/v1")
    assert isinstance(gate, RedisGate)
    assert gate._redis.connection_pool.connection_kwargs["port"] == int(
        REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    without = Settings.from_env({"AGENTQ_BROKER_URL": amqp, "AGENTQ_DATABASE_URL": database})
    assert isinstance(gate_for(without, "https://api.example.com/v1"), NullGate)
