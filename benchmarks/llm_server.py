"""The benchmarks' model server: `tests.support.scripted_llm` in its own process, with a
ReAct responder, latency changeable at run time, and nothing recorded per request.

    python -m benchmarks.llm_server --port 0 --latency 0

prints its base URL on stdout. Routes besides the OpenAI ones:

    GET  /stats   counters since the last reset: calls, max_in_flight, requests_per_s,
                  process_cpu_s, messages per request (mean, max)
    POST /reset   zero the counters
    POST /config  {"latency_s": S} the latency added to every chat reply

The responder: the request's last user message may carry `turns=N` (default 1); the model
asks for one tool call per turn until N assistant tool-call turns follow that user message,
then answers in text. The tool it calls is the offered tool whose name contains
`evaluate` (agentq's `math-evaluate`, the peer's `math_evaluate`), with `{"expression":
"6*7"}`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import threading
from typing import Any

from tests.support.scripted_llm import ScriptedLLM, _error_body, call, text, tool_calls

TURNS_RE = re.compile(r"turns=(\d+)")
DEFAULT_TOOL = "math-evaluate"
FINAL_TEXT = "The answer is 42."


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def react_reply(request: dict):
    """The next reply of a ReAct exchange (see the module docstring)."""
    messages = [m for m in request.get("messages") or () if isinstance(m, dict)]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    turns = 1
    if last_user >= 0:
        match = TURNS_RE.search(_text_of(messages[last_user].get("content")))
        if match:
            turns = int(match.group(1))
    done = sum(1 for m in messages[last_user + 1:]
               if m.get("role") == "assistant" and m.get("tool_calls"))
    if done >= turns:
        return text(FINAL_TEXT)
    name = DEFAULT_TOOL
    for tool in request.get("tools") or ():
        fname = ((tool or {}).get("function") or {}).get("name") or ""
        if "evaluate" in fname:
            name = fname
            break
    return tool_calls(call(name, {"expression": "6*7"}, raw=True))


class BenchLLM(ScriptedLLM):
    """A ScriptedLLM that keeps no per-request records (it serves tens of thousands)."""

    def __init__(self, latency_s: float = 0.0, **kw: Any):
        super().__init__(latency_s, react_reply, **kw)
        self.messages_total = 0
        self.messages_max = 0

    def reset_stats(self) -> None:
        super().reset_stats()
        self.messages_total = self.messages_max = 0

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["latency_s"] = self.latency_s
        out["messages_per_request_mean"] = (round(self.messages_total / self.calls, 1)
                                            if self.calls else 0.0)
        out["messages_per_request_max"] = self.messages_max
        out["cpu_ms_per_call"] = (round(1000 * out["process_cpu_s"] / self.calls, 3)
                                  if self.calls else None)
        return out

    async def _route(self, method: str, path: str, body: bytes):
        bare = path[3:] if path.startswith("/v1/") else path
        if method == "POST" and bare == "/reset":
            self.reset_stats()
            return 200, {"ok": True}, {}
        if method == "POST" and bare == "/config":
            try:
                config = json.loads(body or b"{}")
                self.latency_s = float(config.get("latency_s", self.latency_s))
            except (ValueError, TypeError):
                return 400, _error_body("bad config", 400), {}
            return 200, {"latency_s": self.latency_s}, {}
        return await super()._route(method, path, body)

    async def _chat(self, request: dict):
        with self._in_flight():
            count = len(request.get("messages") or ())
            self.messages_total += count
            self.messages_max = max(self.messages_max, count)
            reply = react_reply(request)
            if self.latency_s > 0:
                await asyncio.sleep(self.latency_s)
            return 200, self._completion(reply, request.get("model") or "scripted"), {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The benchmarks' scripted model server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    server = BenchLLM(args.latency, host=args.host, port=args.port).start()
    print(server.base_url, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    while not done.wait(1.0):
        pass
    server.stop()
    print(json.dumps(server.stats()), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
