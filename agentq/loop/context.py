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

from agentq.config import Settings

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


TurnMessages = tuple[list[StoredMessage], list[StoredMessage]]
"""A turn's messages: the job's own (its question first) and the history before them,
each oldest first."""


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS


def wire_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """An estimate of the tokens of provider messages as sent."""
    return sum(estimate_tokens(json.dumps(m.get("content") if m.get("content") is not None
                                          else "", ensure_ascii=False))
               + MESSAGE_OVERHEAD_TOKENS for m in messages)


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


def _longest_string(value: Any, path: tuple[Any, ...]
                    ) -> tuple[tuple[Any, ...] | None, str]:
    """The string taking the most room in `value`'s JSON, and where it is."""
    if isinstance(value, str):
        return path, value
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list) else ())
    best: tuple[tuple[Any, ...] | None, str] = (None, "")
    for key, item in items:
        found = _longest_string(item, path + (key,))
        if found[0] is not None and _json_len(found[1]) > _json_len(best[1]):
            best = found
    return best


def _replace(value: Any, path: tuple[Any, ...], new: str) -> Any:
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


def last_tools_succeeded(newest_first: Sequence[StoredMessage]) -> bool:
    """True when the history (newest first) ends with tool results, every one ok."""
    results = []
    for m in newest_first:
        if m.role != "tool_result":
            break
        results.append(m)
    if not results:
        return False
    for m in results:
        try:
            if not json.loads(m.content).get("ok"):
                return False
        except (ValueError, AttributeError):
            return False
    return True


def to_provider(messages: Sequence[StoredMessage], max_tool_chars: int,
                stub_before: int | None = None) -> list[dict[str, Any]]:
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
            body = (PRUNED_RESULT.format(name=data.get("name"), chars=len(m.content))
                    if stub_before is not None and m.seq < stub_before
                    else render_tool_result(data, max_tool_chars))
            out.append({"role": "tool", "tool_call_id": data["tool_use_id"], "content": body})
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


# --- assembly in the seeds' layer order, budgeted by the model's window ----------------
#
#   system prompt → (recalled memories) → conversation summary → recent history →
#   the current question and the whole in-run exchange
#
# The question and the in-run exchange are never cut: when the whole passes a share of the
# window it is compacted (`compaction_plan.plan_compaction`): old tool results become stubs,
# then older turns (history and in-run) are summarised by the model into the conversation's
# summary. Only the recent-history layer is windowed (it starts at a user message, so a
# tool exchange is never split).

MODEL_CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-4o": 128_000, "gpt-4o-mini": 128_000, "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576, "gpt-4.1-nano": 1_047_576, "gpt-4-turbo": 128_000,
    "gpt-4": 8_192, "gpt-3.5-turbo": 16_385, "o1": 200_000, "o3": 200_000,
    "o3-mini": 200_000, "o4-mini": 200_000, "claude-3-5-sonnet": 200_000,
    "claude-3-5-haiku": 200_000, "claude-3-7-sonnet": 200_000, "claude-sonnet-4": 200_000,
    "gemini-1.5-pro": 2_000_000, "gemini-1.5-flash": 1_000_000, "gemini-2.0-flash": 1_000_000,
    "llama-3.1-8b-instant": 131_072, "smollm2": 8_192,
}
"""Context windows in tokens by model name (a provider prefix `x/` and a dated suffix are
ignored: `openai/gpt-4o-2024-08-06` is `gpt-4o`)."""
DEFAULT_CONTEXT_WINDOW = 8_192
OUTPUT_RESERVE_TOKENS = 1_024
SUMMARY_HEADER = "[Summary of the earlier conversation]"
PRUNED_RESULT = ("[tool result pruned to save context: {name}, {chars} chars; "
                 "call the tool again if it is needed]")


def context_window(model: str, settings: Settings) -> int:
    """The model's context window: AGENTQ_CONTEXT_WINDOW, else the model catalogue's
    (AGENTQ_MODELS), else AGENTQ_MODEL_CONTEXT_WINDOWS,
    else the table (longest matching prefix), else DEFAULT_CONTEXT_WINDOW."""
    if settings.context_window:
        return settings.context_window
    entry = settings.models.get(model)
    if entry is not None and entry.context_window:  # the model catalogue's (AGENTQ_MODELS)
        return entry.context_window
    name = model.rsplit("/", 1)[-1]
    for table in (settings.model_context_windows, MODEL_CONTEXT_WINDOWS):
        if model in table:
            return table[model]
        matches = [k for k in table if name == k or name.startswith(k + "-")]
        if matches:
            return table[max(matches, key=len)]
    return DEFAULT_CONTEXT_WINDOW


def input_budget(window_tokens: int, max_output: int | None) -> int:
    """What the messages may take: the window less the answer's room."""
    reserve = min(max_output or OUTPUT_RESERVE_TOKENS, window_tokens // 4)
    return window_tokens - reserve


@dataclass(frozen=True)
class Layers:
    """What a turn's context is made of, read from the database."""
    system: str
    summary: str | None
    history: Sequence[StoredMessage]
    """Messages before the question and after the summary, oldest first."""
    question: StoredMessage | None
    inrun: Sequence[StoredMessage]
    """The job's messages after its question (and after the summary), oldest first."""
    memories: Sequence[str] = ()
    memory_reserve: int = 0
    """Tokens kept for the memories a recall will add (counted while `memories` is empty or
    smaller): memories are planned for before they are fetched."""
    backlog: Sequence[StoredMessage] = ()
    """The oldest messages not summarised yet that the history read (the newest
    AGENTQ_HISTORY_MAX_MESSAGES) leaves out, oldest first: they must be summarised, never
    dropped. A chunk of them; `backlog_more` when more follow it."""
    backlog_more: bool = False
    bootstrap: str | None = None
    skills: str | None = None
    tool_docs: str | None = None
    project: str | None = None
    """The persona's context layers and the conversation's active project, rendered
    (agentq.loop.layers)."""


TOOL_FORMAT_TOKENS = 16
"""What the provider's format adds to a tool call or result (ids, type, wrappers)."""


def _cost(message: StoredMessage, max_tool_chars: int, stub_before: int | None) -> int:
    if message.role == "tool_result":
        if stub_before is not None and message.seq < stub_before:
            return estimate_tokens(PRUNED_RESULT) + TOOL_FORMAT_TOKENS
        return min(message.token_count or estimate_tokens(message.content),
                   estimate_tokens("x" * max_tool_chars)) + TOOL_FORMAT_TOKENS
    if message.role == "tool_call":
        return (message.token_count or estimate_tokens(message.content)) + TOOL_FORMAT_TOKENS
    return message.token_count or estimate_tokens(message.content)


MEMORY_HEADER = "[Things you remember about this user]"
MEMORY_SHARE = 0.15
"""Most of the input budget recalled memories may take."""


def memory_block(memories: Sequence[str]) -> str:
    return MEMORY_HEADER + "\n" + "\n".join(f"- {m}" for m in memories)


def memory_tokens(memories: Sequence[str]) -> int:
    return estimate_tokens(memory_block(memories)) if memories else 0


def memory_reserve(k: int, max_chars: int, budget: int) -> int:
    """What to keep for a recall of `k` memories of at most `max_chars` each: their most,
    at most MEMORY_SHARE of the budget (the recall keeps the best that fit)."""
    return min(memory_tokens(["x" * max_chars] * k), int(budget * MEMORY_SHARE))


def fit_memories(memories: Sequence[str], reserve: int) -> list[str]:
    """The best-first memories that fit in `reserve` tokens."""
    kept: list[str] = []
    for m in memories:
        if memory_tokens([*kept, m]) > reserve:
            break
        kept.append(m)
    return kept


def system_text(layers: Layers) -> str:
    """The system message: seed 002's order (system prompt, bootstrap, memory, skills, tool
    documentation), the active project, then the summary of the earlier conversation."""
    parts = [layers.system]
    if layers.bootstrap:
        parts.append(layers.bootstrap)
    if layers.memories:
        parts.append(memory_block(layers.memories))
    parts += [p for p in (layers.skills, layers.tool_docs, layers.project) if p]
    if layers.summary:
        parts.append(f"{SUMMARY_HEADER}\n{layers.summary}")
    return "\n\n".join(parts)


def tokens_of(layers: Layers, max_tool_chars: int, stub_before: int | None = None,
              history: Sequence[StoredMessage] | None = None) -> int:
    """The context's size in tokens, the memory reserve counted; `history` instead of all
    the layers' history (the backlog is never sent: it is summarised)."""
    history = layers.history if history is None else history
    fixed = estimate_tokens(system_text(layers))
    fixed += max(0, layers.memory_reserve - memory_tokens(layers.memories))
    rest = [*history, *([layers.question] if layers.question else []), *layers.inrun]
    return fixed + sum(_cost(m, max_tool_chars, stub_before) for m in rest)


def fits(layers: Layers, budget: int, max_tool_chars: int,
         stub_before: int | None = None) -> bool:
    """Whether what is never cut (system prompt, memories, summary, the question and the
    in-run exchange) fits the budget: history is windowed into the room left."""
    return tokens_of(layers, max_tool_chars, stub_before, history=()) <= budget


def history_window(history: Sequence[StoredMessage], max_tokens: int,
                   max_tool_chars: int, stub_before: int | None = None
                   ) -> list[StoredMessage]:
    """The newest history messages that fit `max_tokens`, starting at a user message."""
    taken: list[StoredMessage] = []
    used = 0
    for message in reversed(history):
        cost = _cost(message, max_tool_chars, stub_before)
        if used + cost > max_tokens:
            break
        taken.append(message)
        used += cost
    taken.reverse()
    for i, message in enumerate(taken):
        if message.role == "user":
            return taken[i:]
    return []


def assemble(layers: Layers, *, budget: int, history_max_tokens: int, max_tool_chars: int,
             stub_before: int | None = None) -> list[dict[str, Any]]:
    """The turn's messages: the question and in-run exchange whole, history in what room
    is left (at most `history_max_tokens`)."""
    fixed = tokens_of(layers, max_tool_chars, stub_before, history=())
    room = max(0, min(history_max_tokens, budget - fixed))
    history = history_window(layers.history, room, max_tool_chars, stub_before)
    out = [{"role": "system", "content": system_text(layers)}]
    out += to_provider(history, max_tool_chars, stub_before)
    current = [*([layers.question] if layers.question else []), *layers.inrun]
    out += to_provider(current, max_tool_chars, stub_before)
    return out
