"""One model call, made durable: retries per model, then the next model of the chain.

`LLMRouter.chat` speaks the Chat Completions API of any OpenAI-compatible server through the
official SDK (with the SDK's own retries off: tenacity does them, so that every failed
attempt is seen, logged and recorded). What goes on the wire and how the answers (quirks
included) are read is `agentq.llm.wire`; here are the chain, the retries, the provider gate
and which failures are transient.

Each model goes to its provider: the model catalogue's endpoint and key (`AGENTQ_MODELS`,
`agentq.llm.catalogue`), else `OPENAI_BASE_URL` with `OPENAI_API_KEY`. Each provider has its
own HTTP clients and its own gate (circuit breaker, concurrency, rate), so a chain whose
first model's provider storms goes on to a model of another provider, and the other's
circuit stays closed.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from functools import partial
from typing import Any, Callable, TypeVar

import httpx2
import openai
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from agentq import metrics, tracing
from agentq.config import Settings
from agentq.errors import ProviderError, ProviderTimeout
from agentq.llm import cancel
from agentq.llm.cancel import CallCancelled
from agentq.llm.clients import ClientShards, abortable_http_client, clients_for
from agentq.llm.gate import NullGate, ProviderBusy, ProviderGate, provider_name
from agentq.llm.names import NameMap
from agentq.llm.pricing import model_label
from agentq.llm.types import LLMReply, ToolSpec
from agentq.llm.wire import (
    BadResponse,
    chat_body,
    chat_request,
    embedding_vector,
    error_text,
    parse_chat,
    stream_body,
)

log = logging.getLogger(__name__)

RETRY_AFTER_STATUSES = frozenset({429, 503})
RETRYABLE_4XX_STATUSES = frozenset({408, 429})
T = TypeVar("T")

_FAILURES = (openai.OpenAIError, BadResponse, ProviderBusy)


# --- errors -----------------------------------------------------------------------------

def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, BadResponse):
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
    if isinstance(exc, BadResponse):
        return exc.status
    return None


def _abortable_client(**options: Any) -> openai.OpenAI:
    """An SDK client whose calls a cancel aborts (`agentq.llm.clients`)."""
    return openai.OpenAI(http_client=abortable_http_client(), **options)


def _log_retry(model: str, label: str, what: str, state: RetryCallState) -> None:
    """Tenacity's before_sleep: a retry counted and logged (never the request's content)."""
    exc = state.outcome.exception() if state.outcome else None
    wait_s = state.next_action.sleep if state.next_action else 0.0
    metrics.provider_retry(label)
    log.warning("llm.retry call=%s model=%s attempt=%d status=%s error=%s wait_s=%.3f",
                what, model, state.attempt_number, _status(exc) if exc else None,
                type(exc).__name__, wait_s,
                extra={"event": "llm.retry", "call": what, "model": model,
                       "attempt": state.attempt_number,
                       "status": _status(exc) if exc else None,
                       "error_type": type(exc).__name__, "wait_s": round(wait_s, 3)})


# --- the router -------------------------------------------------------------------------

class LLMRouter:
    """Model calls with retries and fallbacks. Thread-safe: one per process is enough.

    `client` and `gate`: those of the default provider (OPENAI_BASE_URL); `gates(base_url)`
    makes the gate of a provider (`agentq.llm.gate.gate_for`), the default's too when no
    `gate` is given. Without it a catalogue's provider has no gate."""

    def __init__(self, settings: Settings, client: openai.OpenAI | None = None,
                 gate: ProviderGate | None = None,
                 gates: Callable[[str | None], ProviderGate] | None = None):
        self._settings = settings
        self._gates_for = gates
        default_url = os.environ.get("OPENAI_BASE_URL") or None
        self._default_provider = provider_name(default_url)
        self._gates: dict[str, ProviderGate] = {self._default_provider: (
            gate if gate is not None else gates(default_url) if gates is not None
            else NullGate())}
        self._shards: ClientShards | None = None
        self._catalogue_shards: dict[tuple[str, str | None], ClientShards] = {}
        self._lock = threading.Lock()
        if client is not None:  # the caller's, shared by every thread and never closed here
            self._client: Callable[[], openai.OpenAI] = lambda: client
        else:  # a client per group of the orchestrator's threads (agentq.llm.clients)
            self._shards = ClientShards(partial(
                _abortable_client, api_key=os.environ.get("OPENAI_API_KEY") or "no-key",
                base_url=default_url, max_retries=0,
                timeout=settings.llm_timeout_s), clients_for(settings.orchestrator_concurrency))
            self._client = self._shards.client
        self._backoff = wait_random_exponential(multiplier=settings.llm_retry_base_s,
                                                max=settings.llm_retry_max_s)
        self._tokenizer = settings.tokenizer
        self._sleep: Callable[[float], None] = time.sleep

    def close(self) -> None:
        """Close the HTTP clients this router built."""
        if self._shards is not None:
            self._shards.close()
        with self._lock:
            shards, self._catalogue_shards = self._catalogue_shards, {}
        for made in shards.values():
            made.close()

    # --- providers ----------------------------------------------------------------------

    def _entry(self, model: str):
        return self._settings.models.get(model)

    def _client_for(self, model: str) -> openai.OpenAI:
        """This thread's client of the model's provider."""
        entry = self._entry(model)
        if entry is None:
            return self._client()
        key = (entry.base_url, entry.api_key_env)
        shards = self._catalogue_shards.get(key)
        if shards is None:
            with self._lock:
                shards = self._catalogue_shards.get(key)
                if shards is None:
                    shards = self._catalogue_shards[key] = ClientShards(partial(
                        _abortable_client, api_key=entry.api_key(), base_url=entry.base_url,
                        max_retries=0, timeout=self._settings.llm_timeout_s),
                        clients_for(self._settings.orchestrator_concurrency))
        return shards.client()

    def provider(self, model: str) -> str:
        """The provider a model's calls go to (its host and port): what its gate keys on."""
        entry = self._entry(model)
        return provider_name(entry.base_url) if entry is not None else self._default_provider

    def _gate_for(self, model: str) -> ProviderGate:
        name = self.provider(model)
        gate = self._gates.get(name)
        if gate is None:
            with self._lock:
                gate = self._gates.get(name)
                if gate is None:
                    entry = self._entry(model)
                    gate = self._gates[name] = (self._gates_for(entry.base_url)
                                                if self._gates_for is not None else NullGate())
        return gate

    def _request(self, model: str, messages: list[dict], tools: list[ToolSpec],
                 max_tokens: int | None, made: dict) -> tuple[NameMap, dict[str, Any]]:
        """The wire request for `model`, with its catalogue quirks (one per set of quirks)."""
        entry = self._entry(model)
        tool_results_as = self._settings.tool_results_as
        temperature = self._settings.temperature
        if entry is not None:
            tool_results_as = entry.quirk("tool_results_as", tool_results_as)
            temperature = entry.quirk("temperature", temperature)
        key = (tool_results_as, temperature)
        if key not in made:
            made[key] = chat_request(messages, tools, tool_results_as=tool_results_as,
                                     temperature=temperature,
                                     max_tokens=self._cap(max_tokens))
        return made[key]

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
        same as without streaming.

        Made inside `agentq.llm.cancel.cancellable(token)`: once the token is set, no
        further attempt is made (no retry, no fallback), a backoff ends, the call in
        flight is aborted, and `CallCancelled` is raised."""
        chain = self.chain(model)
        requests: dict = {}
        attempts: list[dict[str, Any]] = []
        timed_out: list[bool] = []
        transient: list[bool] = []
        retry_after: list[float] = []
        for name in chain:  # a cancel stops the chain at its next attempt (_with_retries)
            started = time.monotonic()
            names, params = self._request(name, messages, tools, max_tokens, requests)
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
            reply = parse_chat(data, name, names, params, self._tokenizer)
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
        reply = parse_chat(data, model, names, again, self._tokenizer)
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
        response = self._client_for(model).post(
            "/chat/completions", body={"model": model, **params}, cast_to=httpx2.Response,
            options={"timeout": self._settings.llm_timeout_s})
        return chat_body(response)

    def _stream_chat(self, model: str, params: dict[str, Any],
                     on_delta: Callable[[str, int], None],
                     attempts: list[dict[str, Any]]) -> dict[str, Any]:
        """A streamed chat call, put back together into the body a plain call answers."""
        attempt = len(attempts) + 1
        stream = self._client_for(model).chat.completions.create(
            model=model, stream=True, stream_options={"include_usage": True},
            timeout=self._settings.llm_timeout_s, **params)
        try:
            return stream_body((chunk.model_dump(exclude_none=True) for chunk in stream),
                               model, lambda piece: on_delta(piece, attempt))
        except httpx2.TransportError as exc:  # cut mid-reply: the call is retried whole
            raise BadResponse(f"the stream was cut: {type(exc).__name__}", 200, True) from exc
        finally:
            stream.close()

    def _post_embedding(self, model: str, text: str) -> list[float]:
        response = self._client_for(model).post(
            "/embeddings", body={"model": model, "input": text, "encoding_format": "float"},
            cast_to=httpx2.Response, options={"timeout": self._settings.llm_timeout_s})
        return embedding_vector(response)

    def _with_retries(self, model: str, what: str, op: Callable[[], T],
                      attempts: list[dict[str, Any]]) -> T:
        """`op()` with up to `llm_retries` retries; each failure is appended to `attempts`.
        A cancel (`agentq.llm.cancel`) ends it before an attempt, during a backoff, or
        by aborting the attempt in flight: `CallCancelled`."""
        token = cancel.current()
        label = model_label(model, self._settings)  # the metrics' name for it
        retrying = Retrying(
            stop=stop_after_attempt(self._settings.llm_retries + 1),
            wait=self._wait,
            retry=retry_if_exception(_is_retryable),
            before_sleep=partial(_log_retry, model, label, what),
            sleep=self._sleep if token is None else token.sleep,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                if token is not None:
                    token.check()  # `CallCancelled`: no retry, no fallback
                try:
                    with self._gate_for(model).call(model) as permit:
                        try:
                            with metrics.model_call(label), tracing.span(
                                    "llm.request", model=model, call=what):
                                result = op()
                        except _FAILURES as exc:
                            if token is not None and token.is_set():
                                # aborted by the cancel: not the provider's failure
                                permit.failed(False)
                                log.info("llm.cancelled call=%s model=%s", what, model,
                                         extra={"event": "llm.cancelled", "call": what,
                                                "model": model})
                                raise CallCancelled(f"the {what} call to {model} was "
                                                    "aborted: its job was cancelled"
                                                    ) from exc
                            permit.failed(is_transient(exc))
                            raise
                        permit.succeeded()
                        return result
                except _FAILURES as exc:
                    attempts.append({"model": model,
                                     "error": error_text(exc, self._settings.llm_timeout_s),
                                     "status": _status(exc)})
                    if not isinstance(exc, ProviderBusy):
                        metrics.provider_error(label, _status(exc))
                    raise
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = _retry_after_s(exc)
        if retry_after is not None and retry_after <= self._settings.llm_retry_max_s:
            return retry_after
        return self._backoff(state)
