"""What a compaction does, as pure functions of a turn's context layers
(`agentq.loop.context.Layers`): when the context passes the threshold, which tool results
are sent as stubs and which older turns are folded into the summary (`plan_compaction`,
`next_round`), how much transcript one summary call reads, and that call's request; the
summary as stored (`cut_summary`) and the layers once it is in (`after_summary`).
`agentq.loop.compaction` does the I/O around them.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Sequence

from agentq.loop.context import (
    CHARS_PER_TOKEN,
    MESSAGE_OVERHEAD_TOKENS,
    PRUNED_RESULT,
    Layers,
    StoredMessage,
    estimate_tokens,
    fits,
    render_tool_result,
    tokens_of,
    truncate,
)


@dataclass(frozen=True)
class Compaction:
    """What to do when the context passes the threshold."""
    tokens_before: int
    messages_before: int
    stub_before_seq: int | None
    """Tool results with a lower seq are sent as stubs."""
    summarize: tuple[StoredMessage, ...]
    """Older turns to fold into the summary (empty: pruning was enough)."""


def turns(messages: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
    """Messages grouped into turns that can be cut between: a group starts at a user or an
    assistant message, or at a tool call that follows a tool result."""
    groups: list[list[StoredMessage]] = []
    previous = None
    for m in messages:
        starts = (not groups or m.role in ("user", "assistant")
                  or (m.role == "tool_call" and previous == "tool_result"))
        if starts:
            groups.append([m])
        else:
            groups[-1].append(m)
        previous = m.role
    return groups


def plan_compaction(layers: Layers, budget: int, threshold: float, max_tool_chars: int,
                    keep_turns: int, max_chars: int | None = None,
                    force: bool = False) -> Compaction | None:
    """None while the context is under `threshold` of `budget` and no backlog waits; else:
    prune tool results older than the newest `keep_turns` in-run turns (and all of
    history's); if that is not enough, summarise history and the in-run turns older than
    those. A backlog (old messages the history read left out) is always summarised first,
    with the older half of the history read, so that the next turns need no summary.
    `max_chars`: most transcript one summary call reads; what it cannot take is left for
    the next round (`force`: a further round, whatever the threshold says)."""
    limit = int(budget * threshold)
    before = tokens_of(layers, max_tool_chars)
    if before <= limit and not layers.backlog and not force:
        return None
    count = message_count(layers)
    inrun_turns = turns(layers.inrun)
    kept = inrun_turns[-keep_turns:] if keep_turns else []
    old_inrun = [m for group in inrun_turns[:len(inrun_turns) - len(kept)] for m in group]
    stub_before = (kept[0][0].seq if kept else
                   (layers.question.seq if layers.question else None))
    if stub_before is None and layers.inrun:
        stub_before = layers.inrun[-1].seq + 1
    if stub_before is None:
        stub_before = (layers.history[-1].seq + 1) if layers.history else None
    if layers.backlog:
        summarize = list(layers.backlog)
        if not layers.backlog_more:
            summarize += older_half(layers.history)
        return Compaction(before, count, stub_before,
                          cap_chars(summarize, max_chars, max_tool_chars))
    if not force and tokens_of(layers, max_tool_chars, stub_before) <= limit:
        return Compaction(before, count, stub_before, ())
    summarize = [*layers.history, *old_inrun]
    if not summarize:
        return Compaction(before, count, stub_before, ())
    return Compaction(before, count, stub_before,
                      cap_chars(summarize, max_chars, max_tool_chars))


def next_round(layers: Layers, budget: int, threshold: float, max_tool_chars: int,
               keep_turns: int, max_chars: int | None) -> Compaction | None:
    """The compaction this context needs now (the first of a turn, or one more after a
    summary): as `plan_compaction`; and when nothing is left to summarise while keeping
    the newest `keep_turns` turns and the context still does not fit the budget, the kept
    turns are summarised too. None: it fits under the threshold, with no backlog."""
    plan = plan_compaction(layers, budget, threshold, max_tool_chars, keep_turns, max_chars)
    if plan is None or plan.summarize:
        return plan
    if fits(layers, budget, max_tool_chars, plan.stub_before_seq):
        return plan
    return plan_compaction(layers, budget, threshold, max_tool_chars, 0, max_chars,
                           force=True)


def message_count(layers: Layers) -> int:
    """The messages a compaction looks at: history (its backlog too), question, in-run."""
    return (len(layers.backlog) + len(layers.history) + len(layers.inrun)
            + (1 if layers.question else 0))


def older_half(history: Sequence[StoredMessage]) -> list[StoredMessage]:
    """History's older half, cut before a user message (what stays starts at one)."""
    middle = len(history) // 2
    for i in range(middle, len(history)):
        if history[i].role == "user":
            return list(history[:i])
    return []


def transcript_chars(message: StoredMessage, max_tool_chars: int) -> int:
    """About how much of a summary call's transcript a message takes."""
    if message.role == "tool_result":
        return min(len(message.content), min(max_tool_chars, 2000)) + 40
    return len(message.content) + 20


def cap_chars(messages: Sequence[StoredMessage], max_chars: int | None,
              max_tool_chars: int) -> tuple[StoredMessage, ...]:
    """The oldest whole turns of `messages` whose transcript fits `max_chars` (at least one
    turn: a longer one is cut in the transcript); the rest waits for another round."""
    if max_chars is None:
        return tuple(messages)
    taken: list[StoredMessage] = []
    used = 0
    for group in turns(messages):
        size = sum(transcript_chars(m, max_tool_chars) for m in group)
        if taken and used + size > max_chars:
            break
        taken += group
        used += size
    return tuple(taken)


SUMMARY_QUESTION_CHARS = 4000


def summary_max_tokens(budget: int) -> int:
    """The longest summary asked for."""
    return min(2048, max(256, budget // 4))


def cut_summary(text: str, max_tokens: int) -> tuple[str, bool]:
    """A summary as stored: at most `max_tokens` (as the context counts them), cut at the
    last whitespace before that when there is one near it. A server may ignore the
    call's `max_tokens`; were its summary stored whole, each round's summary (which folds
    the previous one in) could grow until the context no longer fits. True when cut."""
    limit = max(1, max_tokens - MESSAGE_OVERHEAD_TOKENS) * CHARS_PER_TOKEN
    if len(text) <= limit:
        return text, False
    cut = text[:limit]
    space = max(cut.rfind(" "), cut.rfind("\n"))
    if space >= limit * 9 // 10:
        cut = cut[:space]
    return cut.rstrip(), True


def summary_chars(budget: int, layers: Layers | None = None) -> int:
    """Most transcript one summary call reads: what the budget leaves once the call's
    instructions, the previous summary, the question and the new summary's room are
    counted (so the summary call itself fits the model's window), at least 2,000."""
    used = estimate_tokens(SUMMARY_SYSTEM_PROMPT) + summary_max_tokens(budget) + 64
    if layers is not None:
        used += estimate_tokens(layers.summary or "")
        if layers.question is not None:
            used += estimate_tokens(layers.question.content[:SUMMARY_QUESTION_CHARS])
    return max(2000, (budget - used) * CHARS_PER_TOKEN)


def after_summary(layers: Layers, summary: str, through_seq: int) -> Layers:
    """The layers once everything up to `through_seq` is in `summary`."""
    return dataclasses.replace(
        layers, summary=summary,
        history=[m for m in layers.history if m.seq > through_seq],
        inrun=[m for m in layers.inrun if m.seq > through_seq],
        backlog=[m for m in layers.backlog if m.seq > through_seq])


SUMMARY_SYSTEM_PROMPT = (
    "You compact a conversation between a user and an AI assistant so that the assistant "
    "can continue it. Write a concise summary of the messages given: facts learned, tool "
    "results that still matter, decisions, what was asked and answered, and what is still "
    "open. Keep names, numbers and identifiers exactly. Reply with the summary only.")


def summary_request(previous: str | None, question: StoredMessage | None,
                    messages: Sequence[StoredMessage], max_tool_chars: int,
                    max_chars: int, stub_before: int | None) -> list[dict[str, Any]]:
    """The model call that folds `messages` (and the previous summary) into a new one."""
    lines = []
    for m in messages:
        if m.role == "tool_result":
            data = json.loads(m.content)
            body = (PRUNED_RESULT.format(name=data.get("name"), chars=len(m.content))
                    if stub_before is not None and m.seq < stub_before
                    else render_tool_result(data, min(max_tool_chars, 2000)))
            lines.append(f"[tool result {data.get('name')}] {body}")
        elif m.role == "tool_call":
            data = json.loads(m.content)
            lines.append(f"[tool call {data.get('name')}] "
                         f"{json.dumps(data.get('arguments') or {})}")
        else:
            lines.append(f"[{m.role}] {m.content}")
    transcript = truncate("\n".join(lines), max_chars)
    parts = []
    if question is not None:
        parts.append("The user's current request (for context; do not answer it):\n"
                     + truncate(question.content, SUMMARY_QUESTION_CHARS))
    if previous:
        parts.append(f"The summary so far:\n{previous}")
    parts.append(f"Messages to add to the summary:\n{transcript}")
    return [{"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
            {"role": "user", "content": "\n\n".join(parts)}]
