"""The `modules` scenario (issue 15): what a tool call costs when the tool is an HTTP module
or an MCP server rather than a function in the worker, as ratios to the in-process tool.

Each call goes through `ToolRegistry.execute` exactly as a tool task runs it on its module's
queue (checks, argument validation, the timeout thread; for an HTTP module the SSRF check, a
signed `POST /execute` and the answer's checks; for an MCP server the call on the session the
process keeps). The queue hop before it is the same for all three, so it is left out: these
are the differences a module adds. The modules are the examples (examples/http_module.py,
examples/mcp_server.py over stdio and over streamable HTTP), each in its own process on
loopback; calls are interleaved so all see the same noise.
"""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from benchmarks.harness import ROOT, ratio, summary

SECRET = "whsec_YmVuY2htYXJrLW1vZHVsZS1zZWNyZXQtMTIzNDU2"


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, timeout_s: float = 30) -> None:
    import socket
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def scenario_modules(ctx) -> dict[str, Any]:
    import importlib

    from agentq.config import Settings
    from agentq.tools.manifest import ToolContext
    from agentq.tools.registry import ToolRegistry
    from agentq.tools.remote import ModuleSpec, RemoteModules, Store

    calls = ctx.sizes.modules_calls
    http_port, mcp_port = _free_port(), _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "examples.http_module", "--port",
                               str(http_port), "--name", "bench", "--secret", SECRET],
                              cwd=ROOT, stdout=subprocess.DEVNULL),
             subprocess.Popen([sys.executable, "-m", "examples.mcp_server", "--http",
                               "--port", str(mcp_port)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait_listening(http_port)
        _wait_listening(mcp_port)
        settings = Settings.from_env({"AGENTQ_MODULE_ALLOW_PRIVATE": "1",
                                      "AGENTQ_MODULE_SYNC_S": "3600"})
        specs = [ModuleSpec("bench", url=f"http://127.0.0.1:{http_port}", secret=SECRET),
                 ModuleSpec("mcpstdio", kind="mcp",
                            command=(sys.executable, "-m", "examples.mcp_server")),
                 ModuleSpec("mcphttp", kind="mcp", url=f"http://127.0.0.1:{mcp_port}/mcp")]
        registry = ToolRegistry(
            settings, modules=[importlib.import_module("tool_workers.math").MODULE],
            remote=RemoteModules(settings, Store(None), lambda: specs))
        runs = {"in_process": ("math.evaluate", {"expression": "1+2"}),
                "http_module": ("bench.add", {"a": 1, "b": 2}),
                "mcp_stdio": ("mcpstdio.add", {"a": 1, "b": 2}),
                "mcp_http": ("mcphttp.add", {"a": 1, "b": 2})}
        allowed = ["math", "bench", "mcpstdio", "mcphttp"]
        times: dict[str, list[float]] = {k: [] for k in runs}
        failed = 0
        for i in range(calls + 3):  # three warm-up rounds: sessions open, imports done
            for kind, (name, args) in runs.items():
                ctx_ = ToolContext(tool_use_id=f"bench_{kind}_{i}", job_id="bench",
                                   user_id="bench", conversation_id="bench",
                                   permission_level="guest", platform="bench")
                t0 = time.perf_counter()
                result = registry.execute(name, args, ctx_, allowed)
                elapsed = time.perf_counter() - t0
                if not result.ok:
                    failed += 1
                elif i >= 3:
                    times[kind].append(elapsed)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
    stats = {k: summary(v) for k, v in times.items()}
    base = stats["in_process"]["median_ms"]
    return {"calls": calls, "failed": failed, **stats,
            "ratio_http_median": ratio(stats["http_module"]["median_ms"], base),
            "ratio_mcp_stdio_median": ratio(stats["mcp_stdio"]["median_ms"], base),
            "ratio_mcp_http_median": ratio(stats["mcp_http"]["median_ms"], base),
            "added_ms_http": _diff(stats["http_module"]["median_ms"], base),
            "added_ms_mcp_stdio": _diff(stats["mcp_stdio"]["median_ms"], base),
            "added_ms_mcp_http": _diff(stats["mcp_http"]["median_ms"], base),
            "note": "ToolRegistry.execute per call, interleaved; the Celery hop to the "
                    "module's queue, the same for all, is not included."}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 2)
