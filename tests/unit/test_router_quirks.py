"""The router against what a real OpenAI-compatible server sent: llama.cpp's
`python -m llama_cpp.server --chat_format chatml-function-calling` with SmolLM2-135M.

The bodies in fixtures/llama_cpp/ were recorded from that server (each file says how). A tiny
raw HTTP server replays them byte for byte to the real openai SDK inside the router; where a
test changes a recorded body to show a quirk the server did not happen to produce, it says so.
"""
from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest

from agentq.config import Settings
from agentq.llm.router import LLMRouter
from agentq.llm.types import ToolSpec
from agentq.llm.wire import CALL_ID_MAX_CHARS
from agentq.loop.decision import Finish, RunTools, decide

FIXTURES = Path(__file__).parent / "fixtures" / "llama_cpp"
EVALUATE = ToolSpec("math.evaluate", "Evaluate an arithmetic expression.",
                    {"type": "object", "properties": {"expression": {"type": "string"}},
                     "required": ["expression"]})
NOW = ToolSpec("time.now", "The current time.", {"type": "object", "properties": {}})
TOOLS = [EVALUATE, NOW]
SAFE_ID_RE = re.compile(r"[A-Za-z0-9_.-]+")


def recorded(name: str) -> list[tuple[int, dict]]:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return [(e["status"], e["body"]) for e in data["exchanges"]]


class Replay:
    """Answers each POST with the next (status, body) queued; keeps the request bodies."""

    def __init__(self) -> None:
        self.queue: list[tuple[int, dict]] = []
        self.requests: list[dict] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("content-length") or 0)
                replay.requests.append(json.loads(self.rfile.read(length) or b"{}"))
                status, body = replay.queue.pop(0) if replay.queue else (
                    599, {"error": {"message": "nothing left to replay"}})
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "Replay":
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replay():
    with Replay() as server:
        yield server
    assert not server.queue, f"recorded answers left unused: {server.queue}"


@pytest.fixture
def make_router(replay):
    clients = []

    def make(**env) -> LLMRouter:
        settings = Settings.from_env({"AGENTQ_MODEL": "smollm2-135m-instruct",
                                      "AGENTQ_LLM_RETRIES": "0", **env})
        client = openai.OpenAI(api_key="local", base_url=replay.base_url, max_retries=0)
        clients.append(client)
        return LLMRouter(settings, client)

    yield make
    for client in clients:
        client.close()


def ask(text: str = "What is 6*7? Use the calculator.") -> list[dict]:
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text}]


def message_of(body: dict) -> dict:
    return body["choices"][0]["message"]


# --- the request --------------------------------------------------------------------------

def test_tools_go_with_tool_choice_auto(replay, make_router):
    # given the recorded proof: tools without tool_choice are left out of the prompt
    [(_, ignored)] = recorded("tools_ignored_without_tool_choice")
    [(_, called)] = recorded("tool_call_and_function_call")
    assert "tool_calls" not in message_of(ignored)
    assert ignored["usage"]["prompt_tokens"] < called["usage"]["prompt_tokens"] / 5
    # when the router offers tools
    replay.queue = recorded("tool_call_and_function_call")
    make_router().chat(ask(), TOOLS)
    # then it says tool_choice auto, under the API's names
    [request] = replay.requests
    assert request["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in request["tools"]] == ["math-evaluate", "time-now"]


def test_no_tool_choice_without_tools(replay, make_router):
    replay.queue = [recorded("empty_then_text")[1]]
    make_router().chat(ask("hi"), [])
    assert "tool_choice" not in replay.requests[0] and "tools" not in replay.requests[0]


def test_null_assistant_content_is_sent_as_empty_text(replay, make_router):
    # given the recorded proof: the server answers 500 to content null beside tool_calls
    [(status, body)] = recorded("null_assistant_content_rejected")
    assert status == 500 and "Input should be a valid string" in body["error"]["message"]
    # when the history holds such a message (as the loop's context builds it)
    replay.queue = recorded("tool_call_and_function_call")
    history = ask() + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "tool_1", "type": "function",
             "function": {"name": "math.evaluate", "arguments": '{"expression": "6*7"}'}}]},
        {"role": "tool", "tool_call_id": "tool_1", "content": '{"ok": true, "result": 42}'}]
    make_router().chat(history, TOOLS)
    # then it goes out as "", the caller's list untouched
    sent = replay.requests[0]["messages"][2]
    assert sent["content"] == "" and sent["tool_calls"][0]["function"]["name"] == "math-evaluate"
    assert history[2]["content"] is None


def test_max_tokens_per_request_caps_every_call(replay, make_router):
    replay.queue = recorded("empty_then_text")[1:] * 3
    router = make_router(AGENTQ_MAX_TOKENS_PER_REQUEST="256")
    router.chat(ask("hi"), [])
    router.chat(ask("hi"), [], max_tokens=100)
    router.chat(ask("hi"), [], max_tokens=5000)
    assert [r["max_tokens"] for r in replay.requests] == [256, 100, 256]


# --- the reply ----------------------------------------------------------------------------

def test_function_call_beside_tool_calls_is_ignored(replay, make_router):
    # given a recorded reply whose legacy function_call names another tool, with a ':'
    replay.queue = recorded("tool_call_and_function_call")
    [(_, body)] = recorded("tool_call_and_function_call")
    legacy, [call] = message_of(body)["function_call"], message_of(body)["tool_calls"]
    assert legacy["name"].endswith(":") and legacy["name"] != call["function"]["name"]
    # when the router reads it
    reply = make_router().chat(ask(), TOOLS)
    # then the one call is the one in tool_calls, with its id and real usage
    [parsed] = reply.tool_calls
    assert (parsed.id, parsed.name) == (call["id"], "math.evaluate")
    assert parsed.arguments == json.loads(call["function"]["arguments"])
    assert reply.stop_reason == "tool_use" and reply.content == ""
    assert (reply.input_tokens, reply.output_tokens) == (body["usage"]["prompt_tokens"],
                                                         body["usage"]["completion_tokens"])
    assert not reply.usage_estimated


def test_legacy_function_call_alone_with_a_trailing_colon(replay, make_router):
    # the recorded body with its tool_calls taken away: only `function_call` is left
    [(status, body)] = recorded("invalid_json_arguments")
    body = copy.deepcopy(body)
    del message_of(body)["tool_calls"]
    assert message_of(body)["function_call"]["name"] == "math-evaluate:"
    replay.queue = [(status, body)]
    [call] = make_router().chat(ask(), TOOLS).tool_calls
    assert call.name == "math.evaluate"
    assert SAFE_ID_RE.fullmatch(call.id) and call.id.startswith("call_")


def test_arguments_that_are_not_json_go_back_as_a_tool_error(replay, make_router):
    # given a recorded call whose arguments hold a raw newline inside a string
    replay.queue = recorded("invalid_json_arguments")
    reply = make_router().chat(ask(), TOOLS)
    # then the router keeps the raw text and says why, without raising
    [call] = reply.tool_calls
    assert call.arguments is None and call.raw_arguments.startswith('{"expression": ")')
    assert "not valid JSON" in call.arguments_error
    # and the loop's decision answers the call with an error the model will read
    decision = decide(reply, [t.name for t in TOOLS])
    assert isinstance(decision, RunTools)
    [planned] = decision.calls
    assert planned.error["code"] == "invalid_arguments"
    assert "not a JSON object" in planned.error["message"]


@pytest.mark.parametrize(("raw_id", "raw_name"), [
    ("call__0_math-evaluate:", "math-evaluate:"),
    ("call 0 / math-evaluate", " functions.math-evaluate: "),
    ("call\n0\t\"x\"", "`math-evaluate`"),
    ("c" * 400, "'math-evaluate'"),
    (17, "math-evaluate"),
    ("", "math.evaluate"),
    (":::", "functions.math-evaluate"),
])
def test_odd_ids_and_names(replay, make_router, raw_id, raw_name):
    # the recorded tool call with its id and name replaced
    [(status, body)] = recorded("tool_call_and_function_call")
    body = copy.deepcopy(body)
    call = message_of(body)["tool_calls"][0]
    call["id"], call["function"]["name"] = raw_id, raw_name
    replay.queue = [(status, body), (status, copy.deepcopy(body))]
    router = make_router()
    [first] = router.chat(ask(), TOOLS).tool_calls
    [second] = router.chat(ask(), TOOLS).tool_calls
    assert first.name == "math.evaluate"
    assert SAFE_ID_RE.fullmatch(first.id) and len(first.id) <= CALL_ID_MAX_CHARS
    assert not first.id.endswith(":")
    if isinstance(raw_id, str) and raw_id.strip(":"):
        assert first.id == second.id  # the same odd id always cleans to the same id


def test_long_ids_keep_a_prefix_and_stay_distinct(replay, make_router):
    [(status, body)] = recorded("tool_call_and_function_call")
    ids = []
    for suffix in "ab":
        changed = copy.deepcopy(body)
        message_of(changed)["tool_calls"][0]["id"] = "call_" + "x" * 300 + suffix
        replay.queue.append((status, changed))
    router = make_router()
    for _ in "ab":
        ids.append(router.chat(ask(), TOOLS).tool_calls[0].id)
    assert all(i.startswith("call_xxx") and len(i) == CALL_ID_MAX_CHARS for i in ids)
    assert ids[0] != ids[1]


# --- missing usage ------------------------------------------------------------------------

def without_usage(name: str) -> list[tuple[int, dict]]:
    """A recorded exchange with its `usage` taken away (llama.cpp always sends it; other
    servers and proxies do not)."""
    answers = []
    for status, body in recorded(name):
        body = copy.deepcopy(body)
        del body["usage"]
        answers.append((status, body))
    return answers


def test_missing_usage_counts_characters_by_default(replay, make_router):
    replay.queue = without_usage("empty_then_text")[1:]
    messages = ask("Hi! Who are you?")
    reply = make_router().chat(messages, [])
    assert reply.usage_estimated
    assert reply.output_tokens == -(-len(reply.content) // 4)
    assert reply.input_tokens == -(-sum(len(m["content"]) for m in messages) // 4)


def test_missing_usage_counts_with_the_models_own_tokenizer(replay, make_router):
    llama_cpp = pytest.importorskip("llama_cpp", reason="the `local` extra is not installed")
    from agentq.local_model import LocalModelError, find_model
    try:
        path, _alias = find_model()
    except LocalModelError as exc:
        pytest.skip(str(exc))
    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)

    def tokens(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=True))

    replay.queue = without_usage("tool_call_and_function_call")
    reply = make_router(AGENTQ_TOKENIZER=str(path)).chat(ask(), TOOLS)
    [call] = reply.tool_calls
    assert reply.usage_estimated
    assert reply.output_tokens == tokens("math-evaluate") + tokens(call.raw_arguments)
    # the model's tokenizer, not characters / 4
    assert reply.output_tokens != -(-(len("math-evaluate") + len(call.raw_arguments)) // 4)
    request = replay.requests[0]
    expected_in = tokens(json.dumps(request["tools"])) + sum(
        tokens(m["content"]) for m in request["messages"])
    assert reply.input_tokens == expected_in


def test_an_unloadable_tokenizer_falls_back_to_characters(replay, make_router, tmp_path):
    replay.queue = without_usage("empty_then_text")[1:]
    missing = tmp_path / "no-such-model.gguf"
    reply = make_router(AGENTQ_TOKENIZER=str(missing)).chat(ask("Hi! Who are you?"), [])
    assert reply.usage_estimated and reply.output_tokens == -(-len(reply.content) // 4)


# --- empty replies ------------------------------------------------------------------------

def test_empty_reply_is_asked_again_for_text(replay, make_router):
    # given the recorded pair: "" with tools offered, then text with tool_choice none
    replay.queue = recorded("empty_then_text")
    (_, empty), (_, text) = recorded("empty_then_text")
    assert message_of(empty)["content"] == "" and "tool_calls" not in message_of(empty)
    # when the router meets the empty one
    reply = make_router().chat(ask("Hi! Who are you?"), TOOLS)
    # then it asked once more, with tool_choice none, and counts both calls
    first, again = replay.requests
    assert first["tool_choice"] == "auto" and again["tool_choice"] == "none"
    assert again["messages"] == first["messages"]
    assert reply.content == message_of(text)["content"] and reply.tool_calls == ()
    assert reply.input_tokens == (empty["usage"]["prompt_tokens"]
                                  + text["usage"]["prompt_tokens"])
    assert reply.output_tokens == (empty["usage"]["completion_tokens"]
                                   + text["usage"]["completion_tokens"])
    assert isinstance(decide(reply, ["math.evaluate"]), Finish)


def test_the_formats_own_marker_alone_counts_as_empty(replay, make_router):
    # the recorded empty reply with the content the same grammar also allows
    (status, empty), answer = recorded("empty_then_text")
    empty = copy.deepcopy(empty)
    message_of(empty)["content"] = "functions.math-evaluate:"
    replay.queue = [(status, empty), answer]
    reply = make_router().chat(ask("Hi! Who are you?"), TOOLS)
    assert reply.content == message_of(answer[1])["content"]
    assert len(replay.requests) == 2


def test_empty_twice_stays_empty_and_is_not_asked_a_third_time(replay, make_router):
    (status, empty), _ = recorded("empty_then_text")
    replay.queue = [(status, empty), (status, copy.deepcopy(empty))]
    reply = make_router().chat(ask("Hi! Who are you?"), TOOLS)
    assert reply.content == "" and reply.tool_calls == () and reply.stop_reason == "end_turn"
    assert len(replay.requests) == 2


def test_a_failed_second_ask_keeps_the_empty_reply(replay, make_router):
    (status, empty), _ = recorded("empty_then_text")
    [failure] = recorded("null_assistant_content_rejected")
    replay.queue = [(status, empty), failure]
    reply = make_router().chat(ask("Hi! Who are you?"), TOOLS)
    assert reply.content == "" and reply.model == empty["model"]
    assert [a["status"] for a in reply.attempts] == [500]


def test_empty_reply_without_tools_is_not_asked_again(replay, make_router):
    (status, empty), _ = recorded("empty_then_text")
    replay.queue = [(status, empty)]
    assert make_router().chat(ask("hi"), []).content == ""
    assert len(replay.requests) == 1


# --- tool results the chatml template keeps --------------------------------------------------

def after_a_tool_call() -> list[dict]:
    return [*ask(), {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "math.evaluate", "arguments": '{"expression": "6*7"}'}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": '{"expression": "6*7", "result": 42}'}]


def test_tool_results_go_as_user_messages_naming_the_tool_when_configured(replay, make_router):
    # chatml-function-calling renders a role-`tool` message as an empty turn: the result is lost
    replay.queue = recorded("tool_call_and_function_call")
    make_router(AGENTQ_TOOL_RESULTS_AS="user", AGENTQ_TEMPERATURE="0").chat(
        after_a_tool_call(), [])
    [request] = replay.requests
    assert [m["role"] for m in request["messages"]] == ["system", "user", "assistant", "user"]
    assert request["messages"][-1]["content"] == (
        "The tool math-evaluate returned: expression = 6*7, result = 42")
    assert '"' not in request["messages"][-1]["content"]  # the template HTML-escapes quotes
    assert request["temperature"] == 0


def test_tool_results_keep_the_tool_role_by_default(replay, make_router):
    replay.queue = recorded("tool_call_and_function_call")
    make_router().chat(after_a_tool_call(), [])
    [request] = replay.requests
    assert request["messages"][-1]["role"] == "tool"
    assert request["messages"][-1]["tool_call_id"] == "call_1"
    assert "temperature" not in request
