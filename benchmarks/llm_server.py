"""The benchmarks' model server: `agentq.testing.scripted_llm` in its own process, with a
ReAct responder, latency changeable at run time, and nothing recorded per request.

    python -m benchmarks.llm_server --port 0 --latency 0

prints its base URL on stdout. Routes besides the OpenAI ones:

    GET  /stats   counters since the last reset: calls, max_in_flight, requests_per_s,
                  process_cpu_s, messages and estimated tokens per request (mean, max; the
                  agent's calls, not the summary calls), summary_calls
    POST /reset   zero the counters
    POST /config  {"latency_s": S} the latency added to every chat reply;
                  {"storm": {"seconds": S, "share": F, "hang_s": H, "retry_after_s": R}}
                  a provider storm from now for S seconds: a share F (default 0.8) of the
                  chat calls fail, in turn 429 with `Retry-After: R` (default 2), 429
                  without it, 500, and a hang of H seconds (default 10: set it past the
                  client's timeout) before a late answer; the other calls are answered
                  as usual. `{"storm": null}` ends it at once. /stats counts the storm's
                  answers (`storm`: by kind).

The responder: the request's last user message may carry `turns=N` (default 1); the model
asks for one tool call per turn until N tool-call turns are done, then answers in text. Done
turns are the assistant tool-call messages after that user message plus, once agentq has
compacted the context, the count its summary carries: a summary call is answered with
"tool turns done: K", K the previous summary's count plus the tool calls its transcript
adds after its last user line (a transcript with a user line starts the count afresh: the
tool calls before it were an earlier job's). The tool it calls is the offered tool whose name
contains `evaluate` (agentq's `math-evaluate`, the peer's `math_evaluate`), with `{"expression":
"6*7"}`; a user message carrying `tool=create_document` or `tool=run_python[:S]` calls that
tool instead (a document titled after the conversation; Python that sleeps S seconds,
default 3, then prints 42). A user message carrying `delegate=N` (and offered a tool whose
name contains `delegate`: agentq's `agents-delegate`) is first answered with N delegate calls
in one reply, each handing over DELEGATED_TASK (a one-tool-turn job of its own), then, once
their results are in, with the final text.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import threading
import time
from typing import Any

from agentq.testing.scripted_http import Request, Response
from agentq.testing.scripted_llm import ScriptedLLM, _error_body, call, text, tool_calls

TURNS_RE = re.compile(r"turns=(\d+)")
TOOL_RE = re.compile(r"tool=(create_document|run_python)(?::(\d+(?:\.\d+)?))?")
DELEGATE_RE = re.compile(r"delegate=(\d+)")
DELEGATED_TASK = "What is 6*7? Use the calculator. turns=1"
"""What each delegate call hands its sub-agent: the scenarios' one-tool-turn job."""
STORM_KINDS = ("429_retry_after", "429", "500", "hang")
STORM_CYCLE = 20
"""A storm's share is applied per block of this many calls (0.8: 16 fail, 4 answer)."""
DEFAULT_TOOL = "math-evaluate"
FINAL_TEXT = "The answer is 42."
SUMMARY_PREFIXES = ("You compact a conversation", "You read a conversation")
"""agentq's compaction and memory-digest calls: answered with a summary."""
DONE_RE = re.compile(r"tool turns done: (\d+)")
TRANSCRIPT_MARK = "Messages to add to the summary:"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def is_summary_request(request: dict) -> bool:
    """agentq's compaction or memory-digest call (its system prompt says so)."""
    messages = request.get("messages") or ()
    return bool(messages) and isinstance(messages[0], dict) and \
        _text_of(messages[0].get("content")).startswith(SUMMARY_PREFIXES)


def request_tokens(request: dict) -> int:
    """The request's messages in tokens, estimated as agentq does (4 characters a token)."""
    return -(-len(json.dumps(request.get("messages") or ())) // 4)


def react_reply(request: dict):
    """The next reply of a ReAct exchange (see the module docstring)."""
    messages = [m for m in request.get("messages") or () if isinstance(m, dict)]
    if is_summary_request(request):
        return text("Summary: the user asked for 6*7 with the calculator; each time it was "
                    f"42; tool turns done: {summarised_turns(messages)}.")
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    turns = 1
    if last_user >= 0:
        match = TURNS_RE.search(_text_of(messages[last_user].get("content")))
        if match:
            turns = int(match.group(1))
    done = sum(1 for m in messages[last_user + 1:]
               if m.get("role") == "assistant" and m.get("tool_calls"))
    if messages and messages[0].get("role") == "system":
        match = DONE_RE.search(_text_of(messages[0].get("content")))
        done += int(match.group(1)) if match else 0
    if done >= turns:
        return text(FINAL_TEXT)
    delegated = DELEGATE_RE.search(_text_of(messages[last_user].get("content"))) \
        if last_user >= 0 else None
    delegate = next((name for name in _tool_names(request) if "delegate" in name), None)
    if delegated and delegate:
        return tool_calls(*(call(delegate, {"task": DELEGATED_TASK}, raw=True)
                            for _ in range(int(delegated.group(1)))))
    wanted = TOOL_RE.search(_text_of(messages[last_user].get("content"))) \
        if last_user >= 0 else None
    needle, arguments = "evaluate", {"expression": "6*7"}
    if wanted and wanted.group(1) == "create_document":
        needle = "create_document"
        arguments = {"title": f"note {last_user}", "content": "six times seven is 42",
                     "format": "md"}
    elif wanted:
        needle = "run_python"
        arguments = {"code": f"import time\ntime.sleep({float(wanted.group(2) or 3)})\n"
                             "print(6 * 7)"}
    name = next((fname for fname in _tool_names(request) if needle in fname), DEFAULT_TOOL)
    return tool_calls(call(name, arguments, raw=True))


def _tool_names(request: dict) -> list[str]:
    """The names of the tools the request offers, in its order."""
    return [((tool or {}).get("function") or {}).get("name") or ""
            for tool in request.get("tools") or ()]


def summarised_turns(messages: list[dict]) -> int:
    """The tool turns a summary call's summary covers (see the module docstring)."""
    body = _text_of(messages[-1].get("content")) if messages else ""
    previous, _, transcript = body.partition(TRANSCRIPT_MARK)
    match = DONE_RE.search(previous)
    done = int(match.group(1)) if match else 0
    lines = transcript.splitlines()
    users = [i for i, line in enumerate(lines) if line.startswith("[user]")]
    if users:
        done, lines = 0, lines[users[-1] + 1:]
    return done + sum(1 for line in lines if line.startswith("[tool call "))


class BenchLLM(ScriptedLLM):
    """A ScriptedLLM that keeps no per-request records (it serves tens of thousands)."""

    def __init__(self, latency_s: float = 0.0, **kw: Any):
        super().__init__(latency_s, react_reply, **kw)
        self.messages_total = self.messages_max = 0
        self.tokens_total = self.tokens_max = 0
        self.summary_calls = 0
        self.storm: dict[str, Any] | None = None
        """{"until": monotonic time, "share", "hang_s", "retry_after_s"} while it lasts"""
        self.storm_calls = 0
        self.storm_served: dict[str, int] = {}

    def reset_stats(self) -> None:
        super().reset_stats()
        self.messages_total = self.messages_max = 0
        self.tokens_total = self.tokens_max = 0
        self.summary_calls = 0
        self.storm_served = {}

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["latency_s"] = self.latency_s
        agent_calls = self.calls - self.summary_calls
        out["messages_per_request_mean"] = (round(self.messages_total / agent_calls, 1)
                                            if agent_calls > 0 else 0.0)
        out["messages_per_request_max"] = self.messages_max
        out["tokens_per_request_mean"] = (round(self.tokens_total / agent_calls)
                                          if agent_calls > 0 else 0)
        out["tokens_per_request_max"] = self.tokens_max
        out["summary_calls"] = self.summary_calls
        out["storm"] = dict(self.storm_served)
        out["storm_active"] = self._storm_active()
        out["cpu_ms_per_call"] = (round(1000 * out["process_cpu_s"] / self.calls, 3)
                                  if self.calls else None)
        return out

    async def _route(self, request: Request) -> Response:
        path = request.path
        bare = path[3:] if path.startswith("/v1/") else path
        if request.method == "POST" and bare == "/reset":
            self.reset_stats()
            return Response(200, {"ok": True})
        if request.method == "POST" and bare == "/config":
            try:
                config = json.loads(request.body or b"{}")
                latency_s = float(config.get("latency_s", self.latency_s))
                storm = self._storm_config(config["storm"]) if "storm" in config \
                    else self.storm
            except (ValueError, TypeError, AttributeError, KeyError):
                return Response(400, _error_body("bad config", 400))
            self.latency_s, self.storm = latency_s, storm
            return Response(200, {"latency_s": self.latency_s, "storm": self._storm_active()})
        return await super()._route(request)

    @staticmethod
    def _storm_config(spec: dict | None) -> dict[str, Any] | None:
        if spec is None:
            return None
        seconds = float(spec["seconds"])
        share = float(spec.get("share", 0.8))
        if seconds < 0 or not 0 <= share <= 1:
            raise ValueError("storm: seconds >= 0, 0 <= share <= 1")
        return {"until": time.monotonic() + seconds, "share": share,
                "hang_s": float(spec.get("hang_s", 10.0)),
                "retry_after_s": float(spec.get("retry_after_s", 2.0))}

    def _storm_active(self) -> bool:
        return self.storm is not None and time.monotonic() < self.storm["until"]

    def _storm_kind(self) -> str | None:
        """The storm's answer to this call, or None: answered as usual. Of every
        STORM_CYCLE calls the first share × STORM_CYCLE fail, the kinds in turn."""
        storm = self.storm
        if storm is None or time.monotonic() >= storm["until"]:
            return None
        n = self.storm_calls
        self.storm_calls += 1
        if n % STORM_CYCLE >= round(storm["share"] * STORM_CYCLE):
            return None
        kind = STORM_KINDS[n % len(STORM_KINDS)]
        self.storm_served[kind] = self.storm_served.get(kind, 0) + 1
        return kind

    async def _chat(self, request: dict) -> Response:
        with self._in_flight():
            tokens = request_tokens(request)
            if is_summary_request(request):
                self.summary_calls += 1
            else:
                count = len(request.get("messages") or ())
                self.messages_total += count
                self.messages_max = max(self.messages_max, count)
                self.tokens_total += tokens
                self.tokens_max = max(self.tokens_max, tokens)
            storm, kind = self.storm, self._storm_kind()
            if kind == "429_retry_after":
                return Response(429, _error_body("rate limited (storm)", 429), {
                    "retry-after": f"{storm['retry_after_s']:g}"})
            if kind in ("429", "500"):
                return Response(int(kind), _error_body(f"storm {kind}", int(kind)))
            if kind == "hang":
                await asyncio.sleep(storm["hang_s"])
            reply = react_reply(request)
            reply.input_tokens = tokens  # usage as a provider would bill it
            if self.latency_s > 0:
                await asyncio.sleep(self.latency_s)
            return Response(200, self._completion(reply, request.get("model") or "scripted"))


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
