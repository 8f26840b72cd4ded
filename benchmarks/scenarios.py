"""The scenarios of issue 4. Each takes the running Lab, its sizes and the results so far, and
returns a JSON-able dict. Times are wall clock; a job's end is its row's `finished_at`.

    server      the scripted model server alone: its request rate and CPU per call
    overhead    submit → completed, one job at a time: the stack vs the in-process floor
    throughput  closed-loop clients stepped up: jobs/s, latency, the knee
    inflight    10 s model latency, N jobs at once: model calls waiting at once, jobs/s vs
                the ideal, orchestrator memory
    growth      per-turn overhead at 10 / 1,000 / 10,000 stored messages, 1 / 50 / 200 turns
    recall      memory.recall latency with 10,000 memories stored (the migrations' backend), or
                with --memory-backend pgvector 10,000 x 1,536 and 1,000,000 x 384 dimensions
                on pgvector's HNSW (benchmarks/recall.py)
    peer        the peers (benchmarks/peer.py: LangGraph sync and async with the Postgres
                checkpointer, DBOS Transact) vs agentq, same jobs, same model server, same
                pool size: one at a time, a burst, and the in-flight scenario's jobs
    modules     a tool call to an HTTP module and to an MCP server vs an in-process tool
    subagents   a parent delegating ten children in one turn vs ten top-level jobs of the
                same work: time and machine CPU per child (benchmarks/subagents.py)
"""
from __future__ import annotations

import http.client
import itertools
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from benchmarks.harness import (
    GROWTH_MODEL,
    GROWTH_WINDOW_TOKENS,
    ROOT,
    Client,
    CpuMeter,
    JobWatcher,
    Lab,
    RssSampler,
    job_breakdown,
    query,
    ratio,
    summary,
    uid,
)
from benchmarks.recall import scenario_recall

ONE_TOOL_TURN = "What is 6*7? Use the calculator. turns=1"
JOB_TIMEOUT_S = 120


@dataclass
class Sizes:
    server_seconds: float = 5.0
    server_clients: int = 16
    overhead_jobs: int = 100
    warmup_jobs: int = 3
    throughput_levels: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    throughput_level_s: float = 20.0
    inflight_jobs: int = 1000
    inflight_latency_s: float = 10.0
    inflight_submitters: int = 64
    growth_histories: list[int] = field(default_factory=lambda: [10, 1000, 10000])
    growth_jobs: int = 10
    growth_turns: list[int] = field(default_factory=lambda: [1, 50, 200])
    growth_turn_jobs: int = 5
    recall_memories: list[int] = field(default_factory=lambda: [10000])
    recall_dimensions: int = 1536
    recall_queries: int = 50
    recall_backend: str = "lab"
    recall_pgvector: list[str] = field(default_factory=lambda: ["10000x1536", "1000000x384"])
    peer_seq_jobs: int = 30
    peer_burst_jobs: int = 300
    peers: list[str] = field(default_factory=lambda: ["langgraph", "langgraph-async", "dbos"])
    batch_lines: int = 2000
    modules_calls: int = 200
    fair: str = "full"
    """The fair comparison's sizes (benchmarks/fair.py: SIZES)."""
    fair_systems: list[str] = field(default_factory=list)
    """The fair comparison's systems (benchmarks/fair.py: ALL); empty: all of them."""
    subagents: str = "full"
    """The sub-agents row's sizes (benchmarks/subagents.py: SIZES)."""


FULL = Sizes()
QUICK = Sizes(server_seconds=1.0, overhead_jobs=10, warmup_jobs=1,
              throughput_levels=[1, 8, 32], throughput_level_s=4.0,
              inflight_jobs=300, growth_jobs=2, growth_turn_jobs=1,
              peer_seq_jobs=6, peer_burst_jobs=60, batch_lines=300, modules_calls=50,
              recall_pgvector=["10000x1536"], fair="quick", subagents="quick")
SMOKE = Sizes(server_seconds=0.3, server_clients=2, overhead_jobs=2, warmup_jobs=1,
              throughput_levels=[1, 2], throughput_level_s=0.5,
              inflight_jobs=4, inflight_latency_s=0.3, inflight_submitters=4,
              growth_histories=[10, 100], growth_jobs=1, growth_turns=[1, 2],
              growth_turn_jobs=1, peer_seq_jobs=1, peer_burst_jobs=2, batch_lines=5,
              recall_memories=[100], recall_queries=2, recall_pgvector=["1000x64"],
              modules_calls=2, fair="smoke", subagents="smoke")


class Context:
    """What the scenarios share: the lab, a client, a watcher, results so far."""

    def __init__(self, lab: Lab | None, sizes: Sizes):
        self.lab, self.sizes = lab, sizes
        # no lab when only STANDALONE scenarios run
        self.client = Client(lab.stack.base, lab.key) if lab is not None else None
        self.watcher = JobWatcher(lab.database_url) if lab is not None else None
        self.results: dict[str, Any] = {}

    def one_job(self, content: str = ONE_TOOL_TURN, user: str | None = None,
                channel: str | None = None, persona_id: str | None = None) -> dict[str, Any]:
        job_id, t0 = self.client.submit(content, user, channel, persona_id)
        row = self.watcher.wait(job_id, JOB_TIMEOUT_S)
        return {**row, "submitted": t0}

    def pids(self) -> dict[str, int]:
        import os
        return {**self.lab.stack.pids(), "model_server": self.lab.server.pid,
                "bench_client": os.getpid()}

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()


def _ok(row: dict[str, Any]) -> bool:
    return row.get("status") == "completed" and row.get("finish_reason") == "end_turn"


MAX_ITERATIONS = 200
"""The lab's AGENTQ_MAX_ITERATIONS (benchmarks/harness.py)."""


def _ended_at_limit(row: dict[str, Any]) -> bool:
    return row.get("status") == "completed" and row.get("finish_reason") == "max_iterations"


# --- server: the model server alone ------------------------------------------------------

def scenario_server(ctx: Context) -> dict[str, Any]:
    """The scripted server alone, hit by plain keep-alive HTTP clients (no agentq)."""
    server, sizes = ctx.lab.server, ctx.sizes
    parts = urlsplit(server.base_url)
    body = json.dumps({"model": "gpt-4o-mini", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": ONE_TOOL_TURN}],
        "tools": [{"type": "function", "function": {"name": "math-evaluate",
                                                     "parameters": {"type": "object"}}}]})
    latencies: list[list[float]] = [[] for _ in range(sizes.server_clients)]
    stop_at = time.monotonic() + sizes.server_seconds
    server.set_latency(0)
    server.reset()

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            conn.request("POST", parts.path + "/chat/completions", body,
                         {"Content-Type": "application/json"})
            conn.getresponse().read()
            latencies[i].append(time.perf_counter() - t0)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(sizes.server_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stats = server.stats()
    flat = [x for per in latencies for x in per]
    return {"clients": sizes.server_clients, "calls": len(flat),
            "requests_per_s": round(len(flat) / wall, 1), "latency": summary(flat),
            "server_cpu_ms_per_call": stats.get("cpu_ms_per_call"),
            "note": "Python keep-alive clients in the benchmark process; the rate is bounded "
                    "by those clients as much as by the server."}


# --- 1. overhead -------------------------------------------------------------------------

def scenario_overhead(ctx: Context) -> dict[str, Any]:
    from benchmarks.floor import Floor, new_ids
    lab, sizes = ctx.lab, ctx.sizes
    lab.server.set_latency(0)
    floor = Floor(lab.settings(), lab.server.base_url)
    try:
        for _ in range(sizes.warmup_jobs):
            ctx.one_job()
            floor.run_job(ONE_TOOL_TURN, *new_ids())
        stack_lat, floor_lat, stack_ids, floor_ids, failed = [], [], [], [], 0
        lab.server.reset()
        for _ in range(sizes.overhead_jobs):  # interleaved, so both see the same noise
            row = ctx.one_job()
            if _ok(row):
                stack_lat.append(row["finished"] - row["submitted"])
                stack_ids.append(row["id"])
            else:
                failed += 1
            frow = floor.run_job(ONE_TOOL_TURN, *new_ids())
            if frow["status"] == "completed":
                floor_lat.append(frow["finished"] - frow["submitted"])
                floor_ids.append(frow["id"])
            else:
                failed += 1
        model = lab.server.stats()
    finally:
        floor.close()
    agentq, base = summary(stack_lat), summary(floor_lat)
    return {
        "jobs": sizes.overhead_jobs, "failed": failed,
        "agentq": agentq, "floor": base,
        "ratio_median": ratio(agentq["median_ms"], base["median_ms"]),
        "ratio_p95": ratio(agentq["p95_ms"], base["p95_ms"]),
        "agentq_breakdown_ms": job_breakdown(lab.database_url, stack_ids),
        "floor_breakdown_ms": job_breakdown(lab.database_url, floor_ids),
        "model_server_cpu_ms_per_call": model.get("cpu_ms_per_call"),
        "target": "agentq median within 2x of the floor",
        "met": (ratio(agentq["median_ms"], base["median_ms"]) or 99) <= 2.0,
    }


# --- 2. throughput -----------------------------------------------------------------------

def _closed_loop(ctx: Context, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` clients, each submitting a job and waiting for it, again and again until
    `seconds` have passed since the meter started, and at least once whatever the machine's
    load (a loaded machine may start a client's thread after the time is up)."""
    latencies: list[float] = []
    ends: list[float] = []
    failures = [0]
    lock = threading.Lock()

    def one() -> None:
        try:
            row = ctx.one_job()
        except Exception:  # noqa: BLE001 - counted
            with lock:
                failures[0] += 1
            return
        with lock:
            if _ok(row):
                latencies.append(row["finished"] - row["submitted"])
                ends.append(row["finished"])
            else:
                failures[0] += 1

    def client() -> None:
        one()
        while time.monotonic() < stop_at:
            one()

    meter = CpuMeter(ctx.pids()).start()
    stop_at = time.monotonic() + seconds
    start = time.time()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = meter.stop()
    elapsed = (max(ends) - start) if ends else seconds
    done = len(latencies)
    return {"clients": clients, "completed": done, "failed": failures[0],
            "elapsed_s": round(elapsed, 2),
            "jobs_per_s": round(done / elapsed, 2) if elapsed > 0 else None,
            "latency": summary(latencies), "machine_busy": cpu["machine_busy"],
            "cpu_ms_per_job": {name: round(1000 * s / done, 2) if done else None
                               for name, s in cpu["cpu_s"].items()}}


def scenario_throughput(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    ctx.lab.server.set_latency(0)
    for _ in range(sizes.warmup_jobs):
        ctx.one_job()
    levels = [_closed_loop(ctx, n, sizes.throughput_level_s) for n in sizes.throughput_levels]
    best = max(levels, key=lambda lv: lv["jobs_per_s"] or 0)
    saturated = best["jobs_per_s"] or 0
    knee = next(lv for lv in levels if (lv["jobs_per_s"] or 0) >= 0.9 * saturated)
    return {"model_latency_s": 0, "level_s": sizes.throughput_level_s,
            "levels": levels, "saturated_jobs_per_s": saturated,
            "knee_clients": knee["clients"], "knee_jobs_per_s": knee["jobs_per_s"],
            "knee_latency": knee["latency"],
            "processes": "web: gunicorn 2 gevent workers; orchestrator: "
                         + (f"{len(ctx.lab.stack.orchestrators)} processes, each "
                            if len(ctx.lab.stack.orchestrators) > 1 else "")
                         + f"{ctx.lab.settings().orchestrator_pool} x "
                         f"{ctx.lab.settings().orchestrator_concurrency}; tools: threads x "
                         f"{ctx.lab.settings().tools_concurrency}; tools-slow, webhooks, beat",
            "knee_rule": "the fewest clients reaching 90% of the best jobs/s"}


# --- 3. in flight ------------------------------------------------------------------------

def scenario_inflight(ctx: Context) -> dict[str, Any]:
    lab, sizes = ctx.lab, ctx.sizes
    n, latency = sizes.inflight_jobs, sizes.inflight_latency_s
    lab.server.set_latency(latency)
    lab.server.reset()
    pids = lab.stack.pids()
    samplers = {name: RssSampler(pids[name]) for name in lab.stack.orchestrators}
    for sampler in samplers.values():
        sampler.start()
    waiting = WaitingSampler(lab.server)
    waiting.start()
    meter = CpuMeter(ctx.pids()).start()
    submitted: dict[str, float] = {}
    answered: list[tuple[float, float]] = []  # (when the 202 came, how long the POST took)
    lock = threading.Lock()

    def submit(_i: int) -> None:
        job_id, t0 = ctx.client.submit(ONE_TOOL_TURN)
        t1 = time.time()
        with lock:
            submitted[job_id] = t0
            answered.append((t1, t1 - t0))

    start = time.time()
    try:
        with ThreadPoolExecutor(max_workers=min(sizes.inflight_submitters, n)) as pool:
            list(pool.map(submit, range(n)))
        submit_s = time.time() - start
        rows = ctx.watcher.wait_all(list(submitted), JOB_TIMEOUT_S + 4 * latency + n * 0.2)
    finally:
        memories = {name: sampler.stop() for name, sampler in samplers.items()}
        memory = memories["orchestrator"]
        timeline = waiting.stop()
        cpu = meter.stop()
        model = lab.server.stats()
        lab.server.set_latency(0)
    ok = [r for r in rows if _ok(r)]
    elapsed = max(r["finished"] for r in rows) - start
    jobs_per_s = len(ok) / elapsed if elapsed > 0 else 0.0
    littles = n / (2 * latency)
    saturated = (ctx.results.get("throughput") or {}).get("saturated_jobs_per_s")
    ideal = min(littles, saturated) if saturated else littles
    return {
        "jobs": n, "model_latency_s": latency, "completed": len(ok),
        "failed": len(rows) - len(ok),
        "orchestrator_concurrency": lab.settings().orchestrator_concurrency,
        "orchestrator_pool": lab.settings().orchestrator_pool,
        "submit_s": round(submit_s, 2), "elapsed_s": round(elapsed, 2),
        "max_model_calls_waiting": model.get("max_in_flight"),
        "model_calls": model.get("calls"),
        "jobs_per_s": round(jobs_per_s, 2),
        "ideal_jobs_per_s": round(ideal, 2),
        "ideal_basis": ("min(Little's law, saturated throughput)" if saturated
                        else "Little's law (throughput scenario not run)"),
        "fraction_of_ideal": round(jobs_per_s / ideal, 3) if ideal else None,
        "latency": summary(r["finished"] - submitted[r["id"]] for r in ok),
        "orchestrator_rss_mib": memory,
        "orchestrators": len(memories),
        "orchestrators_rss_mib": memories,
        "cpu_s": cpu["cpu_s"], "machine_busy": cpu["machine_busy"],
        "cpu_ms_per_job": {k: round(1000 * v / n, 1) for k, v in cpu["cpu_s"].items()},
        "waiting_timeline": timeline,
        "submit_latency": summary(took for _at, took in answered),
        "submit_timeline": submit_timeline([at - start for at, _took in answered]),
        "targets": {"all_waiting_at_once": model.get("max_in_flight") == n,
                    "ninety_percent_of_ideal": bool(ideal and jobs_per_s >= 0.9 * ideal),
                    "under_1_gib": all(m["peak_mib"] < 1024 for m in memories.values())},
    }


def submit_timeline(offsets: list[float], bucket_s: float = 5.0) -> list[list[float]]:
    """Submits answered per `bucket_s` of the run: [bucket's start, s since start; count],
    every bucket up to the last answer's (a stall shows as a bucket of few or none)."""
    if not offsets:
        return []
    counts = [0] * (int(max(offsets) // bucket_s) + 1)
    for offset in offsets:
        counts[int(offset // bucket_s)] += 1
    return [[round(i * bucket_s, 1), n] for i, n in enumerate(counts)]


class WaitingSampler(threading.Thread):
    """The model server's calls in flight, once a second: [seconds since start, count]."""

    def __init__(self, server, interval_s: float = 1.0):
        super().__init__(daemon=True, name="waiting-sampler")
        self.server, self.interval_s = server, interval_s
        self.points: list[list[float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        import requests
        http = requests.Session()  # its own: sessions are not shared across threads
        t0 = time.monotonic()
        while not self._halt.wait(self.interval_s):
            try:
                stats = http.get(f"{self.server.root}/stats", timeout=5).json()
                self.points.append([round(time.monotonic() - t0, 1), stats["in_flight"]])
            except Exception:  # noqa: BLE001 - a missed sample
                continue

    def stop(self) -> list[list[float]]:
        self._halt.set()
        self.join(timeout=5)
        return self.points


# --- 4. growth ---------------------------------------------------------------------------

SEED_UNSUMMARISED = 100
"""Most messages of a seeded long conversation after its summary: 100 of the seed's
messages (~2,530 tokens) pass the growth window's compaction threshold (2,457 tokens), so
the job that finds them summarises first."""


def seed_tail(job: int, jobs: int) -> int:
    """The unsummarised messages of the `job`-th (0-based) of `jobs` seeded long
    conversations: spread evenly up to SEED_UNSUMMARISED. A long conversation's steady
    state: a compaction summarises all its history, and the jobs after it add a few messages
    each until the threshold is passed again, so a job finds a tail anywhere from a few
    messages to the threshold's; the last of the jobs finds the threshold passed and pays a
    summary call (one job in `jobs`: in the real steady state of this window, with four
    messages a job, one in about 25)."""
    return max(2, round(SEED_UNSUMMARISED * (job + 1) / jobs) // 2 * 2)


def seed_conversation(lab: Lab, user: str, channel: str, count: int,
                      unsummarised: int = SEED_UNSUMMARISED) -> None:
    """A conversation with `count` stored messages (alternating user / assistant), written
    directly, seq numbers taken from conversations.message_seq as agentq does; with more
    than `unsummarised`, a summary of all but the newest `unsummarised`."""
    from sqlalchemy import insert, update

    from agentq.db import session_scope, utcnow
    from agentq.loop.context import estimate_tokens
    from agentq.loop.identity import Incoming, resolve
    from agentq.models import Conversation, ConversationSummary, Message
    from agentq.tenants import DEFAULT_TENANT_ID  # the bench key's tenant
    settings = lab.settings()
    incoming = Incoming("api", user, channel)
    with session_scope(settings) as session:
        _, _, conversation = resolve(session, DEFAULT_TENANT_ID, incoming, settings)
        if count <= 0:
            return
        last = session.execute(
            update(Conversation).where(Conversation.id == conversation.id)
            .values(message_seq=Conversation.message_seq + count)
            .returning(Conversation.message_seq)).scalar_one()
        first, now = last - count + 1, utcnow()
        rows = []
        for i in range(count):
            role = "user" if i % 2 == 0 else "assistant"
            content = (f"Earlier question number {i}: how many apples are left if I eat "
                       f"{i % 7} of {i % 13 + 10}?" if role == "user" else
                       f"Earlier answer number {i}: {i % 13 + 10 - i % 7} apples are left, "
                       "since eating some leaves the rest.")
            rows.append({"id": uuid.uuid4(), "conversation_id": conversation.id,
                         "job_id": None, "seq": first + i, "role": role, "content": content,
                         "token_count": estimate_tokens(content), "model_used": None,
                         "created_at": now})
        for k in range(0, len(rows), 2000):
            session.execute(insert(Message), rows[k:k + 2000])
        if count > unsummarised:
            # the steady state of a long conversation: its older messages are in its
            # summary (agentq summarises history older than the history read, never drops
            # it; a conversation seeded without one would be summarised by its next job)
            session.add(ConversationSummary(
                conversation_id=conversation.id, version=1,
                content="The user asked many questions about apples left after eating "
                        "some; each was answered with the count of apples left.",
                through_seq=last - unsummarised, messages_summarized=count - unsummarised,
                job_id=None, model="seed", input_tokens=0, output_tokens=0, created_at=now))
    analyze_messages(lab)


def analyze_messages(lab: Lab) -> None:
    """ANALYZE messages: the planner statistics autovacuum reaches on its own after a bulk
    insert. Without it, a freshly seeded long conversation is planned as a bitmap scan of
    its whole history plus a sort (see docs/benchmarks.md), and the figures would depend on
    whether autovacuum happened to run."""
    query(lab.database_url, "ANALYZE messages")


def growth_persona(lab: Lab) -> str:
    """A persona whose jobs name GROWTH_MODEL (a window of GROWTH_WINDOW_TOKENS), on a
    platform of its own so that no other scenario's job resolves to it."""
    from agentq.db import session_scope
    from agentq.models import Persona
    from agentq.tenants import DEFAULT_TENANT_ID
    with session_scope(lab.settings()) as session:
        persona = Persona(tenant_id=DEFAULT_TENANT_ID, name="bench growth",
                          platform="bench-growth", default_model=GROWTH_MODEL)
        session.add(persona)
        session.flush()
        return str(persona.id)


def compactions(lab: Lab, job_ids: list[str]) -> dict[str, Any]:
    """The jobs' compaction_end events, by strategy, and what they took the context from/to."""
    rows = query(lab.database_url,
                 "SELECT data->>'strategy', count(*), avg((data->>'tokens_before')::int),"
                 " avg((data->>'tokens_after')::int) FROM job_events"
                 " WHERE type = 'compaction_end' AND job_id = ANY(%s::uuid[])"
                 " GROUP BY 1", (job_ids,))
    jobs = max(1, len(job_ids))
    return {"per_job": round(sum(r[1] for r in rows) / jobs, 2),
            "by_strategy": {r[0]: {"count": r[1], "tokens_before_mean": round(r[2]),
                                   "tokens_after_mean": round(r[3])} for r in rows}}


def turn_gaps(lab: Lab, job_ids: list[str]) -> tuple[list[float], list[float]]:
    """Seconds from one model reply persisted to the next, within each job: one tool turn
    (dispatch, the tool, the join, the next step's context and model call), a compaction's
    summary call included when it came first. (every gap, the last LAST_TURNS of each job)"""
    rows = query(lab.database_url,
                 "SELECT job_id, extract(epoch from created_at) FROM token_logs"
                 " WHERE job_id = ANY(%s::uuid[]) AND iteration > 0"
                 " ORDER BY job_id, iteration", (job_ids,))
    every, last = [], []
    for _job_id, job_rows in itertools.groupby(rows, key=lambda row: row[0]):
        times = [float(t) for _, t in job_rows]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]  # each with the next
        every += gaps
        last += gaps[-LAST_TURNS:]
    return every, last


LAST_TURNS = 10


def _per_turn(ctx: Context, content: str, model_calls: int, jobs: int,
              history: int = 0, ok=None, persona_id: str | None = None) -> dict[str, Any]:
    per_turn, totals, failed, ids = [], [], 0, []
    ctx.lab.server.reset()
    tails = []
    for job in range(jobs):
        user, channel = uid("g-u"), uid("g-c")
        tail = seed_tail(job, jobs)
        tails.append(min(tail, history))
        seed_conversation(ctx.lab, user, channel, history, tail)
        row = ctx.one_job(content, user, channel, persona_id)
        ids.append(str(row["id"]))
        if not (ok or _ok)(row):
            failed += 1
            continue
        total = row["finished"] - row["submitted"]
        totals.append(total)
        per_turn.append(total / model_calls)
    model = ctx.lab.server.stats()
    every, last = turn_gaps(ctx.lab, ids)
    return {"jobs": jobs, "failed": failed, "model_calls_per_job": model_calls,
            "seeded_unsummarised": tails if history else [],
            "per_turn": summary(per_turn), "job_total": summary(totals),
            "per_turn_mean_ms": round(1000 * statistics.fmean(per_turn), 2)
            if per_turn else None,
            "turn_gap": summary(every), "turn_gap_last": summary(last),
            "messages_sent_per_model_call": model.get("messages_per_request_mean"),
            "tokens_sent_per_model_call": model.get("tokens_per_request_mean"),
            "tokens_sent_max": model.get("tokens_per_request_max"),
            "summary_calls_per_job": round(model.get("summary_calls", 0) / max(1, jobs), 2),
            "compactions": compactions(ctx.lab, ids)}


def scenario_growth(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    ctx.lab.server.set_latency(0)
    persona = growth_persona(ctx.lab)
    for _ in range(sizes.warmup_jobs):
        ctx.one_job(persona_id=persona)
    history = {str(h): _per_turn(ctx, ONE_TOOL_TURN, 2, sizes.growth_jobs, h,
                                 persona_id=persona)
               for h in sizes.growth_histories}
    # 200 tool turns meet AGENTQ_MAX_ITERATIONS (200): that job ends `max_iterations` after
    # its 200th model call, its last tool turn done
    turns = {str(t): _per_turn(ctx, f"Compute 6*7 {t} times with the calculator. turns={t}",
                               min(t + 1, MAX_ITERATIONS), sizes.growth_turn_jobs,
                               ok=_ok if t + 1 <= MAX_ITERATIONS else _ended_at_limit,
                               persona_id=persona)
             for t in sizes.growth_turns}
    h_lo, h_hi = str(sizes.growth_histories[0]), str(sizes.growth_histories[-1])
    t_lo, t_hi = str(sizes.growth_turns[0]), str(sizes.growth_turns[-1])
    h_ratio = ratio(history[h_hi]["per_turn"]["median_ms"], history[h_lo]["per_turn"]["median_ms"])
    t_ratio = ratio(turns[t_hi]["per_turn"]["median_ms"], turns[t_lo]["per_turn"]["median_ms"])
    gap_ratio = ratio(turns[t_hi]["turn_gap_last"]["median_ms"],
                      turns[t_lo]["turn_gap"]["median_ms"])
    return {"by_stored_messages": history, "by_tool_turns": turns,
            "turn_gap_ratio": gap_ratio,
            "turn_gap_ratio_of": f"the last {LAST_TURNS} turns of {t_hi}-turn jobs vs the "
                                 f"turn of {t_lo}-turn jobs",
            "turn_gap_rule": "one model reply persisted to the next (token_logs.created_at): "
                             "a tool turn's own cost, compaction included, without the job's "
                             "start and end that the job rule spreads over few turns",
            "turn_gap_met": (gap_ratio or 99) <= 1.5,
            "history_ratio": h_ratio, "history_ratio_of": f"{h_hi} vs {h_lo} stored",
            "turns_ratio": t_ratio, "turns_ratio_of": f"{t_hi} vs {t_lo} tool turns",
            "per_turn_rule": "job submit→completed divided by its model calls "
                             "(tool turns + 1; the compaction's summary calls are not "
                             "counted as turns, their time is in the job's), model "
                             "answering instantly",
            "context_window": f"{GROWTH_MODEL}: {GROWTH_WINDOW_TOKENS} tokens "
                              "(AGENTQ_MODEL_CONTEXT_WINDOWS), compaction threshold "
                              f"{ctx.lab.settings().compaction_threshold}",
            "planner_statistics": "ANALYZE messages after each seeding",
            "target": "per-turn at the largest history within 1.2x of the smallest; "
                      "at the most tool turns within 1.5x of the fewest",
            "met": (h_ratio or 99) <= 1.2, "turns_met": (t_ratio or 99) <= 1.5,
            "seeded_summary": "a conversation with more stored messages than its job's "
                              "tail is seeded with a summary of all but that tail, the "
                              f"jobs' tails spread evenly up to {SEED_UNSUMMARISED} "
                              "messages, the last past the compaction threshold (a long "
                              "conversation's steady state: seed_tail)"}


# --- 4b. memory recall: benchmarks/recall.py ----------------------------------------------

# --- 5. peers ----------------------------------------------------------------------------

PEER_SETUP = {
    "langgraph": "langgraph.prebuilt.create_react_agent + PostgresSaver (psycopg pool) + "
                 "ChatOpenAI, invoke in a thread pool (a thread per job in flight)",
    "langgraph-async": "the same graph with ainvoke on one event loop + AsyncPostgresSaver "
                       "(async psycopg pool) + ChatOpenAI's AsyncOpenAI client",
    "dbos": "a durable workflow per job, model and tool calls as steps "
            "(openai SDK, sync), enqueued on a DBOS queue (worker concurrency = the batch's, "
            "polled every 10 ms), system database on Postgres",
}
PEER_TIMEOUT_S = 1800


def run_peer(ctx: Context, kind: str, pool: int) -> dict[str, Any]:
    """One peer in its own process (benchmarks/peer.py), its own empty database, the lab's
    model server; its JSON, summarised."""
    import os
    lab, sizes = ctx.lab, ctx.sizes
    pg_url = lab.create_peer_database(kind)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.peer", "--kind", kind,
         "--base-url", lab.server.base_url, "--pg-url", pg_url, "--pool", str(pool),
         "--seq-jobs", str(sizes.peer_seq_jobs), "--burst-jobs", str(sizes.peer_burst_jobs),
         "--inflight-jobs", str(sizes.inflight_jobs),
         "--inflight-latency", str(sizes.inflight_latency_s),
         "--warmup", str(max(1, sizes.warmup_jobs)),
         "--db-pool", str(lab.settings().db_pool_size)],
        cwd=ROOT, capture_output=True, text=True, timeout=PEER_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"})
    lab.server.set_latency(0)  # whatever the peer left it at
    try:
        raw = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"the {kind} peer failed (exit {proc.returncode}): "
                         f"{proc.stderr[-1500:]}"}
    if "skipped" in raw:
        return {"skipped": raw["skipped"]}
    out: dict[str, Any] = {
        "setup": PEER_SETUP[kind], "pool": raw["pool"],
        "seq_latency": summary(raw["seq_latencies_s"]), "seq_failed": raw["seq_failed"],
        "burst_latency": summary(raw["burst_latencies_s"]),
        "burst_completed": raw["burst_completed"], "burst_failed": raw["burst_failed"],
        "jobs_per_s": round(raw["jobs_per_s"], 2) if raw["jobs_per_s"] else None,
        "cpu_ms_per_job": raw["cpu_ms_per_job"]}
    flight = raw.get("inflight")
    if flight:
        out["inflight"] = {**{k: v for k, v in flight.items() if k != "latencies_s"},
                           "latency": summary(flight["latencies_s"])}
    return out


def _agentq_inflight(ctx: Context) -> dict[str, Any] | None:
    """The in-flight scenario's agentq figures, when it ran in this invocation."""
    f = ctx.results.get("inflight")
    if not f or "error" in f:
        return None
    return {"jobs": f["jobs"], "completed": f["completed"], "failed": f["failed"],
            "jobs_per_s": f["jobs_per_s"],
            "ideal_jobs_per_s": round(f["jobs"] / (2 * f["model_latency_s"]), 2),
            "max_model_calls_waiting": f["max_model_calls_waiting"],
            "latency": f["latency"], "rss_mib": f["orchestrator_rss_mib"],
            "cpu_ms_per_job": f["cpu_ms_per_job"]}


def _best(values: list[float | None], highest: bool) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return max(present) if highest else min(present)


def scenario_peer(ctx: Context) -> dict[str, Any]:
    """Each peer (sizes.peers) in its own process, then agentq on the same jobs, one at a
    time and in a burst of the same size, with the CPU its processes used in the burst."""
    lab, sizes = ctx.lab, ctx.sizes
    lab.server.set_latency(0)
    pool = max(1, min(lab.settings().orchestrator_concurrency, sizes.peer_burst_jobs))
    peers = {kind: run_peer(ctx, kind, pool) for kind in sizes.peers}

    # agentq, the same jobs in the same run: one at a time, then a burst.
    lab.server.set_latency(0)
    seq = []
    for _ in range(sizes.peer_seq_jobs):
        row = ctx.one_job()
        if _ok(row):
            seq.append(row["finished"] - row["submitted"])
    ids: list[str] = []
    lock = threading.Lock()

    def submit(_i: int) -> None:
        job_id, _t0 = ctx.client.submit(ONE_TOOL_TURN)
        with lock:
            ids.append(job_id)

    meter = CpuMeter(ctx.pids()).start()
    start = time.time()
    with ThreadPoolExecutor(max_workers=min(32, sizes.peer_burst_jobs)) as executor:
        list(executor.map(submit, range(sizes.peer_burst_jobs)))
    rows = ctx.watcher.wait_all(ids, JOB_TIMEOUT_S + sizes.peer_burst_jobs)
    cpu = meter.stop()
    ends = [r["finished"] for r in rows if _ok(r)]
    elapsed = max(ends) - start if ends else 0.0
    n = sizes.peer_burst_jobs
    own = {k: v for k, v in cpu["cpu_s"].items() if k not in ("model_server", "bench_client")}
    agentq = {"seq_latency": summary(seq), "seq_failed": sizes.peer_seq_jobs - len(seq),
              "burst_latency": summary(e - start for e in ends),
              "burst_completed": len(ends), "burst_failed": len(rows) - len(ends),
              "jobs_per_s": round(len(ends) / elapsed, 2) if elapsed > 0 else None,
              "cpu_ms_per_job": round(1000 * sum(own.values()) / n, 2) if n else None,
              "cpu_ms_per_job_by_process": {k: round(1000 * v / n, 2) for k, v in own.items()},
              "inflight": _agentq_inflight(ctx)}
    ran = [p for p in peers.values() if "skipped" not in p and "error" not in p]
    best_rate = _best([p["jobs_per_s"] for p in ran], highest=True)
    best_median = _best([p["seq_latency"]["median_ms"] for p in ran], highest=False)
    best_flight = _best([(p.get("inflight") or {}).get("jobs_per_s") for p in ran],
                        highest=True)
    return {"pool": pool, "seq_jobs": sizes.peer_seq_jobs, "burst_jobs": n,
            "inflight_jobs": sizes.inflight_jobs,
            "inflight_latency_s": sizes.inflight_latency_s,
            "agentq": agentq, "peers": peers,
            "ratios_to_best_peer": {
                "seq_median": ratio(agentq["seq_latency"]["median_ms"], best_median),
                "burst_jobs_per_s": ratio(agentq["jobs_per_s"], best_rate),
                "inflight_jobs_per_s": ratio((agentq["inflight"] or {}).get("jobs_per_s"),
                                             best_flight)},
            "latency_rule": "seq: submit → durable end, one at a time; burst: end − burst "
                            "start; in flight: every job at once, model latency as in the "
                            "inflight scenario",
            "cpu_rule": "agentq: its processes (web, workers, beat) in the burst; a peer: its "
                        "one process (every thread) in the burst; Postgres not counted",
            "ahead_on_jobs_per_s": (bool(ran) and (agentq["jobs_per_s"] or 0)
                                    > (best_rate or 0)),
            "ahead_on_median_latency": (bool(ran) and (agentq["seq_latency"]["median_ms"]
                                                       or 1e9) < (best_median or 0))}


def scenario_batch(ctx: Context) -> dict[str, Any]:
    from benchmarks.batch import scenario_batch as run
    return run(ctx)


def scenario_modules(ctx: Context) -> dict[str, Any]:
    from benchmarks.modules import scenario_modules as run
    return run(ctx)


def scenario_fair(ctx: Context) -> dict[str, Any]:
    """agentq against the same-guarantee services and the library peers, on servers of its
    own (benchmarks/fair.py); the lab is not used."""
    from benchmarks import fair
    from benchmarks.observability import log
    return fair.run(ctx.sizes.fair, log, ctx.sizes.fair_systems or None)


def scenario_subagents(ctx: Context) -> dict[str, Any]:
    """A parent with ten children against ten top-level jobs, on servers of its own
    (benchmarks/subagents.py); the lab is not used."""
    from benchmarks import subagents
    from benchmarks.observability import log
    return subagents.run(ctx.sizes.subagents, log)


SCENARIOS = {"server": scenario_server, "overhead": scenario_overhead,
             "throughput": scenario_throughput, "inflight": scenario_inflight,
             "growth": scenario_growth, "recall": scenario_recall, "peer": scenario_peer,
             "batch": scenario_batch,
             "modules": scenario_modules, "subagents": scenario_subagents,
             "fair": scenario_fair}
STANDALONE = {"fair", "subagents"}
"""Scenarios that start their own servers: a run of only these starts no lab."""
