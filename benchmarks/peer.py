"""The peers: what a user might pick instead of agentq, each run as a library in its own
process against the same scripted model server, the same one-tool job and the same tool
(`math.evaluate`'s safe parser), printing one JSON object on its last line of stdout.

    python -m benchmarks.peer --kind KIND --base-url URL --pg-url URL --pool P \
        --seq-jobs N --burst-jobs M --inflight-jobs K --inflight-latency S

KIND is one of

    langgraph        LangGraph's prebuilt ReAct agent (`create_react_agent`), sync, with its
                     Postgres checkpointer (`PostgresSaver`, psycopg pool) and `ChatOpenAI`,
                     one thread per running job (benchmarks/peer.py)
    langgraph-async  the same graph driven with `ainvoke` on one event loop, with
                     `AsyncPostgresSaver` (async psycopg pool) and `ChatOpenAI` on the
                     AsyncOpenAI client (benchmarks/peer_langgraph_async.py)
    dbos             DBOS Transact: a durable workflow per job whose model calls and tool
                     call are steps (the real openai SDK), jobs enqueued on a DBOS queue,
                     its system database on Postgres (benchmarks/peer_dbos.py)

Phases, in order, each job the same one-tool-turn conversation (two model calls):

    warmup    a few jobs, not measured
    seq       N jobs one at a time: latency each (start → the job's durable end)
    burst     M jobs at once, at most P running (P = agentq's orchestrator pool): jobs/s =
              M / (last end − burst start); the process's CPU (all threads) per job
    inflight  the model server's latency set to S, K jobs at once with no cap: the most model
              calls waiting at once (the server's count), jobs/s against the ideal K / 2S,
              the peer process's peak RSS, CPU per job; the latency is set back to 0 after

A job's end: LangGraph's `invoke`/`ainvoke` returning (its last checkpoint is written before
it returns); DBOS's `workflow_status.updated_at` of the SUCCESS row (the output is durable).
A job counts only when it completed with the scripted final answer.

Needs `pip install '.[bench]'`; without a peer's packages it prints {"skipped": "..."}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MISSING_HINT = "pip install '.[bench]'"
SYSTEM_PROMPT = ("You are a helpful assistant. Use the tools offered when they help; "
                 "answer plainly when they do not.")
CONTENT = "What is 6*7? Use the calculator. turns=1"
EXPECTED = "The answer is 42."
KINDS = ("langgraph", "langgraph-async", "dbos")

Outcome = tuple[bool, float]
"""(completed with the expected answer, wall-clock end time)."""


# --- the peers' shared interface ---------------------------------------------------------

class Peer:
    """One peer: `run(n, concurrency)` runs n jobs, at most `concurrency` at once, and
    returns each job's outcome. `close()` releases what `__init__` opened."""

    kind = ""

    def run(self, n: int, concurrency: int) -> list[Outcome]:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        pass


def peer_available(kind: str = "langgraph") -> str | None:
    """None when the peer can run, else why not."""
    modules = {"langgraph": ("langchain_openai", "langgraph", "psycopg", "psycopg_pool",
                             "langgraph.checkpoint.postgres", "langgraph.prebuilt"),
               "langgraph-async": ("langchain_openai", "langgraph", "psycopg", "psycopg_pool",
                                   "langgraph.checkpoint.postgres.aio", "langgraph.prebuilt"),
               "dbos": ("dbos", "openai")}
    if kind not in modules:
        return f"unknown peer {kind!r}: choose from {', '.join(KINDS)}"
    import importlib
    for name in modules[kind]:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"{kind} peer skipped: {exc.name or exc} is not installed ({MISSING_HINT})"
    return None


def math_tool():
    """The tool every LangGraph peer offers: `math_evaluate`, agentq's safe parser."""
    from langchain_core.tools import tool

    from agentq.tools.safe_math import evaluate as safe_evaluate

    @tool
    def math_evaluate(expression: str) -> dict:
        """Evaluate an arithmetic expression and return its value."""
        return {"expression": expression, "result": safe_evaluate(expression)}

    return math_evaluate


def last_text(output: dict) -> str | None:
    last = output["messages"][-1]
    return getattr(last, "content", None)


# --- LangGraph, sync ---------------------------------------------------------------------

class LangGraphPeer(Peer):
    """`create_react_agent` + `PostgresSaver` + `ChatOpenAI`, `invoke` in a thread pool."""

    kind = "langgraph"

    def __init__(self, base_url: str, pg_url: str, db_pool: int,
                 durability: str | None = None, **_kw: Any):
        from langchain_openai import ChatOpenAI
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.prebuilt import create_react_agent
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        self.pool = ConnectionPool(pg_url, min_size=1, max_size=db_pool, open=True,
                                   kwargs={"autocommit": True, "prepare_threshold": 0,
                                           "row_factory": dict_row})
        saver = PostgresSaver(self.pool)
        saver.setup()
        model = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="sk-bench",
                           max_retries=0, timeout=120)
        self.agent = create_react_agent(model, [math_tool()], checkpointer=saver,
                                        prompt=SYSTEM_PROMPT)
        # LangGraph's checkpoint durability: None keeps its default ("async"); "sync" writes
        # every checkpoint before the next node runs (agentq's guarantee; benchmarks/fair.py)
        self.invoke_kw = {"durability": durability} if durability else {}

    def one(self) -> Outcome:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        try:
            out = self.agent.invoke({"messages": [("user", CONTENT)]}, config=config,
                                    **self.invoke_kw)
        except Exception:  # noqa: BLE001 - a failed job is counted, not fatal
            return False, time.time()
        return last_text(out) == EXPECTED, time.time()

    def run(self, n: int, concurrency: int) -> list[Outcome]:
        if concurrency <= 1:
            return [self.one() for _ in range(n)]
        with ThreadPoolExecutor(max_workers=min(concurrency, n)) as executor:
            return list(executor.map(lambda _i: self.one(), range(n)))

    def close(self) -> None:
        self.pool.close()


def make_peer(kind: str, **kw: Any) -> Peer:
    if kind == "langgraph":
        return LangGraphPeer(**kw)
    if kind == "langgraph-async":
        from benchmarks.peer_langgraph_async import AsyncLangGraphPeer
        return AsyncLangGraphPeer(**kw)
    if kind == "dbos":
        from benchmarks.peer_dbos import DBOSPeer
        return DBOSPeer(**kw)
    raise ValueError(f"unknown peer {kind!r}")


# --- measuring ---------------------------------------------------------------------------

def timed(peer: Peer, n: int, concurrency: int) -> dict[str, Any]:
    """Run a batch; its start, outcomes, elapsed, jobs/s and the process's CPU per job."""
    cpu0 = time.process_time()
    start = time.time()
    outcomes = peer.run(n, concurrency) if n else []
    cpu = time.process_time() - cpu0
    ok_ends = [end for ok, end in outcomes if ok]
    elapsed = (max(end for _ok, end in outcomes) - start) if outcomes else 0.0
    return {"start": start, "outcomes": outcomes, "completed": len(ok_ends),
            "failed": len(outcomes) - len(ok_ends), "elapsed_s": elapsed,
            "latencies_s": [end - start for end in ok_ends],
            "jobs_per_s": (len(ok_ends) / elapsed) if elapsed > 0 else None,
            "cpu_ms_per_job": round(1000 * cpu / n, 2) if n else None}


def measure(peer: Peer, args, control) -> dict[str, Any]:
    """The phases (module docstring); `control` is a harness.ModelServerClient, or None to
    skip the in-flight phase."""
    from benchmarks.harness import RssSampler  # not at import: harness sets AGENTQ_TEST_REDIS
    for _ in range(args.warmup):
        peer.run(1, 1)
    seq, seq_failed = [], 0
    for _ in range(args.seq_jobs):
        t0 = time.time()
        [(ok, end)] = peer.run(1, 1)
        if ok:
            seq.append(end - t0)
        else:
            seq_failed += 1
    workers = max(1, min(args.pool, args.burst_jobs))
    burst = timed(peer, args.burst_jobs, workers)
    out: dict[str, Any] = {
        "kind": peer.kind, "seq_jobs": args.seq_jobs, "seq_latencies_s": seq,
        "seq_failed": seq_failed, "burst_jobs": args.burst_jobs,
        "burst_latencies_s": burst["latencies_s"], "burst_completed": burst["completed"],
        "burst_failed": burst["failed"], "burst_elapsed_s": burst["elapsed_s"],
        "pool": workers, "jobs_per_s": burst["jobs_per_s"],
        "cpu_ms_per_job": burst["cpu_ms_per_job"]}
    if args.inflight_jobs and control is not None:
        n, latency = args.inflight_jobs, args.inflight_latency
        control.set_latency(latency)
        control.reset()
        rss = RssSampler(os.getpid())
        rss.start()
        try:
            run = timed(peer, n, n)
        finally:
            memory = rss.stop()
            stats = control.stats()
            control.set_latency(0)
        ideal = n / (2 * latency) if latency > 0 else None
        out["inflight"] = {
            "jobs": n, "model_latency_s": latency, "completed": run["completed"],
            "failed": run["failed"], "elapsed_s": round(run["elapsed_s"], 2),
            "jobs_per_s": round(run["jobs_per_s"], 2) if run["jobs_per_s"] else None,
            "ideal_jobs_per_s": round(ideal, 2) if ideal else None,
            "fraction_of_ideal": (round(run["jobs_per_s"] / ideal, 3)
                                  if ideal and run["jobs_per_s"] else None),
            "max_model_calls_waiting": stats.get("max_in_flight"),
            "model_calls": stats.get("calls"), "latencies_s": run["latencies_s"],
            "rss_mib": memory, "cpu_ms_per_job": run["cpu_ms_per_job"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer")
    parser.add_argument("--kind", choices=KINDS, default="langgraph")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--pg-url", required=True)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--db-pool", type=int, default=30)
    parser.add_argument("--seq-jobs", type=int, default=10)
    parser.add_argument("--burst-jobs", type=int, default=50)
    parser.add_argument("--inflight-jobs", type=int, default=0)
    parser.add_argument("--inflight-latency", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dbos-poll-s", type=float, default=0.01,
                        help="the DBOS queue's polling interval")
    args = parser.parse_args(argv)
    reason = peer_available(args.kind)
    if reason:
        print(json.dumps({"kind": args.kind, "skipped": reason}))
        return 0
    warnings.filterwarnings("ignore")
    from benchmarks.harness import ModelServerClient
    control = ModelServerClient(args.base_url) if args.inflight_jobs else None
    peer = make_peer(args.kind, base_url=args.base_url, pg_url=args.pg_url,
                     db_pool=args.db_pool, max_concurrency=max(args.pool, args.inflight_jobs),
                     poll_s=args.dbos_poll_s)
    try:
        result = measure(peer, args, control)
    finally:
        peer.close()
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # DBOS and the async pools may leave non-daemon threads behind: the result is printed.
    os._exit(code or 0)
