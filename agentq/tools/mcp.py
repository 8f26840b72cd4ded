"""MCP servers as tool modules, through the official `mcp` package: a server started over
stdio (a command) or reached over streamable HTTP (a URL). A stdio server is started with
an allow-listed environment (child_env), not the worker's: no database URL, keys nor secrets.

Its tools appear as `<module>.<tool>` with their input schemas, checked by the same
`define_module` as any manifest (a name the rules refuse is mapped: lowercased, other
characters to `_`; the server is still called by its own name). Calls run on the module's
queue, like any tool, through one session per module that the tool worker process keeps
open (a background event loop holds it; a broken session is opened again on the next call).
A call the server answers with `isError` or a JSON-RPC error is a `module_error`; one past
its time limit a `tool_timeout` (the session and the module's health are kept); a broken
session a `module_unavailable` (the module is then unhealthy).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from agentq.config import Settings
from agentq.errors import ManifestError, ToolTimeout
from agentq.tools.manifest import NAME_RE
from agentq.tools.specs import ModuleError, ModuleUnavailable

log = logging.getLogger(__name__)
MCP_NAMES_KEY = "mcp_names"
"""In a cached MCP manifest: our tool name → the server's own name."""
CONNECT_TIMEOUT_S = 30


def tool_name(module: str, remote: str) -> str:
    """`module.tool` for an MCP tool name, within define_module's rules."""
    name = re.sub(r"[^a-z0-9_]", "_", remote.lower())
    if not name or not name[0].isalpha():
        name = "t_" + name
    name = name[:31]
    if not NAME_RE.fullmatch(name):
        name = "t_" + name[:29]
    return f"{module}.{name}"


CHILD_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH")
"""What a stdio MCP server inherits from the tool worker's environment (plus LC_*): never
the database URL, keys, secrets nor anything else of agentq's (AGENTQ_*, OPENAI_*, ...)."""


def child_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a stdio MCP server is started with: an allow-list, not ours."""
    source: Mapping[str, str] = os.environ if environ is None else environ
    return {k: v for k, v in source.items()
            if (k in CHILD_ENV or k.startswith("LC_")) and not v.startswith("()")}


def _target(spec, settings: Settings):
    from mcp.client.stdio import StdioServerParameters
    if spec.command:
        return StdioServerParameters(command=spec.command[0], args=list(spec.command[1:]),
                                     env=child_env(), cwd=os.getcwd())
    from agentq.webhooks import urls
    urls.check_callback_url(spec.url, settings.module_allow_private, field_name="url")
    return spec.url


@dataclass
class _Held:
    client: Any
    stop: asyncio.Event
    task: asyncio.Task


class Sessions:
    """This process's MCP sessions, one per module, held open on a background event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self._held: dict[tuple, _Held] = {}
        self._connecting: dict[tuple, asyncio.Lock] = {}
        threading.Thread(target=self.loop.run_forever, name="mcp-sessions",
                         daemon=True).start()

    def run(self, coro, timeout_s: float):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    @staticmethod
    def _key(spec) -> tuple:
        return (spec.name, spec.url, spec.command)

    async def _hold(self, spec, settings: Settings, ready: asyncio.Future,
                    stop: asyncio.Event) -> None:
        from mcp import Client
        try:
            async with Client(_target(spec, settings),
                              read_timeout_seconds=settings.slow_tool_time_limit_s) as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning("mcp session ended", extra={"tool_module": spec.name,
                                                        "error": type(exc).__name__})

    async def client(self, spec, settings: Settings):
        key = self._key(spec)
        lock = self._connecting.setdefault(key, asyncio.Lock())
        async with lock:
            held = self._held.get(key)
            if held is not None and not held.task.done():
                return held.client
            ready: asyncio.Future = self.loop.create_future()
            stop = asyncio.Event()
            task = self.loop.create_task(self._hold(spec, settings, ready, stop))
            client = await asyncio.wait_for(ready, CONNECT_TIMEOUT_S)
            self._held[key] = _Held(client, stop, task)
            log.info("mcp session opened", extra={"tool_module": spec.name})
            return client

    async def drop(self, spec) -> None:
        held = self._held.pop(self._key(spec), None)
        if held is not None:
            held.stop.set()

    async def list_tools(self, spec, settings: Settings) -> list:
        client = await self.client(spec, settings)
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor) if cursor else \
                await client.list_tools()
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(self, spec, settings: Settings, name: str, arguments: dict,
                        timeout_s: float):
        client = await self.client(spec, settings)
        try:
            return await client.call_tool(name, arguments, read_timeout_seconds=timeout_s)
        except Exception as exc:
            if not _answered(exc):
                await self.drop(spec)  # the next call opens a new session
            raise


def _timed_out(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError
    from mcp_types import REQUEST_TIMEOUT
    return isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT


def _answered(exc: BaseException) -> bool:
    """The server answered the call with a JSON-RPC error, or did not answer it in time:
    the session itself is sound (a timed-out call does not make the module unhealthy)."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED
    return isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED


_sessions: Sessions | None = None
_sessions_lock = threading.Lock()


def sessions() -> Sessions:
    """This process's sessions (a forked pool process makes its own)."""
    global _sessions
    with _sessions_lock:
        if _sessions is None or _sessions.pid != os.getpid():
            _sessions = Sessions()
        return _sessions


def manifest_of(spec, settings: Settings) -> dict[str, Any]:
    """The server's tools as a manifest; ManifestError saying what is wrong."""
    s = sessions()
    try:
        tools = s.run(s.list_tools(spec, settings), CONNECT_TIMEOUT_S + 5)
    except Exception as exc:  # noqa: BLE001 - an unreachable server or a failed start
        s.run(s.drop(spec), 5)
        detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        if isinstance(exc, BaseExceptionGroup):
            detail = "; ".join(f"{type(e).__name__}: {e}" for e in exc.exceptions)
        raise ManifestError(spec.name, f"the MCP server did not list its tools: "
                                       f"{detail[:500]}") from None
    s.run(s.drop(spec), 5)  # listing is not calling: a tool worker opens its own session
    if not tools:
        raise ManifestError(spec.name, "the MCP server lists no tools")
    names: dict[str, str] = {}
    entries = []
    for tool in tools:
        ours = tool_name(spec.name, tool.name)
        if ours in names:
            raise ManifestError(spec.name, f"MCP tools {names[ours]!r} and {tool.name!r} "
                                           f"both map to {ours!r}; rename one")
        names[ours] = tool.name
        entries.append({"name": ours,
                        "description": (tool.description or tool.title or
                                        f"MCP tool {tool.name}").strip(),
                        "parameters": tool.input_schema or {"type": "object"},
                        "permission": "guest"})
    return {"module": spec.name, "description": f"MCP server {spec.name}",
            "tools": entries, MCP_NAMES_KEY: names}


def call(spec, remote_name: str, arguments: dict, limit_s: float,
         settings: Settings) -> Any:
    """Call one tool; its result as JSON-able data, or a ToolError."""
    s = sessions()
    try:
        result = s.run(s.call_tool(spec, settings, remote_name, arguments, limit_s),
                       limit_s + 5)
    except TimeoutError:
        raise ToolTimeout(f"{spec.name}.{remote_name}", limit_s) from None
    except Exception as exc:  # noqa: BLE001 - the session broke or the server refused
        if _timed_out(exc):  # the call, not the server: the module stays healthy
            raise ToolTimeout(f"{spec.name}.{remote_name}", limit_s) from None
        if _answered(exc):
            raise ModuleError(f"{remote_name}: {str(exc)[:2000]}") from None
        raise ModuleUnavailable(f"MCP server {spec.name}: {type(exc).__name__}: "
                                f"{str(exc)[:500]}") from None
    texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
    if result.is_error:
        raise ModuleError(f"{remote_name}: " + ("\n".join(texts) or "error")[:2000])
    if result.structured_content is not None:
        return result.structured_content
    if len(texts) == 1:
        try:
            return json.loads(texts[0])
        except ValueError:
            return texts[0]
    return [c.model_dump(mode="json", exclude_none=True) for c in result.content]
