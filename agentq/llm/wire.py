"""Our messages and tools on the wire of an OpenAI-compatible server, and its answers back:
the Chat Completions request, the chat and embedding replies parsed from the raw JSON body
(not the SDK's models, because real servers are quirky: null content, arguments that are
not JSON, missing ids, missing usage, the legacy `function_call`), and the text of a failed
call as a job may show it (secrets scrubbed).

Quirks met in real servers (llama.cpp's `llama_cpp.server` with `chatml-function-calling`,
recorded in tests/unit/fixtures/) and what is done about them:

- tools are ignored unless `tool_choice` is sent: `"auto"` is sent whenever tools are offered;
- an assistant message with `content: null` is rejected (HTTP 500): `""` is sent instead;
- tool-call names with a `functions.` prefix, a trailing `:`, quotes or spaces: cleaned;
- tool-call ids with odd characters or longer than `CALL_ID_MAX_CHARS`: made safe;
- a `function_call` beside `tool_calls`: `tool_calls` wins, the legacy field is ignored;
- no `usage`: estimated with the tokenizer named by `AGENTQ_TOKENIZER` and marked estimated;
- neither text nor tool calls (or only the format's own `functions.<name>:` marker) when
  tools were offered: asked once more with `tool_choice: "none"`, usage of both added (the
  router's `_ask_for_text`).
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import uuid
from typing import Any, Callable, Iterable

import openai

from agentq.llm.gate import ProviderBusy
from agentq.llm.names import NameMap
from agentq.llm.tokens import count_tokens
from agentq.llm.types import LLMReply, StopReason, ToolCallRequest, ToolSpec

CALL_ID_MAX_CHARS = 128
TOOL_NAME_MAX_CHARS = 200
_ODD_ID_CHARS_RE = re.compile(r"[^A-Za-z0-9_.-]+")
_LEAKED_CALL_RE = re.compile(r"\s*(?:functions\.[\w.-]+:\s*)+")
"""Content that is only chatml-function-calling's own `functions.<name>:` marker."""
ERROR_TEXT_MAX_CHARS = 300
GENERATED_ID_HEX_CHARS = 24

_SECRET_RE = re.compile(r"\b(sk-|Bearer\s+)[A-Za-z0-9_.*-]{4,}")


class BadResponse(Exception):
    """A 2xx answer we cannot use (not JSON, no choices, no embedding)."""

    def __init__(self, message: str, status: int, retryable: bool):
        super().__init__(message)
        self.status, self.retryable = status, retryable


# --- the request ------------------------------------------------------------------------

def chat_request(messages: list[dict[str, Any]], tools: list[ToolSpec], *,
                 tool_results_as: str, temperature: float | None,
                 max_tokens: int | None) -> tuple[NameMap, dict[str, Any]]:
    """The body of a chat call without its model, and the names its tools go by on the wire."""
    names = NameMap([t.name for t in tools] + list(_history_tool_names(messages)))
    params: dict[str, Any] = {"messages": _api_messages(messages, names, tool_results_as)}
    if temperature is not None:
        params["temperature"] = temperature
    if tools:
        params["tools"] = [
            {"type": "function", "function": {"name": names.api(t.name),
                                              "description": t.description,
                                              "parameters": t.parameters}}
            for t in tools
        ]
        params["tool_choice"] = "auto"  # llama.cpp's chatml-function-calling needs it
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    return names, params


def _history_tool_names(messages: Iterable[dict[str, Any]]) -> Iterable[str]:
    for message in messages:
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                yield function["name"]
        legacy = message.get("function_call")
        if isinstance(legacy, dict) and isinstance(legacy.get("name"), str):
            yield legacy["name"]
        if message.get("role") in ("tool", "function") and isinstance(message.get("name"), str):
            yield message["name"]


def _api_function(function: dict[str, Any], names: NameMap) -> dict[str, Any]:
    mapped = dict(function)
    if isinstance(mapped.get("name"), str):
        mapped["name"] = names.api(mapped["name"])
    arguments = mapped.get("arguments")
    if isinstance(arguments, (dict, list)):
        mapped["arguments"] = json.dumps(arguments, ensure_ascii=False)
    elif arguments is None and "arguments" in mapped:
        mapped["arguments"] = ""
    return mapped


def _api_messages(messages: list[dict[str, Any]], names: NameMap,
                  tool_results_as: str = "tool") -> list[dict[str, Any]]:
    """A copy of `messages` with our tool names turned into API names (inputs untouched);
    with `tool_results_as="user"`, each role-`tool` message becomes a user message naming
    the tool and its arguments (llama.cpp's chatml-function-calling template renders a
    role-`tool` message as an empty, unterminated turn: the model never sees the result)."""
    out = []
    calls: dict[str, dict[str, Any]] = {}  # tool_call_id → the call's function
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                calls[str(call.get("id"))] = call["function"]
        if tool_results_as == "user" and message.get("role") == "tool":
            out.append({"role": "user",
                        "content": _tool_result_as_user(message, calls, names)})
            continue
        mapped = dict(message)
        if message.get("tool_calls"):
            mapped["tool_calls"] = [
                {**call, "function": _api_function(call["function"], names)}
                if isinstance(call, dict) and isinstance(call.get("function"), dict) else call
                for call in message["tool_calls"]
            ]
        if isinstance(message.get("function_call"), dict):
            mapped["function_call"] = _api_function(message["function_call"], names)
        if message.get("role") in ("tool", "function") and isinstance(message.get("name"), str):
            mapped["name"] = names.api(message["name"])
        if message.get("role") == "assistant" and message.get("content", "") is None:
            mapped["content"] = ""  # llama-cpp-python answers 500 to a null content
        out.append(mapped)
    return out


def _tool_result_as_user(message: dict[str, Any], calls: dict[str, dict[str, Any]],
                         names: NameMap) -> str:
    """`The tool math_evaluate returned: expression = 6 * 7, result = 42`: plain words, no
    JSON (the chatml template HTML-escapes quotes, and a small model copies JSON back)."""
    function = calls.get(str(message.get("tool_call_id"))) or {}
    name = function.get("name") or message.get("name") or "the tool"
    if isinstance(name, str):
        name = names.api(name)
    content = _text(message.get("content"))
    try:
        value = json.loads(content)
    except ValueError:
        value = content
    return f"The tool {name} returned: {_plain(value)}"


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} = {_plain(v)}" if not isinstance(v, dict)
                         else f"{k}: {_plain(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_plain(v) for v in value) + "]"
    if value is None:
        return "nothing"
    return str(value)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join((p.get("text") or "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _request_texts(params: dict[str, Any]) -> Iterable[str]:
    if params.get("tools"):
        yield json.dumps(params["tools"])
    for message in params["messages"]:
        if isinstance(message, dict):
            yield _text(message.get("content"))
            for call in message.get("tool_calls") or ():
                function = (call.get("function") or {}) if isinstance(call, dict) else {}
                yield str(function.get("name") or "")
                yield str(function.get("arguments") or "")



# --- the reply --------------------------------------------------------------------------

_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number",
               bool: "boolean", type(None): "null"}


def _not_an_object(value: Any) -> str:
    return f"arguments must be a JSON object, got {_JSON_TYPES.get(type(value), 'a value')}"


def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str, str | None]:
    """(arguments, raw_arguments, arguments_error) from what the server sent."""
    if raw is None:
        return {}, "", None
    if isinstance(raw, dict):  # some servers send an object, not a string
        return raw, json.dumps(raw, ensure_ascii=False), None
    if not isinstance(raw, str):
        return None, json.dumps(raw), _not_an_object(raw)
    if not raw.strip():
        return {}, raw, None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return None, raw, f"arguments are not valid JSON: {exc}"
    if not isinstance(value, dict):
        return None, raw, _not_an_object(value)
    return value, raw, None


def _generated_id() -> str:
    return f"call_{uuid.uuid4().hex[:GENERATED_ID_HEX_CHARS]}"


def _call_id(raw: Any) -> str:
    """The provider's call id, made safe to store and show: odd characters become '_', a
    trailing ':' goes, a long id keeps a prefix and a stable hash; none → a fresh id."""
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        return _generated_id()
    text = str(raw).strip().rstrip(":").strip()
    cleaned = _ODD_ID_CHARS_RE.sub("_", text).strip("_")
    if not cleaned:
        return _generated_id()
    if len(cleaned) > CALL_ID_MAX_CHARS:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        cleaned = f"{cleaned[:CALL_ID_MAX_CHARS - 13]}_{digest}"
    return cleaned


def _tool_name(raw: Any) -> str:
    """The name the model wrote, without the wrapping some servers leave on it:
    `functions.name:` (chatml-function-calling), quotes, backticks, spaces."""
    name = str(raw or "").strip().strip("`'\"").strip()
    name = name.removeprefix("functions.").rstrip(":").strip().strip("`'\"")
    return name[:TOOL_NAME_MAX_CHARS]


def _tool_call(call: dict[str, Any], names: NameMap) -> ToolCallRequest:
    given = call.get("function")
    function: dict[str, Any] = given if isinstance(given, dict) else {}
    arguments, raw, error = _arguments(function.get("arguments"))
    return ToolCallRequest(
        id=_call_id(call.get("id")),
        name=names.ours(_tool_name(function.get("name"))),
        arguments=arguments, raw_arguments=raw, arguments_error=error,
    )


def _count(value: Any) -> int | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def parse_chat(data: dict[str, Any], requested_model: str, names: NameMap,
               params: dict[str, Any], tokenizer: str | None = None) -> LLMReply:
    """The reply in a chat body (`chat_body`, or a stream's `stream_body`) to `params`."""
    choice = data["choices"][0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content = _text(message.get("content"))
    if _LEAKED_CALL_RE.fullmatch(content):
        content = ""
    calls = tuple(_tool_call(c, names) for c in message.get("tool_calls") or ()
                  if isinstance(c, dict))
    if not calls and isinstance(message.get("function_call"), dict):
        calls = (_tool_call({"function": message["function_call"]}, names),)
    # a reply cut at its output limit says so even when it asked for tools: the last of
    # its calls may be cut too (agentq.loop.decision runs none of them)
    stop: StopReason = ("max_tokens" if choice.get("finish_reason") == "length"
                        else "tool_use" if calls else "end_turn")
    given = data.get("usage")
    usage: dict[str, Any] = given if isinstance(given, dict) else {}
    input_tokens = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    output_tokens = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    estimated = input_tokens is None or output_tokens is None
    if input_tokens is None:
        input_tokens = count_tokens(tokenizer, _request_texts(params))
    if output_tokens is None:
        output_tokens = count_tokens(
            tokenizer, [content, *(t for c in calls for t in (c.name, c.raw_arguments))])
    model = data.get("model")
    return LLMReply(
        content=content, tool_calls=calls, stop_reason=stop,
        model=model if isinstance(model, str) and model.strip() else requested_model,
        input_tokens=input_tokens, output_tokens=output_tokens, usage_estimated=estimated,
    )


def _json_body(response: Any) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        raise BadResponse("the response body is not JSON", response.status_code, True) from None
    if not isinstance(data, dict):
        raise BadResponse("the response body is not a JSON object", response.status_code, False)
    return data


def chat_body(response: Any) -> dict[str, Any]:
    """The JSON body of a chat answer, which has at least one choice."""
    data = _json_body(response)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        error = data.get("error")
        detail = error.get("message") if isinstance(error, dict) else error
        raise BadResponse(f"the response has no choices{f': {detail}' if detail else ''}",
                          response.status_code, False)
    return data


def stream_body(chunks: Iterable[dict[str, Any]], model: str,
                on_text: Callable[[str], None]) -> dict[str, Any]:
    """A streamed chat answer's chunks (as dicts) put back together into the body a plain
    call answers; `on_text` gets each piece of its text as it arrives."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish, usage, answered_model = None, None, None
    for data in chunks:
        answered_model = data.get("model") or answered_model
        usage = data.get("usage") or usage
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                content.append(piece)
                on_text(piece)
            for part in delta.get("tool_calls") or []:
                entry = calls.setdefault(part.get("index", len(calls)), {
                    "id": None, "type": "function",
                    "function": {"name": "", "arguments": ""}})
                entry["id"] = part.get("id") or entry["id"]
                function = part.get("function") or {}
                entry["function"]["name"] += function.get("name") or ""
                entry["function"]["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    if finish is None:
        raise BadResponse("the stream ended before the reply did", 200, True)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    body: dict[str, Any] = {"model": answered_model or model,
                            "choices": [{"index": 0, "message": message,
                                         "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return body


def embedding_vector(response: Any) -> list[float]:
    """The vector in an embeddings answer (a list of floats, or base64 of float32)."""
    data = _json_body(response)
    items = data.get("data")
    first = items[0] if isinstance(items, list) and items and isinstance(items[0], dict) else {}
    vector = first.get("embedding")
    if isinstance(vector, str):  # base64 of little-endian float32
        raw = base64.b64decode(vector)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw[: len(raw) // 4 * 4]))
    if isinstance(vector, list) and vector and all(isinstance(v, (int, float)) for v in vector):
        return [float(v) for v in vector]
    raise BadResponse("the response has no embedding", response.status_code, False)


# --- a failed call ----------------------------------------------------------------------

def error_text(exc: BaseException, timeout_s: float) -> str:
    """A failed call as an attempt records it: one line, no secrets, at most
    ERROR_TEXT_MAX_CHARS."""
    if isinstance(exc, openai.APITimeoutError):
        text = f"timeout: no answer within {timeout_s:g} s"
    elif isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        text = f"connection error: {type(cause).__name__ if cause else ''} {cause or exc}"
    elif isinstance(exc, ProviderBusy):
        text = f"provider busy: {exc}"
    elif isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        message = body.get("message") if isinstance(body.get("message"), str) else exc.message
        text = f"{type(exc).__name__}: {message}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return _SECRET_RE.sub(r"\1***", " ".join(text.split()))[:ERROR_TEXT_MAX_CHARS]
