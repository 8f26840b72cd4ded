"""agentq hooks for tests: each call is appended as a JSON line to $AGENTQ_TEST_HOOK_LOG.

before_turn stops a job whose context holds HOOK-STOP, and raises for HOOK-RAISE (which
must not fail the job); after_turn raises for a reply holding HOOK-RAISE too."""
from __future__ import annotations

import json
import os


def _log(name, ctx):
    path = os.environ.get("AGENTQ_TEST_HOOK_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"hook": name, "job_id": ctx.get("job_id"),
                                  "turn": ctx.get("turn"), "error": ctx.get("error"),
                                  **{k: ctx[k] for k in EXTRA if k in ctx}}) + "\n")


EXTRA = ("strategy", "tokens_before", "tokens_after", "messages_before", "messages_after",
         "status", "finish_reason", "turns", "usage")
"""What after_compaction and after_loop are given, logged too."""


def _texts(ctx):
    return " ".join(str(m.get("content") or "") for m in ctx.get("messages") or ())


def before_turn(ctx):
    _log("before_turn", ctx)
    texts = _texts(ctx)
    if "HOOK-RAISE" in texts:
        raise RuntimeError("the test hook fails on purpose")
    if "HOOK-STOP" in texts:
        return "stopped by the test hook"
    return None


def after_turn(ctx):
    _log("after_turn", ctx)
    if "HOOK-RAISE" in (ctx.get("content") or ""):
        raise RuntimeError("the test hook fails on purpose")


def on_error(ctx):
    _log("on_error", ctx)


def before_compaction(ctx):
    _log("before_compaction", ctx)
    return True


def after_compaction(ctx):
    _log("after_compaction", ctx)


def after_loop(ctx):
    _log("after_loop", ctx)
