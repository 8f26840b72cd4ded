"""LLMRouter against a real ScriptedLLM: the real openai SDK over loopback HTTP."""
import copy
import logging
import time

import openai
import pytest

from agentq.config import Settings
from agentq.errors import ProviderError, ProviderTimeout
from agentq.llm.router import LLMRouter
from agentq.llm.types import ToolSpec
from agentq.testing.scripted_llm import (
    ScriptedLLM,
    call,
    embedding_vector,
    error,
    function_call,
    hang,
    text,
    tool_calls,
)

EVALUATE = ToolSpec("math.evaluate", "Evaluate an arithmetic expression.",
                    {"type": "object", "properties": {"expression": {"type": "string"}},
                     "required": ["expression"]})
READ = ToolSpec("files.read_file", "Read a file.", {"type": "object", "properties": {}})


@pytest.fixture
def llm():
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
def make_router(llm):
    clients = []

    def make(**env):
        settings = Settings.from_env({
            "AGENTQ_MODEL": "m1", "AGENTQ_FALLBACK_MODELS": "m2",
            "AGENTQ_LLM_RETRIES": "2", "AGENTQ_LLM_RETRY_BASE_S": "0.001",
            "AGENTQ_LLM_RETRY_MAX_S": "0.01", "AGENTQ_LLM_TIMEOUT_S": "5", **env})
        client = openai.OpenAI(api_key="sk-test", base_url=llm.base_url, max_retries=0)
        clients.append(client)
        return LLMRouter(settings, client)

    yield make
    for client in clients:
        client.close()


def user(marker, content="hi"):
    return [{"role": "system", "content": "be brief"},
            {"role": "user", "content": f"{content} {marker}"}]


def test_plain_text(llm, make_router):
    marker = llm.script("plain", [text("hello", input_tokens=12, output_tokens=3)])
    reply = make_router().chat(user(marker), [], max_tokens=50)
    assert reply.content == "hello"
    assert reply.tool_calls == ()
    assert reply.stop_reason == "end_turn"
    assert (reply.model, reply.input_tokens, reply.output_tokens) == ("m1", 12, 3)
    assert not reply.usage_estimated and reply.attempts == ()
    [request] = llm.requests("plain")
    assert "tools" not in request and request["max_tokens"] == 50
    assert request["model"] == "m1"
    llm.assert_done()


def test_default_client_from_the_sdk_env(llm, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    marker = llm.script("env", [text("ok")])
    with LLMRouter(Settings.from_env({"AGENTQ_MODEL": "m9"})) as router:
        assert router.chat(user(marker), []).model == "m9"
    llm.assert_done()


def test_tool_calls_are_mapped_back_to_our_names(llm, make_router):
    marker = llm.script("tools", [tool_calls(
        call("math.evaluate", {"expression": "6*7"}, id="call_a"),
        call("files.read_file", {}, id="call_b"))])
    reply = make_router().chat(user(marker), [EVALUATE, READ])
    assert reply.stop_reason == "tool_use"
    assert reply.content == ""  # the server sent null
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_a", "math.evaluate", {"expression": "6*7"}), ("call_b", "files.read_file", {})]
    [request] = llm.requests("tools")
    assert [t["function"]["name"] for t in request["tools"]] == ["math-evaluate",
                                                                 "files-read_file"]
    assert request["tools"][0] == {"type": "function", "function": {
        "name": "math-evaluate", "description": EVALUATE.description,
        "parameters": EVALUATE.parameters}}


def test_bad_arguments_become_arguments_error(llm, make_router):
    marker = llm.script("args", [tool_calls(
        call("math.evaluate", "{not json"), call("math.evaluate", "[1, 2]"),
        call("math.evaluate", ""), call("unknown-tool", '{"a": 1}', raw=True))])
    calls = make_router().chat(user(marker), [EVALUATE]).tool_calls
    assert calls[0].arguments is None and "not valid JSON" in calls[0].arguments_error
    assert calls[0].raw_arguments == "{not json"
    assert calls[1].arguments is None and "JSON object" in calls[1].arguments_error
    assert calls[2].arguments == {} and calls[2].arguments_error is None
    assert (calls[3].name, calls[3].arguments) == ("unknown.tool", {"a": 1})


def test_legacy_function_call_and_missing_ids(llm, make_router):
    marker = llm.script("legacy", [
        function_call("math.evaluate", {"expression": "1"}),
        tool_calls(call("math.evaluate", {}, omit_id=True),
                   call("math.evaluate", {}, omit_id=True)),
    ])
    router = make_router()
    [legacy] = router.chat(user(marker), [EVALUATE]).tool_calls
    assert legacy.name == "math.evaluate" and legacy.arguments == {"expression": "1"}
    assert legacy.id.startswith("call_") and len(legacy.id) == len("call_") + 24
    first, second = router.chat(user(marker), [EVALUATE]).tool_calls
    assert first.id.startswith("call_") and first.id != second.id


def test_missing_usage_is_estimated(llm, make_router):
    marker = llm.script("usage", [text("12345678", usage=False)])
    messages = user(marker)
    reply = make_router().chat(messages, [])
    assert reply.usage_estimated
    assert reply.output_tokens == 2
    chars = sum(len(m["content"]) for m in messages)
    assert reply.input_tokens == -(-chars // 4)


def test_length_finish_and_model_field(llm, make_router):
    marker = llm.script("len", [text("cut", finish_reason="length", model="m1-2024-01-01")])
    reply = make_router().chat(user(marker), [])
    assert reply.stop_reason == "max_tokens"
    assert reply.model == "m1-2024-01-01"


def test_429_retry_after_is_honoured(llm, make_router, caplog):
    marker = llm.script("rate", [error(429, "slow down", headers={"retry-after": "0.3"}),
                                 text("ok", expect_model="m1")])
    router = make_router(AGENTQ_LLM_RETRY_MAX_S="0.5")
    waited: list[float] = []
    router._sleep = waited.append  # the waits it takes, not how long the machine took
    with caplog.at_level(logging.INFO, logger="agentq.llm.router"):
        reply = router.chat(user(marker, "secret words"), [])
    assert waited == [pytest.approx(0.3)]  # the server's Retry-After, waited out once
    assert reply.content == "ok" and reply.model == "m1"
    assert reply.attempts == ({"model": "m1", "status": 429, "error": "RateLimitError: slow down"},)
    [retry] = [r for r in caplog.records if getattr(r, "event", None) == "llm.retry"]
    assert (retry.model, retry.status, retry.attempt) == ("m1", 429, 1)
    assert retry.wait_s == pytest.approx(0.3)
    assert "secret words" not in caplog.text and "sk-test" not in caplog.text
    llm.assert_done()


def test_retry_after_longer_than_the_cap_is_not_honoured(llm, make_router, caplog):
    marker = llm.script("long", [error(503, headers={"retry-after": "30"}), text("ok")])
    router = make_router()
    with caplog.at_level(logging.INFO, logger="agentq.llm.router"):
        assert router.chat(user(marker), []).content == "ok"
    [retry] = [r for r in caplog.records if getattr(r, "event", None) == "llm.retry"]
    assert retry.wait_s <= router._settings.llm_retry_max_s


def test_5xx_exhausts_a_model_then_falls_back(llm, make_router):
    marker = llm.script("fb", [error(500, "boom")] * 3 + [text("ok", expect_model="m2")])
    reply = make_router().chat(user(marker), [])
    assert reply.model == "m2"
    assert [(a["model"], a["status"]) for a in reply.attempts] == [("m1", 500)] * 3
    assert [r["model"] for r in llm.requests("fb")] == ["m1", "m1", "m1", "m2"]
    llm.assert_done()


def test_non_retryable_error_goes_straight_to_the_next_model(llm, make_router):
    marker = llm.script("bad", [error(400, "bad request"), text("ok", expect_model="m2")])
    reply = make_router(AGENTQ_LLM_RETRIES="5").chat(user(marker), [])
    assert reply.model == "m2"
    assert [(a["model"], a["status"]) for a in reply.attempts] == [("m1", 400)]
    llm.assert_done()


def test_chain_is_deduplicated_and_explicit_model_first(llm, make_router):
    router = make_router(AGENTQ_FALLBACK_MODELS="m2,m1,m2,m3")
    assert router.chain() == ["m1", "m2", "m3"]
    assert router.chain("m3") == ["m3", "m2", "m1"]
    marker = llm.script("explicit", [error(404), text("ok", expect_model="m2")])
    assert router.chat(user(marker), [], model="m3").model == "m2"
    llm.assert_done()


def test_all_models_fail_with_a_provider_error(llm, make_router):
    marker = llm.script("fail", [error(500)] * 3
                        + [error(401, "Incorrect API key sk-abcdef123456")])
    with pytest.raises(ProviderError) as info:
        make_router().chat(user(marker), [])
    assert not isinstance(info.value, ProviderTimeout)
    assert [(a["model"], a["status"]) for a in info.value.attempts] == (
        [("m1", 500)] * 3 + [("m2", 401)])
    assert "abcdef123456" not in str(info.value.attempts)
    assert info.value.details["attempts"] == info.value.attempts
    llm.assert_done()


def test_timeouts_everywhere_raise_provider_timeout(llm, make_router):
    marker = llm.script("slow", [hang(3)] * 4)
    router = make_router(AGENTQ_LLM_TIMEOUT_S="0.2", AGENTQ_LLM_RETRIES="1")
    with pytest.raises(ProviderTimeout) as info:
        router.chat(user(marker), [])
    assert info.value.timeout_s == 0.2
    assert [(a["model"], a["status"]) for a in info.value.attempts] == [
        ("m1", None), ("m1", None), ("m2", None), ("m2", None)]
    assert all(a["error"].startswith("timeout") for a in info.value.attempts)
    llm.assert_done()


def test_a_timeout_then_success(llm, make_router):
    marker = llm.script("once", [hang(3), text("ok")])
    reply = make_router(AGENTQ_LLM_TIMEOUT_S="0.2").chat(user(marker), [])
    assert (reply.content, reply.model) == ("ok", "m1")
    assert reply.attempts[0]["error"].startswith("timeout")


def test_history_names_are_sent_as_api_names(llm, make_router):
    marker = llm.script("hist", [text("42")])
    messages = user(marker) + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "math.evaluate", "arguments": {"expression": "6*7"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    before = copy.deepcopy(messages)
    assert make_router().chat(messages, []).content == "42"
    assert messages == before  # the caller's history is untouched
    [request] = llm.requests("hist")
    sent = request["messages"][2]["tool_calls"][0]["function"]
    assert sent == {"name": "math-evaluate", "arguments": '{"expression": "6*7"}'}
    assert "tools" not in request


def test_embed(llm, make_router):
    router = make_router()
    assert router.embed("hello") == pytest.approx(embedding_vector("hello"))
    marker = llm.script("emb", [error(500), error(502)])
    assert router.embed(f"hello {marker}", model="e1") == pytest.approx(
        embedding_vector(f"hello {marker}"))
    llm.script("emb", [error(400)])
    with pytest.raises(ProviderError) as info:
        router.embed(f"x {marker}")
    assert info.value.attempts[0]["status"] == 400
    llm.assert_done()


# --- transient or not: a job waits for its provider, or fails at once ----------------------

@pytest.mark.parametrize("failures, retry_after", [
    ([error(429, headers={"retry-after": "3"})] * 3 + [error(429)] * 3, 3.0),
    ([error(500)] * 3 + [error(503, headers={"retry-after-ms": "1500"})] * 3, 1.5),
    ([error(502)] * 6, None),
])
def test_transient_failures_of_the_whole_chain_are_marked_transient(
        llm, make_router, failures, retry_after):
    marker = llm.script("storm", failures)
    with pytest.raises(ProviderError) as info:
        make_router(AGENTQ_LLM_RETRY_MAX_S="0.01").chat(user(marker), [])
    assert info.value.transient is True
    assert info.value.retry_after_s == retry_after
    llm.assert_done()


def test_timeouts_are_transient(llm, make_router):
    marker = llm.script("slow2", [hang(3)] * 2)
    with pytest.raises(ProviderTimeout) as info:
        make_router(AGENTQ_LLM_TIMEOUT_S="0.2", AGENTQ_LLM_RETRIES="0").chat(user(marker), [])
    assert info.value.transient is True
    llm.assert_done()


@pytest.mark.parametrize("last", [400, 401, 404])
def test_a_non_transient_error_anywhere_in_the_chain_is_not_transient(llm, make_router, last):
    marker = llm.script("mixed", [error(500)] * 3 + [error(last)])
    with pytest.raises(ProviderError) as info:
        make_router().chat(user(marker), [])
    assert info.value.transient is False
    llm.assert_done()


# --- a cancel (issue 31 item 3) ----------------------------------------------------------------

def _length_with_tools():
    import dataclasses
    return dataclasses.replace(tool_calls(call("math.evaluate", '{"expression": "1+')),
                               finish_reason="length")


def test_a_reply_cut_while_asking_for_tools_says_it_was_cut(llm, make_router):
    marker = llm.script("cut", [_length_with_tools()])
    reply = make_router().chat(user(marker), [EVALUATE])
    assert reply.stop_reason == "max_tokens"
    assert [c.arguments for c in reply.tool_calls] == [None]  # its JSON was cut short


def test_a_call_whose_job_is_cancelled_already_is_not_made(llm, make_router):
    from agentq.llm.cancel import CallCancelled, CancelToken, cancellable
    marker = llm.script("before", [text("never")])
    token = CancelToken()
    token.cancel()
    with cancellable(token), pytest.raises(CallCancelled):
        make_router().chat(user(marker), [])
    assert llm.requests("before") == []


def test_a_cancel_after_a_failed_attempt_stops_the_retries_and_fallbacks(llm, make_router):
    from agentq.llm.cancel import CallCancelled, CancelToken, cancellable
    token = CancelToken()
    # the server fails the first attempt, and the job is cancelled while it does
    marker = llm.script("between", [error(500, check=lambda _request: token.cancel())])
    with cancellable(token), pytest.raises(CallCancelled):
        make_router().chat(user(marker), [])
    assert len(llm.requests("between")) == 1  # no retry, no fallback model


def test_a_cancel_aborts_the_call_in_flight(llm, monkeypatch):
    """The router's own clients (agentq.llm.clients): the blocked read ends at once and
    the server sees its client go away."""
    import threading

    from agentq.llm.cancel import CallCancelled, CancelToken, cancellable
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    never = threading.Event()
    marker = llm.script("inflight", [text("late", hold=never)])
    token, outcome = CancelToken(), {}

    def ask(router):
        with cancellable(token):
            try:
                outcome["reply"] = router.chat(user(marker), [])
            except CallCancelled as exc:
                outcome["cancelled"] = exc

    try:
        with LLMRouter(Settings.from_env({"AGENTQ_MODEL": "m1",
                                          "AGENTQ_LLM_TIMEOUT_S": "30"})) as router:
            asking = threading.Thread(target=ask, args=(router,))
            asking.start()
            deadline = time.monotonic() + 30
            while not llm.requests("inflight") and time.monotonic() < deadline:
                time.sleep(0.01)
            token.cancel()
            asking.join(30)
            assert not asking.is_alive() and "cancelled" in outcome, outcome
            while llm.abandoned == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert llm.abandoned == 1 and len(llm.requests("inflight")) == 1
            # the client goes on: the next call is made on a connection of its own
            again = llm.script("after", [text("fine")])
            assert router.chat(user(again), []).content == "fine"
    finally:
        never.set()
    llm.assert_done()
