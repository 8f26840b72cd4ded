"""The DBOS service: what a user builds instead of agentq with DBOS Transact.

A Flask front (run under gunicorn) takes `POST /jobs {"content": ...}` and enqueues the
`agent_job` workflow (benchmarks/peer_dbos.py: model and tool calls as steps) on a DBOS queue
through `DBOSClient` (one row in the system database), answering 202 `{"id": workflow id}`;
`GET /jobs/<id>` answers `{"status": "pending" | "completed" | "failed", "answer"}` from the
workflow's status. The queue's worker is a process of its own
(`python -m benchmarks.peers.dbos_service worker --concurrency P`): DBOS launched with the
queue registered (P at once, polled every 10 ms), running the workflows on its threads.
Configured by the environment:

    FAIR_PG_URL        DBOS's system database (libpq URL)
    FAIR_DB_POOL       its pool size (default 10)
    OPENAI_BASE_URL    the model server (the worker's)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.peers import job_front, once

APP_NAME = "agentq-bench-peer"
WORKFLOW = "agent_job"


@once
def client():
    from dbos import DBOSClient
    return DBOSClient(system_database_url=os.environ["FAIR_PG_URL"],
                      system_database_pool_size=int(os.environ.get("FAIR_DB_POOL", "10")))


def enqueue(content: str) -> str:
    from benchmarks.peer_dbos import QUEUE
    handle = client().enqueue({"queue_name": QUEUE, "workflow_name": WORKFLOW}, content)
    return handle.workflow_id


def outcome(job_id: str) -> tuple[str, str | None]:
    handle = client().retrieve_workflow(job_id)
    state = handle.get_status().status
    if state == "SUCCESS":
        return "completed", handle.get_result()
    if state in ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"):
        return "failed", None
    return "pending", None


app = job_front(__name__, enqueue, outcome)


def worker(concurrency: int, poll_s: float) -> None:
    """DBOS launched with the queue: runs the enqueued workflows until terminated."""
    import openai
    from dbos import DBOS

    from benchmarks import peer_dbos
    peer_dbos._client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"],
                                      api_key="sk-bench", max_retries=0, timeout=120)
    DBOS(config={"name": APP_NAME, "system_database_url": os.environ["FAIR_PG_URL"],
                 "sys_db_pool_size": int(os.environ.get("FAIR_DB_POOL", "10")),
                 "log_level": "WARNING", "max_executor_threads": concurrency + 8})
    DBOS.launch()
    DBOS.register_queue(peer_dbos.QUEUE, worker_concurrency=concurrency,
                        polling_interval_sec=poll_s)
    print("dbos worker ready.", flush=True)
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.dbos_service")
    parser.add_argument("command", choices=("worker",))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll-s", type=float, default=0.01)
    args = parser.parse_args(argv)
    worker(args.concurrency, args.poll_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
