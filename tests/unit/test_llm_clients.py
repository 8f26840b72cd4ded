"""The model calls' HTTP clients: one per group of threads (agentq.llm.clients), against a
real ScriptedLLM through the real SDK."""
import threading

import openai
import pytest

from agentq.config import Settings
from agentq.llm import clients
from agentq.llm.clients import ClientShards, clients_for
from agentq.llm.router import LLMRouter
from agentq.testing.scripted_llm import ScriptedLLM, text


def on_threads(n, fn):
    """fn(i) on n threads started together; their results in order."""
    results, start = [None] * n, threading.Barrier(n)

    def run(i):
        start.wait()
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_a_client_per_group_of_threads_and_around_again():
    made = []

    def make():
        client = openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
        made.append(client)
        return client

    shards = ClientShards(make, clients=2, per_client=3)
    # seven threads arrive one after another: 3 on the first client, 3 on the second,
    # the seventh on the first again; each keeps its own on a second call
    got = []
    for _ in range(7):
        thread_clients = []
        worker = threading.Thread(
            target=lambda out=thread_clients: out.extend([shards.client(), shards.client()]))
        worker.start()
        worker.join()
        assert thread_clients[0] is thread_clients[1]
        got.append(thread_clients[0])
    assert len(made) == 2 and shards.made() == 2
    assert got == [made[0]] * 3 + [made[1]] * 3 + [made[0]]

    shards.close()
    assert all(client.is_closed() for client in made) and shards.made() == 0
    assert shards.client() is made[2] and not made[2].is_closed()  # made again on use
    shards.close()


def test_clients_for_a_pool_size():
    assert clients_for(1) == 1 and clients_for(64) == 1 and clients_for(65) == 2
    assert clients_for(1000) == 16 and clients_for(0) == 1
    assert clients_for(10, per_client=4) == 3


@pytest.fixture
def llm():
    with ScriptedLLM() as server:
        yield server


def test_the_router_spreads_its_calls_over_its_own_clients(llm, monkeypatch):
    # given a router that builds its clients (as every process does), 2 threads to a client
    monkeypatch.setattr(clients, "THREADS_PER_CLIENT", 2)
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    settings = Settings.from_env({"AGENTQ_MODEL": "m1", "AGENTQ_ORCHESTRATOR_CONCURRENCY": "6",
                                  "AGENTQ_LLM_TIMEOUT_S": "10"})
    marker = llm.script("spread", [text(f"reply {i}") for i in range(6)])
    router = LLMRouter(settings)
    try:
        # when six threads call at once
        replies = on_threads(6, lambda i: router.chat(
            [{"role": "user", "content": f"hi {marker}"}], []).content)
        # then every call was answered, through three clients
        assert sorted(replies) == [f"reply {i}" for i in range(6)]
        assert len(llm.requests("spread")) == 6
        assert router._shards.made() == 3
    finally:
        router.close()
    assert router._shards.made() == 0
    llm.assert_done()


def test_a_given_client_is_used_by_every_thread_and_left_open(llm):
    settings = Settings.from_env({"AGENTQ_MODEL": "m1", "AGENTQ_ORCHESTRATOR_CONCURRENCY": "500"})
    client = openai.OpenAI(api_key="sk-test", base_url=llm.base_url, max_retries=0)
    marker = llm.script("given", [text("a"), text("b")])
    with LLMRouter(settings, client) as router:
        replies = on_threads(2, lambda i: router.chat(
            [{"role": "user", "content": f"hi {marker}"}], []).content)
    assert sorted(replies) == ["a", "b"]
    assert not client.is_closed()
    client.close()
    llm.assert_done()
