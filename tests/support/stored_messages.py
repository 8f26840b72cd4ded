"""Stored conversation rows for the context tests (tests/unit/test_context*.py): a user
question, an answer, a tool call and its result, and runs of tool turns."""
from __future__ import annotations

import json

from agentq.loop.context import StoredMessage, estimate_tokens


def user_message(seq: int, text: str = "question", tokens: int = 10) -> StoredMessage:
    return StoredMessage(seq, "user", text, tokens)


def assistant_message(seq: int, text: str = "answer", tokens: int = 10) -> StoredMessage:
    return StoredMessage(seq, "assistant", text, tokens)


def call_message(seq: int, tool_use_id: str, name: str = "math.evaluate",
                 arguments: dict | None = None, tokens: int = 10) -> StoredMessage:
    body = {"name": name, "arguments": {"expression": "1+1"} if arguments is None else arguments,
            "tool_use_id": tool_use_id}
    return StoredMessage(seq, "tool_call", json.dumps(body), tokens)


def result_message(seq: int, tool_use_id: str, result=2, ok: bool = True, tokens: int = 10,
                   error: dict | None = None) -> StoredMessage:
    body = {"name": "math.evaluate", "tool_use_id": tool_use_id, "ok": ok,
            "result": result if ok else None, "error": error}
    return StoredMessage(seq, "tool_result", json.dumps(body), tokens)


def in_run(start: int, n_turns: int, calls_per_turn: int = 1,
           result: str = "2") -> list[StoredMessage]:
    out, seq = [], start
    for t in range(n_turns):
        ids = [f"t{t}_{c}" for c in range(calls_per_turn)]
        for i in ids:
            out.append(call_message(seq, i))
            seq += 1
        for i in ids:
            out.append(result_message(seq, i, result=result, tokens=estimate_tokens(result) + 20))
            seq += 1
    return out
