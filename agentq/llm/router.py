"""One model call, made durable: retries per model, then the next model of the chain.

`LLMRouter.chat` speaks the Chat Completions API of any OpenAI-compatible server through the
official SDK (with the SDK's own retries off: tenacity does them, so that every failed
attempt is seen, logged and recorded). Replies are parsed from the raw JSON body, not the
SDK's models, because real servers are quirky: null content, arguments that are not JSON,
missing ids, missing usage, the legacy `function_call`.

Quirks met in real servers (llama.cpp's `llama_cpp.server` with `chatml-function-calling`,
recorded in tests/unit/fixtures/) and what the router does about them:

- tools are ignored unless `tool_choice` is sent: `"auto"` is sent whenever tools are offered;
- an assistant message with `content: null` is rejected (HTTP 500): `""` is sent instead;
- tool-call names with a `functions.` prefix, a trailing `:`, quotes or spaces: cleaned;
- tool-call ids with odd characters or longer than `CALL_ID_MAX_CHARS`: made safe;
- a `function_call` beside `tool_calls`: `tool_calls` wins, the legacy field is ignored;
- no `usage`: estimated with the tokenizer named by `AGENTQ_TOKENIZER` and marked estimated;
- neither text nor tool calls (or only the format's own `functions.<name>:` marker) when
  tools were offered: asked once more with `tool_choice: "none"`, usage of both added.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import struct
import threading
import time
import uuid
from functools import partial
from typing import Any, Callable, Iterable, TypeVar

import httpx2
import openai
from tenacity import (RetryCallState, Retrying, retry_if_exception, stop_after_attempt,
                      wait_random_exponential)

from agentq import metrics, tracing
from agentq.config import Settings
from agentq.errors import ProviderError, ProviderTimeout
from agentq.llm.gate import NullGate, ProviderBusy, ProviderGate
from agentq.llm.names import NameMap
from agentq.llm.types import LLMReply, StopReason, ToolCallRequest, ToolSpec

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
"""Token estimate when a server sends no usage and no tokenizer is configured:
ceil(characters / CHARS_PER_TOKEN). How missing usage is counted is Settings.tokenizer:
unset or `chars`, `tiktoken[:encoding]`, or the path of a .gguf file (that model's own
tokenizer, through llama_cpp, vocabulary only)."""
CALL_ID_MAX_CHARS = 128
TOOL_NAME_MAX_CHARS = 200
_ODD_ID_CHARS_RE = re.compile(r"[^A-Za-z0-9_.-]+")
_LEAKED_CALL_RE = re.compile(r"\s*(?:functions\.[\w.-]+:\s*)+")
"""Content that is only chatml-function-calling's own `functions.<name>:` marker."""
ERROR_TEXT_MAX_CHARS = 300
GENERATED_ID_HEX_CHARS = 24
RETRY_AFTER_STATUSES = frozenset({429, 503})
RETRYABLE_4XX_STATUSES = frozenset({408, 429})

_SECRET_RE = re.compile(r"\b(sk-|Bearer\s+)[A-Za-z0-9_.*-]{4,}")
T = TypeVar("T")


class _BadResponse(Exception):
    """A 2xx answer we cannot use (not JSON, no choices, no embedding)."""

    def __init__(self, message: str, status: int, retryable: bool):
        super().__init__(message)
        self.status, self.retryable = status, retryable


_FAILURES = (openai.OpenAIError, _BadResponse, ProviderBusy)


# --- errors -----------------------------------------------------------------------------

def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, _BadResponse):
        return exc.retryable
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in RETRYABLE_4XX_STATUSES
    return False


def is_transient(exc: BaseException) -> bool:
    """A failure that may pass by itself: the job waits for the provider rather than fail.
    A busy provider (circuit open, no slot, rate limit) is transient but not retried within
    the step: the job parks instead of holding its worker."""
    return isinstance(exc, ProviderBusy) or _is_retryable(exc)


def _retry_after_s(exc: BaseException | None) -> float | None:
    """The server's `retry-after-ms` / `retry-after` (seconds) on a 429 or 503, if any; a
    busy provider's own time until it takes calls again."""
    if isinstance(exc, ProviderBusy):
        return exc.retry_after_s
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in RETRY_AFTER_STATUSES:
        return None
    headers = exc.response.headers
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            value = float(raw) / divisor
        except ValueError:
            continue  # an HTTP date: not honoured, the backoff applies
        if math.isfinite(value) and value >= 0:
            return value
    return None


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code
    if isinstance(exc, _BadResponse):
        return exc.status
    return None


def _error_text(exc: BaseException, timeout_s: float) -> str:
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


# --- the request ------------------------------------------------------------------------

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


def _estimate_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


class _Tokenizers:
    """Counters for missing usage, loaded once per spec; characters / 4 when none loads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[str, Callable[[str], int] | None] = {}

    def count(self, spec: str | None, texts: Iterable[str]) -> int:
        texts = [t for t in texts if t]
        counter = self.get(spec)
        if counter is None:
            return _estimate_tokens(sum(len(t) for t in texts))
        with self._lock:  # llama_cpp's tokenizer is not documented as thread-safe
            return sum(counter(t) for t in texts)

    def get(self, spec: str | None) -> Callable[[str], int] | None:
        spec = (spec or "").strip()
        if not spec or spec == "chars":
            return None
        with self._lock:
            if spec not in self._loaded:
                self._loaded[spec] = self._load(spec)
            return self._loaded[spec]

    @staticmethod
    def _load(spec: str) -> Callable[[str], int] | None:
        try:
            if spec.startswith("tiktoken"):
                import tiktoken
                encoding = tiktoken.get_encoding(spec.partition(":")[2] or "o200k_base")
                return lambda text: len(encoding.encode(text, disallowed_special=()))
            if spec.endswith(".gguf"):
                import llama_cpp
                vocab = llama_cpp.Llama(model_path=spec, vocab_only=True, verbose=False)
                return lambda text: len(vocab.tokenize(text.encode("utf-8", "replace"),
                                                       add_bos=False, special=True))
            raise ValueError("expected chars, tiktoken[:encoding] or a .gguf path")
        except Exception as exc:  # noqa: BLE001 - any failure falls back to characters / 4
            log.warning("tokenizer %s unavailable (%s: %s); counting characters / %d",
                        spec, type(exc).__name__, exc, CHARS_PER_TOKEN,
                        extra={"event": "llm.tokenizer_unavailable", "tokenizer": spec})
            return None


_tokenizers = _Tokenizers()


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
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
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


def _parse_chat(data: dict[str, Any], requested_model: str, names: NameMap,
                params: dict[str, Any], tokenizer: str | None = None) -> LLMReply:
    choice = data["choices"][0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content = _text(message.get("content"))
    if _LEAKED_CALL_RE.fullmatch(content):
        content = ""
    calls = tuple(_tool_call(c, names) for c in message.get("tool_calls") or ()
                  if isinstance(c, dict))
    if not calls and isinstance(message.get("function_call"), dict):
        calls = (_tool_call({"function": message["function_call"]}, names),)
    stop: StopReason = ("tool_use" if calls
                        else "max_tokens" if choice.get("finish_reason") == "length"
                        else "end_turn")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    input_tokens = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    output_tokens = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    estimated = input_tokens is None or output_tokens is None
    if input_tokens is None:
        input_tokens = _tokenizers.count(tokenizer, _request_texts(params))
    if output_tokens is None:
        output_tokens = _tokenizers.count(
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
        raise _BadResponse("the response body is not JSON", response.status_code, True) from None
    if not isinstance(data, dict):
        raise _BadResponse("the response body is not a JSON object", response.status_code, False)
    return data


def _embedding(data: dict[str, Any], status: int) -> list[float]:
    items = data.get("data")
    first = items[0] if isinstance(items, list) and items and isinstance(items[0], dict) else {}
    vector = first.get("embedding")
    if isinstance(vector, str):  # base64 of little-endian float32
        raw = base64.b64decode(vector)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw[: len(raw) // 4 * 4]))
    if isinstance(vector, list) and vector and all(isinstance(v, (int, float)) for v in vector):
        return [float(v) for v in vector]
    raise _BadResponse("the response has no embedding", status, False)


# --- the router -------------------------------------------------------------------------

class LLMRouter:
    """Model calls with retries and fallbacks. Thread-safe: one per process is enough."""

    def __init__(self, settings: Settings, client: openai.OpenAI | None = None,
                 gate: ProviderGate | None = None):
        self._settings = settings
        self._gate: ProviderGate = gate if gate is not None else NullGate()
        self._owns_client = client is None
        self._client = client if client is not None else openai.OpenAI(
            api_key=os.environ.get("OPENAI_API_KEY") or "no-key",
            base_url=os.environ.get("OPENAI_BASE_URL") or None,
            max_retries=0,
            timeout=settings.llm_timeout_s,
        )
        self._backoff = wait_random_exponential(multiplier=settings.llm_retry_base_s,
                                                max=settings.llm_retry_max_s)
        self._tokenizer = settings.tokenizer
        self._sleep: Callable[[float], None] = time.sleep

    def close(self) -> None:
        """Close the HTTP client if this router built it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> "LLMRouter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def chain(self, model: str | None = None) -> list[str]:
        """The models tried, in order: the requested (or default) one, then the fallbacks."""
        models = [model or self._settings.model, *self._settings.fallback_models]
        return list(dict.fromkeys(m for m in models if m))

    # --- public calls -------------------------------------------------------------------

    def chat(self, messages: list[dict], tools: list[ToolSpec], model: str | None = None,
             max_tokens: int | None = None,
             on_delta: Callable[[str, int], None] | None = None) -> LLMReply:
        """One reply, from the first model of the chain that answers. With `on_delta`, the
        reply is streamed: `on_delta(text, attempt)` gets each piece of its text as it
        arrives (`attempt` counts the calls made, so a client can drop the pieces of a
        stream that was cut: such a call is retried as a whole). The reply returned is the
        same as without streaming."""
        chain = self.chain(model)
        names = NameMap([t.name for t in tools] + list(_history_tool_names(messages)))
        params: dict[str, Any] = {"messages": _api_messages(
            messages, names, self._settings.tool_results_as)}
        if self._settings.temperature is not None:
            params["temperature"] = self._settings.temperature
        if tools:
            params["tools"] = [
                {"type": "function", "function": {"name": names.api(t.name),
                                                  "description": t.description,
                                                  "parameters": t.parameters}}
                for t in tools
            ]
            params["tool_choice"] = "auto"  # llama.cpp's chatml-function-calling needs it
        max_tokens = self._cap(max_tokens)
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        attempts: list[dict[str, Any]] = []
        timed_out: list[bool] = []
        transient: list[bool] = []
        retry_after: list[float] = []
        for name in chain:
            started = time.monotonic()
            post = (partial(self._post_chat, name, params) if on_delta is None else
                    partial(self._stream_chat, name, params, on_delta, attempts))
            try:
                data = self._with_retries(name, "chat", post, attempts)
            except _FAILURES as exc:
                timed_out.append(isinstance(exc, openai.APITimeoutError))
                transient.append(is_transient(exc))
                wait_s = _retry_after_s(exc)
                if wait_s is not None:
                    retry_after.append(wait_s)
                log.warning("llm.model_failed model=%s status=%s", name, _status(exc),
                            extra={"event": "llm.model_failed", "model": name,
                                   "status": _status(exc), "attempts": len(attempts)})
                continue
            reply = _parse_chat(data, name, names, params, self._tokenizer)
            if not reply.tool_calls and not reply.content.strip() and params.get("tools"):
                reply = self._ask_for_text(name, params, names, reply, attempts)
            reply = dataclasses.replace(reply, attempts=tuple(attempts))
            log.info("llm.reply model=%s input_tokens=%d output_tokens=%d tool_calls=%d "
                     "latency_ms=%d failed_attempts=%d", reply.model, reply.input_tokens,
                     reply.output_tokens, len(reply.tool_calls),
                     (time.monotonic() - started) * 1000, len(attempts),
                     extra={"event": "llm.reply", "model": reply.model,
                            "requested_model": name, "input_tokens": reply.input_tokens,
                            "output_tokens": reply.output_tokens,
                            "usage_estimated": reply.usage_estimated,
                            "tool_calls": len(reply.tool_calls),
                            "stop_reason": reply.stop_reason,
                            "failed_attempts": len(attempts)})
            return reply
        log.warning("llm.all_failed models=%s attempts=%d", ",".join(chain), len(attempts),
                    extra={"event": "llm.all_failed", "models": chain, "attempts": len(attempts)})
        if chain and all(timed_out):
            error = ProviderTimeout(self._settings.llm_timeout_s, ", ".join(chain))
            error.attempts = attempts
            error.details["attempts"] = attempts
            raise error
        last = attempts[-1]["error"] if attempts else "no model configured"
        raise ProviderError(f"Every model failed ({', '.join(chain)}); last error: {last}",
                            attempts=attempts, transient=bool(chain) and all(transient),
                            retry_after_s=max(retry_after) if retry_after else None)

    def _ask_for_text(self, model: str, params: dict[str, Any], names: NameMap,
                      empty: LLMReply, attempts: list[dict[str, Any]]) -> LLMReply:
        """A reply with neither text nor tool calls, asked once more with `tool_choice:
        "none"` (llama.cpp's chatml-function-calling can only answer text that way). The
        usage of both calls is counted; when the second call fails, the empty reply stands."""
        log.info("llm.empty_reply model=%s: asking again for text", model,
                 extra={"event": "llm.empty_reply", "model": model})
        again = {**params, "tool_choice": "none"}
        try:
            data = self._with_retries(model, "chat", partial(self._post_chat, model, again),
                                      attempts)
        except _FAILURES:
            return empty
        reply = _parse_chat(data, model, names, again, self._tokenizer)
        return dataclasses.replace(
            reply, input_tokens=empty.input_tokens + reply.input_tokens,
            output_tokens=empty.output_tokens + reply.output_tokens,
            usage_estimated=empty.usage_estimated or reply.usage_estimated)

    def _cap(self, max_tokens: int | None) -> int | None:
        """`max_tokens` capped by AGENTQ_MAX_TOKENS_PER_REQUEST when that is set."""
        cap = self._settings.max_tokens_per_request
        if cap is None:
            return max_tokens
        return cap if max_tokens is None else min(max_tokens, cap)

    def embed(self, text: str, model: str | None = None) -> list[float]:
        name = model or self._settings.embedding_model
        attempts: list[dict[str, Any]] = []
        try:
            return self._with_retries(name, "embed", partial(self._post_embedding, name, text),
                                      attempts)
        except _FAILURES as exc:
            raise ProviderError(f"Embedding with {name} failed: {attempts[-1]['error']}",
                                attempts=attempts) from exc

    # --- one model ----------------------------------------------------------------------

    def _post_chat(self, model: str, params: dict[str, Any]) -> dict[str, Any]:
        # The dict is already the wire body: posting it through the SDK's client skips the
        # typed-params transform of `chat.completions.create`, 7 ms a call at 15 messages
        # and 33 ms at 200 (docs/benchmarks.md), with the same errors and retries.
        response = self._client.post("/chat/completions", body={"model": model, **params},
                                     cast_to=httpx2.Response,
                                     options={"timeout": self._settings.llm_timeout_s})
        data = _json_body(response)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            error = data.get("error")
            detail = error.get("message") if isinstance(error, dict) else error
            raise _BadResponse(f"the response has no choices{f': {detail}' if detail else ''}",
                               response.status_code, False)
        return data

    def _stream_chat(self, model: str, params: dict[str, Any],
                     on_delta: Callable[[str, int], None],
                     attempts: list[dict[str, Any]]) -> dict[str, Any]:
        """A streamed chat call, put back together into the body a plain call answers."""
        attempt = len(attempts) + 1
        stream = self._client.chat.completions.create(
            model=model, stream=True, stream_options={"include_usage": True},
            timeout=self._settings.llm_timeout_s, **params)
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish, usage, answered_model = None, None, None
        try:
            for chunk in stream:
                data = chunk.model_dump(exclude_none=True)
                answered_model = data.get("model") or answered_model
                usage = data.get("usage") or usage
                for choice in data.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    if isinstance(piece, str) and piece:
                        content.append(piece)
                        on_delta(piece, attempt)
                    for part in delta.get("tool_calls") or []:
                        entry = calls.setdefault(part.get("index", len(calls)), {
                            "id": None, "type": "function",
                            "function": {"name": "", "arguments": ""}})
                        entry["id"] = part.get("id") or entry["id"]
                        function = part.get("function") or {}
                        entry["function"]["name"] += function.get("name") or ""
                        entry["function"]["arguments"] += function.get("arguments") or ""
                    finish = choice.get("finish_reason") or finish
        except httpx2.TransportError as exc:  # cut mid-reply: the call is retried whole
            raise _BadResponse(f"the stream was cut: {type(exc).__name__}", 200, True) from exc
        finally:
            stream.close()
        if finish is None:
            raise _BadResponse("the stream ended before the reply did", 200, True)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        body: dict[str, Any] = {"model": answered_model or model,
                                "choices": [{"index": 0, "message": message,
                                             "finish_reason": finish}]}
        if usage:
            body["usage"] = usage
        return body

    def _post_embedding(self, model: str, text: str) -> list[float]:
        response = self._client.post("/embeddings", body={"model": model, "input": text,
                                                           "encoding_format": "float"},
                                     cast_to=httpx2.Response,
                                     options={"timeout": self._settings.llm_timeout_s})
        return _embedding(_json_body(response), response.status_code)

    def _with_retries(self, model: str, what: str, op: Callable[[], T],
                      attempts: list[dict[str, Any]]) -> T:
        """`op()` with up to `llm_retries` retries; each failure is appended to `attempts`."""
        retrying = Retrying(
            stop=stop_after_attempt(self._settings.llm_retries + 1),
            wait=self._wait,
            retry=retry_if_exception(_is_retryable),
            before_sleep=partial(self._log_retry, model, what),
            sleep=self._sleep,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                try:
                    with self._gate.call(model) as permit:
                        try:
                            with metrics.model_call(model), tracing.span(
                                    "llm.request", model=model, call=what):
                                result = op()
                        except _FAILURES as exc:
                            permit.failed(is_transient(exc))
                            raise
                        permit.succeeded()
                        return result
                except _FAILURES as exc:
                    attempts.append({"model": model,
                                     "error": _error_text(exc, self._settings.llm_timeout_s),
                                     "status": _status(exc)})
                    if not isinstance(exc, ProviderBusy):
                        metrics.provider_error(model, _status(exc))
                    raise
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = _retry_after_s(exc)
        if retry_after is not None and retry_after <= self._settings.llm_retry_max_s:
            return retry_after
        return self._backoff(state)

    @staticmethod
    def _log_retry(model: str, what: str, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait_s = state.next_action.sleep if state.next_action else 0.0
        metrics.provider_retry(model)
        log.warning("llm.retry call=%s model=%s attempt=%d status=%s error=%s wait_s=%.3f",
                    what, model, state.attempt_number, _status(exc) if exc else None,
                    type(exc).__name__, wait_s,
                    extra={"event": "llm.retry", "call": what, "model": model,
                           "attempt": state.attempt_number,
                           "status": _status(exc) if exc else None,
                           "error_type": type(exc).__name__, "wait_s": round(wait_s, 3)})
