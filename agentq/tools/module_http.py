"""Talking to an HTTP tool module (seed 003): `GET <url>/manifest` and `POST <url>/execute`,
through the webhooks' SSRF guard, signed per Standard Webhooks with the module's secret, on
one pooled client per process. What a module answers is checked here: whatever goes wrong
is a ManifestError (a manifest) or a ToolError (a call), never the secret."""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable

import httpx

from agentq.config import Settings
from agentq.errors import ManifestError, ToolTimeout, ValidationFailed
from agentq.tools.manifest import ToolContext
from agentq.tools.specs import (
    ModuleBadAnswer,
    ModuleError,
    ModuleHttpError,
    ModuleSpec,
    ModuleUnavailable,
)
from agentq.webhooks import urls

MAX_MANIFEST_BYTES = 1_000_000
MAX_ANSWER_BYTES = 2_000_000

_http: tuple[int, httpx.Client] | None = None
_http_lock = threading.Lock()


def _forget_http_in_child() -> None:
    """A forked child makes its own client, under a lock no parent thread holds."""
    global _http, _http_lock
    _http, _http_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_http_in_child)


def _http_client() -> httpx.Client:
    """One pooled client per process (keep-alive to the modules); a forked process makes
    its own."""
    global _http
    with _http_lock:
        if _http is None or _http[0] != os.getpid():
            _http = (os.getpid(), httpx.Client(follow_redirects=False, trust_env=False,
                                               limits=httpx.Limits(max_connections=100)))
        return _http[1]


def _request(spec: ModuleSpec, method: str, path: str, body: str, event_id: str,
             timeout_s: float, settings: Settings) -> httpx.Response:
    assert spec.url is not None, "an HTTP module has a url (check_spec)"
    url = spec.url.rstrip("/") + path
    try:
        target = urls.resolve_and_check(url, settings.module_allow_private, field_name="url")
    except ValidationFailed as exc:
        raise ModuleUnavailable(f"Module {spec.name}: {exc.message}") from None
    headers = {"content-type": "application/json", "idempotency-key": event_id}
    if spec.secret:
        from agentq.webhooks.signing import signed_headers_with
        headers.update(signed_headers_with(spec.secret, event_id, body))
    if target.host_header:
        headers["Host"] = target.host_header
    extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
    client = _http_client()
    request = client.build_request(method, target.url, content=body.encode(), headers=headers,
                                   extensions=extensions, timeout=timeout_s)
    return client.send(request)


def fetch_http_manifest(spec: ModuleSpec, settings: Settings) -> dict[str, Any]:
    """GET <url>/manifest; raise ManifestError saying what is wrong."""
    try:
        response = _request(spec, "GET", "/manifest", "", f"manifest_{int(time.time())}",
                            settings.module_fetch_timeout_s, settings)
    except ModuleUnavailable as exc:
        raise ManifestError(spec.name, exc.message) from None
    except httpx.TimeoutException:
        raise ManifestError(spec.name, f"GET /manifest did not answer within "
                                       f"{settings.module_fetch_timeout_s:g} s") from None
    except Exception as exc:  # noqa: BLE001 - connection refused, a URL httpx cannot use, ...
        raise ManifestError(spec.name, f"GET /manifest failed: {type(exc).__name__}; is the "
                                       "module running at its url?") from None
    if response.status_code != 200:
        raise ManifestError(spec.name, f"GET /manifest answered HTTP {response.status_code}; "
                                       "it must answer 200 with the manifest as JSON")
    if len(response.content) > MAX_MANIFEST_BYTES:
        raise ManifestError(spec.name, f"the manifest is over {MAX_MANIFEST_BYTES} bytes")
    try:
        return response.json()
    except ValueError:
        raise ManifestError(spec.name, "GET /manifest did not answer JSON") from None


def context_of(ctx: ToolContext) -> dict[str, Any]:
    return {"user_id": ctx.user_id, "tenant_id": ctx.tenant_id, "platform": ctx.platform,
            "platform_channel_id": ctx.platform_channel_id,
            "platform_thread_id": ctx.platform_thread_id,
            "conversation_id": ctx.conversation_id, "job_id": ctx.job_id,
            "permission_level": ctx.permission_level, "tool_use_id": ctx.tool_use_id}


def call_http(spec: ModuleSpec, tool: str, arguments: dict, ctx: ToolContext,
              limit_s: float, settings: Settings, on_unreachable: Callable[[str], None]) -> Any:
    body = json.dumps({"tool": tool, "arguments": arguments, "context": context_of(ctx),
                       "tool_use_id": ctx.tool_use_id, "time_limit_s": limit_s})
    try:
        response = _request(spec, "POST", "/execute", body, ctx.tool_use_id, limit_s, settings)
    except httpx.TimeoutException:
        raise ToolTimeout(tool, limit_s) from None
    except httpx.HTTPError as exc:
        on_unreachable(f"POST /execute: {type(exc).__name__}")
        raise ModuleUnavailable(f"Module {spec.name} did not answer: "
                                f"{type(exc).__name__}.") from None
    if response.status_code >= 500:
        raise ModuleHttpError(f"Module {spec.name} answered HTTP {response.status_code}.")
    if len(response.content) > MAX_ANSWER_BYTES:
        raise ModuleBadAnswer(f"Module {spec.name} answered over {MAX_ANSWER_BYTES} bytes.")
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        raise ModuleBadAnswer(f"Module {spec.name} answered HTTP {response.status_code} "
                              "without {\"ok\": true|false, ...}.")
    if answer["ok"]:
        if "result" not in answer:
            raise ModuleBadAnswer(f"Module {spec.name} answered ok without a result.")
        return answer["result"]
    error = answer.get("error")
    if isinstance(error, dict):
        message = str(error.get("message") or error.get("code") or "error")
    else:
        message = str(error or f"HTTP {response.status_code}")
    raise ModuleError(f"{tool}: {message[:2000]}")
