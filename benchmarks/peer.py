"""The peer: LangGraph's prebuilt ReAct agent with its Postgres checkpointer, used as a library
in a pool of worker threads, against the same scripted model server and the same tool
(`math.evaluate`'s safe parser). Runs in its own process and prints one JSON object.

    python -m benchmarks.peer --base-url URL --pg-url URL --pool P --seq-jobs N --burst-jobs M

`seq`: N jobs one at a time, latency each (invoke → final answer).
`burst`: M jobs handed at once to a pool of P threads; latency = end − burst start, and
jobs/s = M / (last end − burst start). Each job is its own thread (checkpoint thread_id).

Needs `pip install .[bench]` (langgraph, langgraph-checkpoint-postgres, langchain-openai,
psycopg[binary]); without them it prints {"skipped": "..."}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor

MISSING_HINT = "pip install '.[bench]'"
SYSTEM_PROMPT = ("You are a helpful assistant. Use the tools offered when they help; "
                 "answer plainly when they do not.")
CONTENT = "What is 6*7? Use the calculator. turns=1"
EXPECTED = "The answer is 42."


def peer_available() -> str | None:
    """None when the peer can run, else why not."""
    try:
        import langchain_openai  # noqa: F401
        import langgraph  # noqa: F401
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
        from langgraph.checkpoint.postgres import PostgresSaver  # noqa: F401
        from langgraph.prebuilt import create_react_agent  # noqa: F401
    except ImportError as exc:
        return f"LangGraph peer skipped: {exc.name or exc} is not installed ({MISSING_HINT})"
    return None


def build_agent(base_url: str, pg_url: str, pool_size: int):
    warnings.filterwarnings("ignore")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.prebuilt import create_react_agent
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from agentq.tools.safe_math import evaluate as safe_evaluate

    @tool
    def math_evaluate(expression: str) -> dict:
        """Evaluate an arithmetic expression and return its value."""
        return {"expression": expression, "result": safe_evaluate(expression)}

    pool = ConnectionPool(pg_url, min_size=1, max_size=pool_size, open=True,
                          kwargs={"autocommit": True, "prepare_threshold": 0,
                                  "row_factory": dict_row})
    saver = PostgresSaver(pool)
    saver.setup()
    model = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="sk-bench",
                       max_retries=0, timeout=120)
    agent = create_react_agent(model, [math_evaluate], checkpointer=saver,
                               prompt=SYSTEM_PROMPT)
    return agent, pool


def run_one(agent) -> tuple[bool, float]:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    out = agent.invoke({"messages": [("user", CONTENT)]}, config=config)
    last = out["messages"][-1]
    return (getattr(last, "content", None) == EXPECTED), time.time()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--pg-url", required=True)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--db-pool", type=int, default=30)
    parser.add_argument("--seq-jobs", type=int, default=10)
    parser.add_argument("--burst-jobs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    reason = peer_available()
    if reason:
        print(json.dumps({"skipped": reason}))
        return
    agent, pool = build_agent(args.base_url, args.pg_url, args.db_pool)
    try:
        for _ in range(args.warmup):
            run_one(agent)
        seq, seq_failed = [], 0
        for _ in range(args.seq_jobs):
            t0 = time.time()
            ok, end = run_one(agent)
            seq.append(end - t0)
            seq_failed += not ok
        workers = max(1, min(args.pool, args.burst_jobs))
        with ThreadPoolExecutor(max_workers=workers) as executor:
            start = time.time()
            results = list(executor.map(lambda _i: run_one(agent), range(args.burst_jobs)))
        ends = [end for _ok, end in results]
        burst_failed = sum(1 for ok, _ in results if not ok)
        elapsed = (max(ends) - start) if ends else 0.0
        print(json.dumps({
            "seq_latencies_s": seq, "seq_failed": seq_failed,
            "burst_latencies_s": [e - start for e in ends], "burst_failed": burst_failed,
            "burst_elapsed_s": elapsed, "pool": workers,
            "jobs_per_s": (len(ends) / elapsed) if elapsed > 0 else None}))
    finally:
        pool.close()


if __name__ == "__main__":
    sys.exit(main())
