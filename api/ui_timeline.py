"""A job's waterfall for the dashboard's job page: its steps as bars on one time axis.

Every bar comes from rows the job already has: its events (job_events), its tool calls
(tool_calls: dispatched, started, finished) and its model calls' usage (token_logs):

- `job`: created → finished (or now, while it is live);
- `queued`: created → its first `job_start` (waiting for a worker, its conversation, its
  batch);
- `turn`: `turn_start` → `turn_end` of that turn;
- `model`: the assistant's `message_start` → `message_end` (tokens, model, cost from the
  turn's token log); a call that failed ends at its turn's end;
- `compaction`: `compaction_start` → `compaction_end` (a summary asked of the model);
- `provider`: a wait for the model provider (`waiting_provider`: from `waiting_since` to the
  next event that is not another wait);
- `approval`: `approval_required` → `approval_resolved`;
- `tool`: the tool call's `started_at` → `finished_at`, with the time it was queued before
  (dispatched or approved → started) drawn lighter in front;
- `child`: a sub-agent's job, `child_started` → `child_ended`.

A bar still open when the page is read ends at the page's `now` and says so (`open`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Sequence

from agentq.loop.states import ToolCallStatus
from agentq.models import Job, JobEvent, TokenLog, ToolCall
from api.views import short_id

KINDS = {  # kind: (legend, what it is)
    "job": ("Job", "the whole job, submitted to ended"),
    "queued": ("Queued", "waiting to start (a worker, its conversation, its batch)"),
    "turn": ("Turn", "one turn of the loop: a model call and the tools it asked for"),
    "model": ("Model call", "the model thinking"),
    "compaction": ("Compaction", "the model summarising older turns"),
    "provider": ("Provider wait", "waiting for the model provider to answer again"),
    "approval": ("Approval wait", "a tool call waiting for a person"),
    "tool": ("Tool call", "a tool running (lighter: queued for a worker)"),
    "child": ("Sub-agent", "a child job"),
}


@dataclass
class Bar:
    kind: str
    label: str
    start: datetime
    end: datetime
    depth: int = 1
    open: bool = False
    """Still running when the page was read: it ends at the page's `now`."""
    status: str = ""
    """`ok`, `failed`, ... where the step says."""
    queued_from: datetime | None = None
    """A tool call: when it was dispatched (or approved); it started at `start`."""
    model: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    link: str | None = None
    """A child bar: the child job's id."""
    raw: dict[str, Any] = field(default_factory=dict)
    turn: int = 0
    left: float = 0.0
    width: float = 0.0
    queued_left: float = 0.0
    queued_width: float = 0.0

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())

    @property
    def queued_s(self) -> float:
        if self.queued_from is None:
            return 0.0
        return max(0.0, (self.start - self.queued_from).total_seconds())


@dataclass
class Waterfall:
    bars: list[Bar]
    start: datetime
    end: datetime
    ticks: list[tuple[float, str]]
    """(percent of the axis, label) for each tick."""

    @property
    def span_s(self) -> float:
        return (self.end - self.start).total_seconds()


def _at(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def build(job: Job, events: Sequence[JobEvent], calls: Sequence[ToolCall],
          token_logs: Sequence[TokenLog], now: datetime) -> Waterfall:
    """The waterfall of `job` (a Job row) from its JobEvent rows (in seq order), ToolCall rows
    and TokenLog rows, as read at `now`."""
    live = job.finished_at is None
    end_of_job = job.finished_at or now
    bars: list[Bar] = [Bar("job", "Job", job.created_at, end_of_job, depth=0, open=live,
                           status=job.status, input_tokens=job.input_tokens,
                           output_tokens=job.output_tokens, cost=job.cost_estimate,
                           raw={"id": str(job.id), "status": job.status,
                                "finish_reason": job.finish_reason,
                                "created_at": job.created_at, "started_at": job.started_at,
                                "finished_at": job.finished_at, "error": job.error})]
    started = next((e for e in events if e.type == "job_start"), None)
    bars.append(Bar("queued", "Queued" + (f" ({job.waiting_for})" if job.waiting_for
                                          and started is None else ""),
                    job.created_at, started.created_at if started else end_of_job,
                    open=started is None and live,
                    raw={"job_start": _event(started) if started else None}))
    logs = {t.iteration: t for t in token_logs}

    def until_next(index: int, skip: str) -> tuple[datetime, bool]:
        """When the first event after `index` that is not `skip` came (or now: open)."""
        for later in events[index + 1:]:
            if later.type != skip:
                return later.created_at, False
        return end_of_job, live

    opened: dict[tuple[str, Any], tuple[Any, Bar]] = {}
    for index, e in enumerate(events):
        data = e.data or {}
        turn = data.get("turn")
        if e.type == "turn_start":
            bar = Bar("turn", f"Turn {turn}", e.created_at, end_of_job, open=live,
                      turn=turn or 0, raw={"turn_start": _event(e)})
            opened[("turn", turn)] = (e, bar)
            bars.append(bar)
        elif e.type == "turn_end" and ("turn", turn) in opened:
            _, bar = opened.pop(("turn", turn))
            bar.end, bar.open = e.created_at, False
            bar.status = "failed" if data.get("error") else (data.get("stopped") or "ok")
            bar.raw["turn_end"] = _event(e)
            model = opened.pop(("model", turn), None)
            if model is not None:  # no reply: the call failed (or the job stopped)
                model[1].end, model[1].open = e.created_at, False
                model[1].status = "failed"
                model[1].raw["turn_end"] = _event(e)
        elif e.type == "message_start" and data.get("role") == "assistant":
            bar = Bar("model", "Model call", e.created_at, end_of_job, depth=2, open=live,
                      turn=turn or 0, raw={"message_start": _event(e)})
            opened[("model", turn)] = (e, bar)
            bars.append(bar)
        elif e.type == "message_end" and data.get("role") == "assistant":
            entry = opened.pop(("model", turn), None)
            if entry is None:
                continue
            bar = entry[1]
            bar.end, bar.open, bar.status = e.created_at, False, "ok"
            bar.model = data.get("model") or ""
            bar.label = f"Model call: {bar.model}" if bar.model else "Model call"
            bar.input_tokens = data.get("input_tokens")
            bar.output_tokens = data.get("output_tokens")
            log = logs.get(turn) if turn is not None else None
            if log is not None:
                bar.cost = log.cost_estimate
                bar.raw["token_log"] = _token_log(log)
            bar.raw["message_end"] = _event(e)
        elif e.type == "compaction_start":
            bar = Bar("compaction", "Compaction", e.created_at, end_of_job, depth=2,
                      open=live, turn=turn or 0, raw={"compaction_start": _event(e)})
            opened[("compaction", None)] = (e, bar)
            bars.append(bar)
        elif e.type == "compaction_end" and ("compaction", None) in opened:
            _, bar = opened.pop(("compaction", None))
            bar.end, bar.open = e.created_at, False
            bar.status = "failed" if data.get("error") else "ok"
            bar.label = f"Compaction ({data.get('strategy', '')})"
            bar.input_tokens = data.get("summary_input_tokens")
            bar.output_tokens = data.get("summary_output_tokens")
            version = data.get("summary_version")
            log = logs.get(-version) if version else None
            if log is not None:
                bar.cost, bar.model = log.cost_estimate, log.model
                bar.raw["token_log"] = _token_log(log)
            bar.raw["compaction_end"] = _event(e)
        elif e.type == "waiting_provider":
            previous = index > 0 and events[index - 1].type == "waiting_provider"
            if previous:  # one wait: its bar grows with each attempt
                bar = opened[("provider", None)][1]
            else:
                since = _at(data.get("waiting_since")) or e.created_at
                bar = Bar("provider", "Waiting for the provider", min(since, e.created_at),
                          e.created_at, depth=2, turn=turn or 0, raw={"attempts": []})
                opened[("provider", None)] = (e, bar)
                bars.append(bar)
            bar.raw["attempts"].append(_event(e))
            bar.end, bar.open = until_next(index, "waiting_provider")
            attempts = data.get("attempt") or len(bar.raw["attempts"])
            bar.label = f"Waiting for the provider ({attempts} attempt" \
                        f"{'s' if attempts != 1 else ''})"
            bar.status = str(data.get("error") or "")[:80]
        elif e.type == "approval_required":
            ident = data.get("tool_use_id")
            bar = Bar("approval", f"Approval: {data.get('name', '')}", e.created_at,
                      end_of_job, depth=2, open=live, turn=data.get("turn") or 0,
                      raw={"approval_required": _event(e)})
            opened[("approval", ident)] = (e, bar)
            bars.append(bar)
        elif e.type == "approval_resolved" and ("approval", data.get("tool_use_id")) in opened:
            _, bar = opened.pop(("approval", data.get("tool_use_id")))
            bar.end, bar.open = e.created_at, False
            bar.status = data.get("decision") or ""
            bar.raw["approval_resolved"] = _event(e)
        elif e.type == "child_started":
            child = str(data.get("job_id") or "")
            bar = Bar("child", f"Sub-agent {short_id(child)}", e.created_at, end_of_job, depth=2,
                      open=live, link=child or None, raw={"child_started": _event(e)})
            bar.turn = max((b.turn for b in bars if b.kind == "turn"), default=0)
            opened[("child", child)] = (e, bar)
            bars.append(bar)
        elif e.type == "child_ended" and ("child", str(data.get("job_id"))) in opened:
            _, bar = opened.pop(("child", str(data.get("job_id"))))
            bar.end, bar.open = e.created_at, False
            bar.status = data.get("status") or ""
            bar.raw["child_ended"] = _event(e)

    resolved = {b.raw["approval_resolved"]["data"].get("tool_use_id"):
                b.end for b in bars if b.kind == "approval" and "approval_resolved" in b.raw}
    tool_events: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        ident = (e.data or {}).get("tool_use_id")
        if ident and e.type.startswith("tool_execution"):
            tool_events.setdefault(ident, []).append(_event(e))
    for call in calls:
        queued_from = resolved.get(call.tool_use_id) or call.created_at
        if call.started_at is not None:
            start, end = call.started_at, call.finished_at or now
            is_open = call.finished_at is None
        else:  # never ran: rejected, denied, cancelled, or still queued
            start = end = call.finished_at or now
            is_open = call.finished_at is None and call.status in (ToolCallStatus.PENDING,
                                                                   ToolCallStatus.AWAITING)
            if call.status == ToolCallStatus.AWAITING:
                continue  # its approval bar says it
        ok = (call.result or {}).get("ok")
        bars.append(Bar(
            "tool", f"Tool: {call.name}", start, end, depth=2, open=is_open,
            status=call.status if ok is None or call.status != ToolCallStatus.SUCCEEDED else "ok",
            queued_from=min(queued_from, start), turn=call.iteration,
            raw={"tool_call": {"tool_use_id": call.tool_use_id, "name": call.name,
                               "status": call.status, "arguments": call.arguments,
                               "result": call.result, "queue": call.queue,
                               "attempts": call.attempts, "created_at": call.created_at,
                               "started_at": call.started_at,
                               "finished_at": call.finished_at},
                 "events": tool_events.get(call.tool_use_id, [])}))

    order = {"job": 0, "queued": 1, "turn": 2}
    head = [b for b in bars if b.kind in ("job", "queued")]
    rest = sorted((b for b in bars if b.kind not in ("job", "queued")),
                  key=lambda b: (b.turn or 0, order.get(b.kind, 3), b.start,
                                 b.queued_from or b.start))
    bars = head + rest
    start = job.created_at
    end = max([b.end for b in bars] + [start + timedelta(milliseconds=1)])
    span = (end - start).total_seconds()
    for bar in bars:
        bar.left = _percent(bar.start, start, span)
        bar.width = max(_percent(bar.end, start, span) - bar.left, 0.0)
        if bar.queued_from is not None:
            bar.queued_left = _percent(bar.queued_from, start, span)
            bar.queued_width = max(bar.left - bar.queued_left, 0.0)
    return Waterfall(bars, start, end, ticks(span))


def _percent(at: datetime, start: datetime, span_s: float) -> float:
    return round(100.0 * (at - start).total_seconds() / span_s, 3)


STEPS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120,
           300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""The axis's tick steps: round times."""


def ticks(span_s: float, most: int = 8) -> list[tuple[float, str]]:
    """Round times from 0 to `span_s` (at most `most` + 1 of them), as (percent, label)."""
    if span_s <= 0:
        return [(0.0, "0")]
    step = next((s for s in STEPS_S if s * most >= span_s), STEPS_S[-1])
    out, n = [], 0
    while n * step <= span_s + 1e-9:
        out.append((round(100.0 * n * step / span_s, 3), _tick_label(n * step, step)))
        n += 1
    return out


def _tick_label(at: float, step: float) -> str:
    if at == 0:
        return "0"
    if step < 0.01:
        return f"{at * 1000:.0f} ms"
    if at < 60:
        decimals = {0.01: 2, 0.02: 2, 0.05: 2, 0.1: 1, 0.2: 1, 0.5: 1}.get(step, 0)
        return f"{at:.{decimals}f} s"
    return duration(round(at))


def duration(seconds: float | None) -> str:
    """`850 ms`, `1.25 s`, `2 min 5 s`, `1 h 3 min`."""
    if seconds is None:
        return ""
    if seconds == 0:
        return "0 ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)} min {rest:.0f} s" if round(rest) else f"{int(minutes)} min"
    hours, rest = divmod(seconds, 3600)
    return f"{int(hours)} h {rest / 60:.0f} min" if round(rest / 60) else f"{int(hours)} h"


def _event(e: JobEvent) -> dict[str, Any]:
    return {"seq": e.seq, "type": e.type, "created_at": e.created_at, "data": e.data}


def _token_log(t: TokenLog) -> dict[str, Any]:
    return {"model": t.model, "input_tokens": t.input_tokens,
            "output_tokens": t.output_tokens, "cost_estimate": t.cost_estimate,
            "usage_estimated": t.usage_estimated, "created_at": t.created_at}
