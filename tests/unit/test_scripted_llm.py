"""The scripted server itself: records, concurrency, keep-alive, the standalone mode."""
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2
import pytest

from agentq.testing.scripted_llm import (
    EMBEDDING_DIM,
    ScriptedLLM,
    call,
    embedding_vector,
    error,
    hang,
    react_responder,
    text,
    tool_calls,
)

REPO = Path(__file__).resolve().parents[2]


def chat(client, content, model="m"):
    response = client.post("/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": content}]})
    return response.status_code, response.json()


def chat_messages(client, messages):
    return client.post("/chat/completions", json={"model": "m", "messages": messages}).json()


@pytest.fixture
def llm():
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
def client(llm):
    with httpx2.Client(base_url=llm.base_url) as c:
        yield c


def test_scripted_replies_in_order(llm, client):
    marker = llm.script("k", [text("one"), tool_calls(call("math.evaluate", {"x": 1}, id="c1"))])
    assert marker == "script:k"
    _, first = chat(client, f"go {marker}")
    assert first["choices"][0]["message"]["content"] == "one"
    assert first["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    _, second = chat(client, f"again {marker} script:other")
    message = second["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [{"type": "function", "id": "c1", "function": {
        "name": "math-evaluate", "arguments": '{"x": 1}'}}]
    assert [r["messages"][0]["content"] for r in llm.requests("k")] == [
        f"go {marker}", f"again {marker} script:other"]
    assert llm.calls == 2
    llm.assert_done()


def test_unexpected_calls_are_recorded_and_fail_assert_done(llm, client):
    llm.script("known", [text("x")])
    assert chat(client, "no marker")[0] == 500
    assert chat(client, "script:nobody")[0] == 500
    assert chat(client, "script:known")[0] == 200
    assert chat(client, "script:known")[0] == 500  # used up
    assert [u["key"] for u in llm.unexpected] == [None, "nobody", "known"]
    with pytest.raises(AssertionError, match="used up"):
        llm.assert_done("known")
    with pytest.raises(AssertionError, match="nobody"):
        llm.assert_done()


def test_leftovers_and_check_failures_fail_assert_done(llm, client):
    def no_tools(request):
        assert "tools" in request, "tools were not offered"

    llm.script("a", [text("x", check=no_tools, expect_model="other"), text("unused")])
    llm.script("b", [text("fine")])
    chat(client, "script:a")
    chat(client, "script:b")
    llm.assert_done("b")
    with pytest.raises(AssertionError) as info:
        llm.assert_done("a")
    message = str(info.value)
    assert "tools were not offered" in message
    assert "expected model 'other'" in message
    assert "unused replies" in message and "text('unused')" in message


def test_error_replies_carry_status_and_headers(llm, client):
    llm.script("e", [error(429, "slow down", headers={"retry-after": "1"})])
    response = client.post("/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "script:e"}]})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["message"] == "slow down"


def test_responder_answers_what_scripts_do_not():
    responder = react_responder(tool_turns=2)
    with ScriptedLLM(responder=responder) as llm, httpx2.Client(base_url=llm.base_url) as client:
        messages = [{"role": "user", "content": "what is 6*7?"}]
        for _ in range(2):
            reply = chat_messages(client, messages)
            message = reply["choices"][0]["message"]
            assert message["tool_calls"][0]["function"]["name"] == "math-evaluate"
            messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                   "content": "42"}]
        reply = chat_messages(client, messages)
        assert reply["choices"][0]["message"]["content"] == "The answer is 42."
        assert llm.unexpected == []


def test_max_in_flight_under_concurrency():
    concurrency = 32
    with ScriptedLLM(latency_s=0.5, responder=lambda request: text("ok")) as llm, \
            httpx2.Client(base_url=llm.base_url) as client:  # a pool: one connection a thread
        barrier = threading.Barrier(concurrency)
        statuses = []

        def one():
            barrier.wait()
            statuses.append(chat(client, "hi")[0])

        threads = [threading.Thread(target=one) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert statuses == [200] * concurrency
        # the latency is waited concurrently: every request was in flight at once
        assert llm.max_in_flight == concurrency
        assert llm.in_flight == 0
        stats = llm.stats()
        assert stats["calls"] == concurrency and stats["requests_per_s"] > 0


def test_sequential_calls_share_one_keep_alive_connection(llm, client):
    """How fast they are is measured by `python -m benchmarks.keepalive`, not here."""
    llm.responder = lambda request: text("ok")
    for _ in range(50):
        assert chat(client, "hi")[0] == 200
    assert llm.calls == 50
    assert llm.http.connections_opened == 1  # every call on the first connection


def test_embeddings_and_models(llm, client):
    body = client.post("/embeddings", json={"model": "e", "input": ["a", "b"]}).json()
    assert [d["embedding"] for d in body["data"]] == [embedding_vector("a"), embedding_vector("b")]
    assert len(body["data"][0]["embedding"]) == EMBEDDING_DIM
    assert sum(v * v for v in embedding_vector("a")) == pytest.approx(1.0)
    assert embedding_vector("a") != embedding_vector("b")
    b64 = client.post("/embeddings", json={"model": "e", "input": "a",
                                           "encoding_format": "base64"}).json()
    assert isinstance(b64["data"][0]["embedding"], str)
    assert client.get("/models").json()["data"][0]["id"] == "scripted"
    assert client.get("/nowhere").status_code == 404
    assert llm.calls == 0 and llm.embedding_calls == 2


def test_stop_does_not_wait_for_hanging_replies():
    llm = ScriptedLLM().start()
    llm.script("h", [hang(3600)])
    with httpx2.Client(base_url=llm.base_url, timeout=0.2) as c:
        with pytest.raises(httpx2.TimeoutException):
            chat(c, "script:h")
    # the reply hangs for an hour: stop() returning at all shows it did not wait for it
    stopper = threading.Thread(target=llm.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=240)
    assert not stopper.is_alive()


def test_standalone_mode_prints_its_base_url():
    process = subprocess.Popen(
        [sys.executable, "-m", "agentq.testing.scripted_llm", "--port", "0", "--latency", "0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        with httpx2.Client(base_url=base_url) as c:
            reply = chat(c, "what is 6*7?")[1]
            [tool_call] = reply["choices"][0]["message"]["tool_calls"]
            assert tool_call["function"]["name"] == "math-evaluate"
            assert c.get("/stats").json()["calls"] == 1
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert process.returncode == 0
    assert json.loads(err.strip().splitlines()[-1])["calls"] == 1


def test_a_storm_answers_until_calm_then_the_script_resumes(llm, client):
    llm.script("st", [text("after the storm")])
    llm.storm("st", [error(429, headers={"retry-after": "2"}), error(500)])
    statuses = [chat(client, "script:st")[0] for _ in range(3)]
    assert statuses == [429, 500, 429]
    llm.calm("st")
    status, body = chat(client, "script:st")
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "after the storm"
    assert llm.storm_served["st"] == 3
    llm.assert_done("st")


@pytest.mark.parametrize("stream", [False, True])
def test_a_held_reply_outlasts_the_clients_read_timeout(stream):
    # given a reply held for longer than the client's read timeout (1 s), the server sending
    # a blank every 0.1 s meanwhile
    import openai
    released = threading.Event()
    with ScriptedLLM(hold_keepalive_s=0.1) as llm:
        marker = llm.script("held", [text("late answer", hold=released)])
        sdk = openai.OpenAI(base_url=llm.base_url, api_key="test", timeout=1.0, max_retries=0)
        out: list = []

        def ask():
            try:
                messages = [{"role": "user", "content": f"go {marker}"}]
                if stream:
                    chunks = sdk.chat.completions.create(model="m", messages=messages,
                                                         stream=True)
                    out.append("".join(c.choices[0].delta.content or "" for c in chunks
                                       if c.choices))
                else:
                    reply = sdk.chat.completions.create(model="m", messages=messages)
                    out.append(reply.choices[0].message.content)
            except Exception as exc:  # noqa: BLE001 - the assertion shows it
                out.append(exc)
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        while not llm.requests("held"):
            time.sleep(0.01)
        # when the test lets it go only after three read timeouts' worth of time
        time.sleep(3.0)
        assert asker.is_alive() and not out, out
        released.set()
        asker.join(timeout=60)
        # then the client got the reply, not a timeout
        assert out == ["late answer"]
        llm.assert_done()
