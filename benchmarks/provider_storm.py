"""A provider storm against the real stack: `python -m benchmarks.provider_storm [--jobs N]
[--rate R] [--storm-s S] [--failure-share F]`.

One-tool jobs (math.evaluate, then an answer) are submitted at R jobs/s; when 40% are in,
the scripted provider answers a share F of chat requests with 429 (with and without
Retry-After), 500 and a 15 s hang (past the 10 s call timeout) for S seconds, then
recovers. (The fault suite has the same storm with its other checks: `python -m benchmarks
faults --only provider_storm`, docs/faults.md.) Prints, as JSON: jobs completed and
failed, duplicates (token logs, tool calls run more than once, assistant messages per
turn), calls the provider received during the storm, jobs seen waiting, and the time from
the storm's end until the last job ended. agentq's own defaults apply (30-minute wait
window, 5..300 s delays, the circuit breaker), except a 20 s step deadline and a 10 s sweep
as in issue 11's runs.

Redis: AGENTQ_TEST_REDIS (its database is flushed); Postgres: a fresh database."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

import requests
from sqlalchemy import func, select

from agentq.models import Job, Message, TokenLog, ToolCall
from agentq.testing.scripted_llm import ScriptedLLM, error, hang, passes, react_responder
from tests.support.stack import Stack, create_database, drop_database, flush_redis

STORM_ENV = {"AGENTQ_MODEL": "gpt-4o-mini", "AGENTQ_GUEST_MONTHLY_TOKENS": "1000000000",
             "AGENTQ_STEP_DEADLINE_S": "20", "AGENTQ_SWEEP_INTERVAL_S": "10",
             "AGENTQ_LLM_TIMEOUT_S": "10", "AGENTQ_ORCHESTRATOR_CONCURRENCY": "200"}


def storm_replies(share: float) -> list:
    failures = [error(429, headers={"retry-after": "2"}), error(500), error(429),
                hang(15.0)]
    total = 20
    bad = round(share * total)
    return [failures[i % len(failures)] for i in range(bad)] + [passes()] * (total - bad)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.provider_storm")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--storm-s", type=float, default=30.0)
    parser.add_argument("--failure-share", type=float, default=0.8)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the stack, e.g. AGENTQ_PROVIDER_BREAKER_FAILURES=0")
    args = parser.parse_args(argv)
    env = {**STORM_ENV, **dict(item.split("=", 1) for item in args.env)}

    name = f"agentq_storm_{os.getpid()}"
    url = create_database(name)
    flush_redis()
    llm = ScriptedLLM(responder=react_responder()).start()
    stack = Stack(url, llm.base_url, Path(tempfile.mkdtemp(prefix="agentq-storm-")), env)
    try:
        stack.start()
        key = stack.create_key("storm", admin=True)
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {key}"
        storm_at = int(args.jobs * 0.4)
        marks: dict[str, float] = {}

        def storm() -> None:
            llm.storm(None, storm_replies(args.failure_share))
            marks["storm_start"] = time.monotonic()
            calls0 = llm.calls
            time.sleep(args.storm_s)
            llm.calm(None)
            marks["storm_end"] = time.monotonic()
            marks["calls_during_storm"] = llm.calls - calls0

        ids, storm_thread = [], threading.Thread(target=storm)
        sessions = stack.sessions()
        waiting_seen = [0]
        sampling = threading.Event()

        def sample() -> None:  # the most jobs waiting for the provider at once
            while not sampling.wait(0.5):
                with sessions() as s:
                    waiting_seen[0] = max(waiting_seen[0], s.execute(
                        select(func.count()).select_from(Job).where(
                            Job.waiting_for == "provider")).scalar_one())
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.monotonic()
        for i in range(args.jobs):
            if i == storm_at:
                storm_thread.start()
            delay = start + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = {"platform": "api", "platform_user_id": f"u{i}",
                    "platform_channel_id": f"c{uuid.uuid4().hex[:8]}",
                    "content": "What is 6*7?"}
            response = http.post(f"{stack.base}/v1/messages", json=body, timeout=60)
            response.raise_for_status()
            ids.append(uuid.UUID(response.json()["id"]))
        storm_thread.join()

        deadline = time.monotonic() + args.timeout_s
        while time.monotonic() < deadline:
            with sessions() as s:
                live = s.execute(select(func.count()).select_from(Job).where(
                    Job.id.in_(ids), Job.status.in_(("queued", "running")))).scalar_one()
            if not live:
                break
            time.sleep(0.5)
        drained = time.monotonic()
        sampling.set()
        sampler.join()
        with sessions() as s:
            by_status = dict(s.execute(select(Job.status, func.count()).where(
                Job.id.in_(ids)).group_by(Job.status)).all())
            codes = dict(s.execute(select(Job.error, func.count()).where(
                Job.id.in_(ids), Job.status == "failed").group_by(Job.error)).all())
            token_logs = s.execute(select(func.count()).select_from(TokenLog).where(
                TokenLog.job_id.in_(ids))).scalar_one()
            iterations = s.execute(select(func.sum(Job.iteration)).where(
                Job.id.in_(ids))).scalar_one()
            reruns = s.execute(select(func.count()).select_from(ToolCall).where(
                ToolCall.job_id.in_(ids), ToolCall.attempts > 1)).scalar_one()
            assistant_dupes = s.execute(
                select(func.count()).select_from(
                    select(Message.job_id).where(Message.job_id.in_(ids),
                                                 Message.role == "assistant")
                    .group_by(Message.job_id).having(func.count() > 1).subquery())
            ).scalar_one()
        print(json.dumps({
            "jobs": args.jobs, "rate_per_s": args.rate, "storm_s": args.storm_s,
            "failure_share": args.failure_share, "env": args.env, "by_status": by_status,
            "failed_errors": codes, "token_logs": token_logs, "model_calls_made": iterations,
            "tool_calls_run_more_than_once": reruns,
            "jobs_with_more_than_one_answer": assistant_dupes,
            "most_jobs_waiting_at_once": waiting_seen[0],
            "provider_calls_during_storm": marks.get("calls_during_storm"),
            "drain_after_storm_s": round(drained - marks["storm_end"], 1),
        }, indent=2))
    finally:
        stack.stop()
        llm.stop()
        drop_database(name)
        flush_redis()


if __name__ == "__main__":
    main()
