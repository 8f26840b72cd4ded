"""Sequential keep-alive calls to the scripted model server: what one call costs when
nothing else does (a Nagle/delayed-ACK stall shows as ~40 ms a call). It was a unit test
that printed its timing; timings belong here (tests/unit asserts no clock).

    python -m benchmarks.keepalive [--calls 200]

prints one JSON line: calls, seconds, ms a call, and the server's stats.
"""
from __future__ import annotations

import argparse
import json
import time

import httpx2

from agentq.testing.scripted_llm import ScriptedLLM, text


def measure(calls: int) -> dict:
    with ScriptedLLM(responder=lambda request: text("ok")) as llm, \
            httpx2.Client(base_url=llm.base_url) as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        started = time.perf_counter()
        for _ in range(calls):
            client.post("/chat/completions", json=body).raise_for_status()
        elapsed = time.perf_counter() - started
        return {"calls": calls, "seconds": round(elapsed, 3),
                "ms_a_call": round(elapsed / calls * 1000, 3), "server": llm.stats()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keepalive")
    parser.add_argument("--calls", type=int, default=200)
    print(json.dumps(measure(parser.parse_args(argv).calls)))


if __name__ == "__main__":
    main()
