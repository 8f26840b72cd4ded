"""The context a turn sends: system prompt + a window of recent history, in the provider's
(Chat Completions) format, with our tool names (the router maps them).

Stored messages (roles user / assistant / tool_call / tool_result) become:
  user        → {"role": "user"}
  assistant   → {"role": "assistant", "content"}; merged with the tool_call rows after it
  tool_call   → an entry of the assistant message's `tool_calls`
  tool_result → {"role": "tool", "tool_call_id"}

The window is read newest first and stops at a token budget, so a turn's cost does not
grow with the conversation's length. It never starts inside a tool exchange, and a tool call
without its result (or a result without its call) is dropped: providers reject both.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
TRUNCATION_MARKER = "\n... [truncated {n} chars]"


@dataclass(frozen=True)
class StoredMessage:
    """The columns of a `messages` row a context needs."""
    seq: int
    role: str
    content: str
    token_count: int


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS


def truncate(text: str, max_chars: int) -> str:
    """Cut `text` to `max_chars`, with a marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + TRUNCATION_MARKER.format(n=len(text) - max_chars)


def render_tool_result(record: dict[str, Any], max_chars: int) -> str:
    """What the model reads for one tool result: JSON, errors included (seed 004). A JSON
    result longer than `max_chars` stays valid JSON: its longest strings are cut instead."""
    if record.get("ok"):
        body = record.get("result")
        if isinstance(body, str):
            return truncate(body, max_chars)
    else:
        body = {"error": record.get("error") or {"message": "unknown error"}}
    return fit_json(body, max_chars)


FIT_ROUNDS = 50


def fit_json(value: Any, max_chars: int) -> str:
    """`value` as JSON text of at most `max_chars` characters, always valid JSON: the string
    taking the most room is cut (with a marker) until it fits; if many small values still do
    not, a JSON object holding a cut preview of the text."""
    text = json.dumps(value, ensure_ascii=False)
    for _ in range(FIT_ROUNDS):
        excess = len(text) - max_chars
        if excess <= 0:
            return text
        path, longest = _longest_string(value, ())
        if path is None or len(longest) <= 32:
            break
        room = _json_len(longest) - excess
        value = _replace(value, path, _cut_to(longest, room))
        text = json.dumps(value, ensure_ascii=False)
    preview = _cut_to(text, max_chars - len('{"truncated": true, "preview": }'))
    return json.dumps({"truncated": True, "preview": preview}, ensure_ascii=False)


def _cut_to(text: str, room: int) -> str:
    """The longest cut of `text` (with its marker) whose JSON takes at most `room` chars."""
    def cut(n: int) -> str:
        return truncate(text, n) if n < len(text) else text
    low, high = 0, len(text)
    while low < high:  # the largest n with _json_len(cut(n)) <= room
        mid = (low + high + 1) // 2
        if _json_len(cut(mid)) <= room:
            low = mid
        else:
            high = mid - 1
    return cut(low)


def _json_len(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False))


def _longest_string(value: Any, path: tuple) -> tuple[tuple | None, str]:
    """The string taking the most room in `value`'s JSON, and where it is."""
    if isinstance(value, str):
        return path, value
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list) else ())
    best: tuple[tuple | None, str] = (None, "")
    for key, item in items:
        found = _longest_string(item, path + (key,))
        if found[0] is not None and _json_len(found[1]) > _json_len(best[1]):
            best = found
    return best


def _replace(value: Any, path: tuple, new: str) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


def window(newest_first: Iterable[StoredMessage], max_tokens: int,
           max_tool_chars: int | None = None) -> list[StoredMessage]:
    """Take messages newest first until the budget; return them oldest first.

    Everything back to the newest user message is always kept (the question being
    answered and this job's tool exchanges), whatever the budget; older messages only while
    they fit. The window starts at a user message, so it never opens with a tool result or
    half of a tool exchange. A tool result costs what the model will read of it: at most
    `max_tool_chars`.
    """
    cap = estimate_tokens("x" * max_tool_chars) if max_tool_chars else None
    taken: list[StoredMessage] = []
    used = 0
    have_question = False
    for message in newest_first:
        cost = message.token_count or estimate_tokens(message.content)
        if cap is not None and message.role == "tool_result":
            cost = min(cost, cap)
        if have_question and used + cost > max_tokens:
            break
        taken.append(message)
        used += cost
        have_question = have_question or message.role == "user"
    taken.reverse()
    for i, message in enumerate(taken):
        if message.role == "user":
            return taken[i:]
    return []


def to_provider(messages: Sequence[StoredMessage], max_tool_chars: int) -> list[dict[str, Any]]:
    """Stored rows → Chat Completions messages (our tool names), orphans dropped."""
    out: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None  # the assistant message collecting tool_calls

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            if not pending["tool_calls"]:
                del pending["tool_calls"]
            out.append(pending)
            pending = None

    for m in messages:
        if m.role == "tool_call":
            data = json.loads(m.content)
            if pending is None:
                pending = {"role": "assistant", "content": None, "tool_calls": []}
            pending["tool_calls"].append({
                "id": data["tool_use_id"], "type": "function",
                "function": {"name": data["name"],
                             "arguments": json.dumps(data.get("arguments") or {})}})
            continue
        if m.role == "assistant":
            flush()
            pending = {"role": "assistant", "content": m.content, "tool_calls": []}
            continue
        flush()
        if m.role == "user":
            out.append({"role": "user", "content": m.content})
        elif m.role == "tool_result":
            data = json.loads(m.content)
            out.append({"role": "tool", "tool_call_id": data["tool_use_id"],
                        "content": render_tool_result(data, max_tool_chars)})
    flush()
    return _drop_orphans(out)


def _drop_orphans(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    asked: set[str] = set()
    cleaned: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and "tool_calls" in m:
            calls = [c for c in m["tool_calls"] if c["id"] in answered]
            asked.update(c["id"] for c in calls)
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            if calls:
                m["tool_calls"] = calls
            elif not m.get("content"):
                continue
        elif m["role"] == "tool" and m["tool_call_id"] not in asked:
            continue
        cleaned.append(m)
    return cleaned


def build(system_prompt: str, newest_first: Iterable[StoredMessage], *, max_tokens: int,
          max_tool_chars: int) -> list[dict[str, Any]]:
    """The whole context of a turn."""
    history = to_provider(window(newest_first, max_tokens, max_tool_chars), max_tool_chars)
    return [{"role": "system", "content": system_prompt}, *history]
