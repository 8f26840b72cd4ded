"""The dashboard's overview (/ui/overview): the last hour of the system at a glance.

From the database: jobs ended per second and per minute, the failure rate, the p50/p95
duration (submitted → ended), live jobs now, and tokens and cost per model; from the broker:
its queues' depths and the workers that answer a ping. No Prometheus needed.

What a key sees follows the API's rules: a non-admin key its own jobs, a tenant admin its
tenant's, an operator every tenant's. Queue depths and workers are the deployment's (as
/metrics and /health/ready show them to anyone).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Protocol, TypeVarTuple, Unpack, cast

from sqlalchemy import ColumnElement, Integer, Select, func, literal, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import InstrumentedAttribute, Session

from agentq.config import Settings
from agentq.loop.states import ENDED_STATUSES, SHOWN_WAITS, UNENDED_STATUSES, JobStatus
from agentq.models import Job, TokenLog

log = logging.getLogger(__name__)
WINDOW = timedelta(hours=1)
BUCKET = timedelta(minutes=1)
BROKER_TIMEOUT_S = 1.0
"""How long the page waits for the broker (its queues) and for the workers' pongs."""
PALETTE = 6
"""Models drawn in colours of their own on the tokens chart; the rest are `other`."""
OTHER = "other"
BROKER_CACHE_S = 5.0
"""Broker reads are kept this long: several open pages ping the workers once."""
Row = TypeVarTuple("Row")


class Visible(Protocol):
    """Keeps, of a query's rows, those the page's key may see."""

    def __call__(self, query: Select[Unpack[Row]], /) -> Select[Unpack[Row]]: ...


def percentile(ordered: list[float], p: float) -> float | None:
    """The `p` percentile of sorted values, interpolated linearly between the two nearest
    (as Postgres's percentile_cont does)."""
    if not ordered:
        return None
    k = (len(ordered) - 1) * p
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


@dataclass
class Overview:
    now: datetime
    since: datetime
    scope: str
    ended: dict[str, int]
    submitted: int
    durations: list[float]
    minutes: list[dict[str, int]]
    """Jobs ended in each minute of the window, oldest first: {status: count}."""
    live: dict[str, int]
    models: list[dict[str, Any]]
    queues: list[dict[str, Any]] | None = None
    workers: dict[str, Any] = field(default_factory=dict)
    tokens_per_minute: list[dict[str, int]] = field(default_factory=list)
    """Tokens used in each minute of the window, oldest first: {model: tokens}."""
    model_legend: list[str] = field(default_factory=list)
    """The models drawn on the tokens chart, in order (their colours: m0, m1, ...)."""

    @property
    def busiest_tokens_minute(self) -> int:
        return max((sum(m.values()) for m in self.tokens_per_minute), default=0)

    @property
    def ended_total(self) -> int:
        return sum(self.ended.values())

    @property
    def jobs_per_s(self) -> float:
        return self.ended_total / WINDOW.total_seconds()

    @property
    def failure_rate(self) -> float | None:
        total = self.ended_total
        return self.ended.get(JobStatus.FAILED, 0) / total if total else None

    @property
    def p50_s(self) -> float | None:
        return percentile(self.durations, 0.5)

    @property
    def p95_s(self) -> float | None:
        return percentile(self.durations, 0.95)

    @property
    def tokens(self) -> int:
        return sum(m["input_tokens"] + m["output_tokens"] for m in self.models)

    @property
    def cost(self) -> float:
        return sum(m["cost"] for m in self.models)

    @property
    def busiest_minute(self) -> int:
        return max((sum(m.values()) for m in self.minutes), default=0)


def read(session: Session, now: datetime, visible: Visible, scope: str) -> Overview:
    """The database's part of the overview, at `now`, of the jobs `visible(query)` keeps."""
    since = now - WINDOW
    rows = session.execute(visible(
        select(Job.status, Job.created_at, Job.finished_at)
        .where(Job.finished_at >= since, Job.finished_at <= now,
               Job.status.in_(ENDED_STATUSES)))).all()
    ended = {status: 0 for status in ENDED_STATUSES}
    buckets = int(WINDOW / BUCKET)
    minutes = [{status: 0 for status in ENDED_STATUSES} for _ in range(buckets)]
    durations = []
    for status, created_at, finished_at in rows:
        assert finished_at is not None  # the query compares it: an ended job's
        ended[status] += 1
        durations.append((finished_at - created_at).total_seconds())
        ago = int((now - finished_at) / BUCKET)
        minutes[buckets - 1 - min(max(ago, 0), buckets - 1)][status] += 1
    durations.sort()
    submitted = session.execute(visible(
        select(func.count()).select_from(Job).where(Job.created_at >= since,
                                                    Job.created_at <= now))).scalar_one()
    live = {status: 0 for status in UNENDED_STATUSES}
    for status, waiting_for, count in session.execute(visible(
            select(Job.status, Job.waiting_for, func.count())
            .where(Job.status.in_(UNENDED_STATUSES)).group_by(Job.status, Job.waiting_for))).all():
        as_shown = JobStatus.WAITING if waiting_for in SHOWN_WAITS else status  # as the API does
        live[as_shown] = live.get(as_shown, 0) + count
    minutes_ago = _minutes_before(session, TokenLog.created_at, now).label("ago")
    usage = session.execute(visible(  # each model's calls and tokens in each minute
        select(TokenLog.model, minutes_ago, func.count(), func.sum(TokenLog.input_tokens),
               func.sum(TokenLog.output_tokens), func.sum(TokenLog.cost_estimate))
        .join(Job, Job.id == TokenLog.job_id)
        .where(TokenLog.created_at >= since, TokenLog.created_at <= now)
        .group_by(TokenLog.model, "ago"))).all()
    totals: dict[str, dict[str, Any]] = {}
    for model, _minute, calls, inp, out, cost in usage:
        total = totals.setdefault(model, {"model": model, "calls": 0, "input_tokens": 0,
                                          "output_tokens": 0, "cost": 0.0})
        total["calls"] += calls
        total["input_tokens"] += int(inp or 0)
        total["output_tokens"] += int(out or 0)
        total["cost"] += float(cost or 0.0)
    models = sorted(totals.values(),
                    key=lambda m: (-(m["input_tokens"] + m["output_tokens"]), m["model"]))
    shown = [m["model"] for m in models[:PALETTE - 1]]
    if len(models) == PALETTE:
        shown.append(models[-1]["model"])
    tokens_per_minute: list[dict[str, int]] = [{} for _ in range(buckets)]
    for model, minute, _calls, inp, out, _cost in usage:
        name = model if model in shown else OTHER
        index = buckets - 1 - min(max(int(minute or 0), 0), buckets - 1)
        slot = tokens_per_minute[index]
        slot[name] = slot.get(name, 0) + int(inp or 0) + int(out or 0)
    legend = shown + ([OTHER] if len(models) > len(shown) else [])
    return Overview(now, since, scope, ended, submitted, durations, minutes, live, models,
                    tokens_per_minute=tokens_per_minute, model_legend=legend)


def _minutes_before(session: Session, column: InstrumentedAttribute[datetime],
                    now: datetime) -> ColumnElement[Any]:
    """Whole minutes from `column` to `now`, in SQL (Postgres or SQLite)."""
    at = literal(now, type_=column.type)
    if session.get_bind().dialect.name == "postgresql":
        return func.floor(func.extract("epoch", at - column) / 60)
    return sql_cast((func.julianday(at) - func.julianday(column)) * 1440, Integer)


# --- the broker ----------------------------------------------------------------------------
_cache: dict[str, tuple[float, Any]] = {}
"""name: (kept until, on the monotonic clock; the value)."""
_cache_lock = threading.Lock()
_refreshing: set[str] = set()
"""The names whose new value a thread is reading now."""


def _cached(name: str, compute: Callable[[], Any]) -> Any:
    """`compute()`'s value, kept BROKER_CACHE_S. Once kept, a page never waits for the
    broker again: an older value is shown while one thread reads the new one (a ping
    always waits its whole timeout for the last pongs)."""
    with _cache_lock:
        hit = _cache.get(name)
        if hit is not None:
            if hit[0] <= time.monotonic() and name not in _refreshing:
                _refreshing.add(name)
                threading.Thread(target=_refresh, args=(name, compute), daemon=True,
                                 name=f"overview-{name}").start()
            return hit[1]
    return _keep(name, compute())


def _keep(name: str, value: Any) -> Any:
    with _cache_lock:
        _cache[name] = (time.monotonic() + BROKER_CACHE_S, value)
    return value


def _refresh(name: str, compute: Callable[[], Any]) -> None:
    try:
        _keep(name, compute())
    finally:
        with _cache_lock:
            _refreshing.discard(name)


def queue_names(settings: Settings) -> list[str]:
    from agentq.tools.registry import get_registry
    from tasks.names import MAINTENANCE_QUEUE, ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE
    registry = get_registry(settings)
    names = [ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE, MAINTENANCE_QUEUE,
             *registry.all_queues(slow=False), *registry.all_queues(slow=True)]
    return list(dict.fromkeys(names))


def queue_depths(settings: Settings) -> list[dict[str, Any]]:
    """[{queue, depth}] (depth None: unreadable) from the broker, kept a few seconds."""
    return _cached("queues", lambda: _read_queue_depths(settings))


def _read_queue_depths(settings: Settings) -> list[dict[str, Any]]:
    try:
        names = queue_names(settings)
    except Exception:  # noqa: BLE001 - the database or the registry is down: nothing to show
        log.warning("overview: queue names unreadable", exc_info=True)
        return []
    if settings.broker_url.startswith(("redis://", "rediss://")) \
            and not settings.embedded_broker:
        import redis
        client = redis.Redis.from_url(settings.broker_url, socket_timeout=BROKER_TIMEOUT_S,
                                      socket_connect_timeout=BROKER_TIMEOUT_S)
        try:
            with client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.llen(name)
                depths = [int(n) for n in pipe.execute()]
            return [{"queue": n, "depth": d} for n, d in zip(names, depths, strict=True)]
        except Exception as exc:  # noqa: BLE001 - shown as unknown on the page
            log.warning("overview: queue depths unreadable", extra={"error": repr(exc)})
            return [{"queue": n, "depth": None} for n in names]
        finally:
            client.close()
    return [{"queue": n, "depth": d} for n, d in zip(names, _declared_depths(names),
                                                             strict=True)]


class _DeclareOk(Protocol):
    message_count: int


class _Channel(Protocol):
    """What each kombu transport's channel has (the stubs type `Connection.channel()` as the
    base StdChannel, which declares neither)."""

    def queue_declare(self, queue: str, passive: bool) -> _DeclareOk: ...

    def close(self) -> None: ...


def _declared_depths(names: list[str]) -> list[int | None]:
    """Any other broker (RabbitMQ, the embedded one): each queue declared passively, which
    answers its message count without changing it."""
    from tasks.app import app
    out: list[int | None] = []
    try:
        with app.connection_for_read(connect_timeout=BROKER_TIMEOUT_S) as conn:
            # whole seconds: kombu's ensure_connection takes an int
            conn.ensure_connection(max_retries=1, timeout=math.ceil(BROKER_TIMEOUT_S))
            for name in names:
                channel = cast(_Channel, conn.channel())
                try:
                    out.append(int(channel.queue_declare(queue=name, passive=True)
                                   .message_count))
                except Exception:  # noqa: BLE001 - not declared yet: nothing waits in it
                    out.append(0)
                finally:
                    try:
                        channel.close()
                    except Exception:  # noqa: BLE001
                        pass
    except Exception as exc:  # noqa: BLE001
        log.warning("overview: queue depths unreadable", extra={"error": repr(exc)})
        return [None] * len(names)
    return out


def workers(settings: Settings) -> dict[str, Any]:
    """{"mode", "alive": [{hostname, kind}], "error"} – the workers that answered a ping
    within BROKER_TIMEOUT_S; in embedded mode the worker thread of this process."""
    return _cached("workers", lambda: _ping(settings))


def _ping(settings: Settings) -> dict[str, Any]:
    if settings.embedded_broker:
        running = any(t.name == "agentq-worker" and t.is_alive()
                      for t in threading.enumerate())
        return {"mode": "embedded",
                "alive": [{"hostname": "embedded@localhost", "kind": "every queue"}]
                if running else [], "error": None}
    from tasks.app import app
    try:
        replies = app.control.ping(timeout=BROKER_TIMEOUT_S) or []
    except Exception as exc:  # noqa: BLE001 - the broker is down: said on the page
        log.warning("overview: workers not pinged", extra={"error": repr(exc)})
        return {"mode": "broker", "alive": [], "error": type(exc).__name__}
    alive = sorted({hostname for reply in replies for hostname in reply})
    return {"mode": "broker", "error": None,
            "alive": [{"hostname": h, "kind": _kind(h)} for h in alive]}


def _kind(hostname: str) -> str:
    """The worker's kind from its name (`agentq worker KIND` names it KIND@host; beat's
    worker is beat-PID@host)."""
    name = hostname.partition("@")[0]
    return "beat" if name.startswith("beat-") else name
