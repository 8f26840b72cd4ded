"""The model catalogue (API.md 1.2, "Models and providers"): one fallback chain crosses
providers. The primary model is not in the catalogue, so it goes to OPENAI_BASE_URL (the
suite's scripted server); the fallback is the catalogue's, on a second scripted server with
a key of its own. The first provider storms (500s): the jobs are answered by the second,
and the first's circuit opens while the second's stays closed (a gate per provider)."""
from __future__ import annotations

import json

import pytest
import redis

from agentq.llm.gate import KEY_PREFIX, provider_name
from agentq.testing.scripted_llm import ScriptedLLM, error, text
from tests.support.api import TEST_ENV, Client, uid
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_providers(servers_up, llm, tmp_path_factory):
    other = ScriptedLLM().start()
    models = {"other-model": {"base_url": other.base_url, "api_key_env": "OTHER_PROVIDER_KEY",
                              "context_window": 32768}}
    env = {**TEST_ENV, "AGENTQ_MODEL": "primary-model", "AGENTQ_FALLBACK_MODELS": "other-model",
           "AGENTQ_MODELS": json.dumps(models), "OTHER_PROVIDER_KEY": "sk-other-provider",
           # the first provider's circuit opens after 3 transient failures, for a minute
           "AGENTQ_PROVIDER_BREAKER_FAILURES": "3", "AGENTQ_PROVIDER_BREAKER_OPEN_S": "60"}
    try:
        with own_stack("catalogue", llm.base_url, tmp_path_factory.mktemp("catalogue"),
                       env) as stack:
            yield stack, Client(stack, stack.create_key("catalogue", admin=True)), other
    finally:
        other.stop()


def breaker(stack, base_url: str) -> str:
    client = redis.Redis.from_url(stack.env["AGENTQ_BROKER_URL"])
    try:
        state = client.hget(f"{KEY_PREFIX}{provider_name(base_url)}:breaker", "state")
    finally:
        client.close()
    return state.decode() if state else "closed"


def test_a_storm_at_one_provider_falls_back_to_a_model_of_another(two_providers, llm):
    stack, client, other = two_providers
    key = uid("xprov").replace("-", "_")
    other.script(key, [text("answered by the other provider")] * 3)
    llm.storm(key, [error(500, "overloaded")])
    try:
        first = client.wait(client.submit(f"script:{key} hello")["id"])
        assert first["status"] == "completed", first
        assert first["response"]["content"] == "answered by the other provider"
        stormed = len(llm.requests(key))
        assert stormed == 3  # the primary, tried and retried (AGENTQ_LLM_RETRIES=2)
        assert {r["model"] for r in llm.requests(key)} == {"primary-model"}
        assert breaker(stack, llm.base_url) == "open"
        # while the first provider's circuit is open, jobs go straight to the other one
        for _ in range(2):
            job = client.wait(client.submit(f"script:{key} again")["id"])
            assert job["status"] == "completed", job
            assert job["response"]["content"] == "answered by the other provider"
        assert len(llm.requests(key)) == stormed
        assert [r["model"] for r in other.requests(key)] == ["other-model"] * 3
        assert breaker(stack, other.base_url) == "closed"
        # each provider got its own key: the catalogue's variable, and OPENAI_API_KEY
        assert other.authorizations["Bearer sk-other-provider"] >= 3
        assert "Bearer sk-other-provider" not in llm.authorizations
        other.assert_done(key)
    finally:
        llm.calm(key)
