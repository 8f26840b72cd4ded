"""Tools that misbehave on purpose, for integration tests (AGENTQ_TOOL_PACKAGES adds them)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from agentq.tools.manifest import define_module

OBJECT = {"type": "object", "properties": {}, "additionalProperties": False}


def _marker(ctx) -> Path:
    return Path(os.environ.get("AGENTQ_TEST_SCRATCH", "/tmp")) / f"flaky-{ctx.tool_use_id}"


def fail_once(args, ctx):
    """Raises on its first run for a call, answers on the retry."""
    marker = _marker(ctx)
    if not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("transient failure")
    return {"recovered": True}


def always_fail(args, ctx):
    raise RuntimeError("this tool always fails")


def sleep(args, ctx):
    time.sleep(args["seconds"])
    return {"slept": args["seconds"]}


def gated(args, ctx):
    """Blocks until the test opens the gate named in `gate` (tests/support/tool_gate.py)."""
    import redis

    from tests.support.tool_gate import wait_at_gate
    client = redis.Redis.from_url(os.environ["AGENTQ_BROKER_URL"])
    try:
        waited = wait_at_gate(client, args["gate"], ctx.tool_use_id)
    finally:
        client.close()
    return {"gate": args["gate"], "opened": True, "waited_s": round(waited, 3)}


def echo(args, ctx):
    return {"echo": args["text"], "user_id": ctx.user_id}


MODULE = define_module({
    "module": "flaky",
    "description": "Misbehaving tools for tests.",
    "tools": [
        {"name": "flaky.fail_once", "description": "Fails once, then works.",
         "parameters": OBJECT, "function": fail_once},
        {"name": "flaky.always_fail", "description": "Always raises.",
         "parameters": OBJECT, "function": always_fail},
        {"name": "flaky.sleep", "description": "Sleeps.", "time_limit_s": 1,
         "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}},
                        "required": ["seconds"], "additionalProperties": False},
         "function": sleep},
        {"name": "flaky.gated", "description": "Waits until the test opens its gate.",
         "time_limit_s": 300,
         "parameters": {"type": "object", "properties": {"gate": {"type": "string"}},
                        "required": ["gate"], "additionalProperties": False},
         "function": gated},
        {"name": "flaky.echo", "description": "Echoes text.",
         "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"], "additionalProperties": False},
         "function": echo},
        {"name": "flaky.admin_only", "description": "Needs admin.", "permission": "admin",
         "parameters": OBJECT, "function": echo},
        {"name": "flaky.guarded", "description": "Echoes text, once a person approves.",
         "requires_approval": True,
         "parameters": {"type": "object", "properties": {"text": {"type": "string",
                                                                  "maxLength": 100}},
                        "required": ["text"], "additionalProperties": False},
         "function": echo},
        {"name": "flaky.guarded_briefly", "description": "Needs approval within 2 s.",
         "requires_approval": True, "approval_timeout_s": 2,
         "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"], "additionalProperties": False},
         "function": echo},
    ],
})
