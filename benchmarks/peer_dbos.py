"""The DBOS Transact peer: a durable workflow per job, each model call and each tool call a
step, jobs enqueued on a DBOS queue, the system database on Postgres (its own database).

The agent loop is the plain one: the model (the real openai SDK, sync client) is offered
`math_evaluate`; each tool call it asks for runs as a step (agentq's safe parser) and its
result goes back as a `tool` message, until the model answers in text. Workflows run on
DBOS's executor threads; the queue's per-process concurrency is the batch's (agentq's
orchestrator pool in the burst, every job in the in-flight phase), and it is polled every
`poll_s` seconds (DBOS's default is 1 s; 10 ms here so a lone job is not kept waiting).

A job's end is its `workflow_status` row turning SUCCESS (`updated_at`), seen by a watcher
that polls the system database, so the polling interval does not count; the answer is then
read with `DBOS.retrieve_workflow(id).get_result()`. See benchmarks/peer.py for the phases.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dbos import DBOS

from benchmarks.peer import CONTENT, EXPECTED, SYSTEM_PROMPT, Outcome, Peer

QUEUE = "agent_jobs"
MAX_TURNS = 25
ENQUEUERS = 32
JOB_TIMEOUT_S = 600
TOOLS = [{"type": "function", "function": {
    "name": "math_evaluate",
    "description": "Evaluate an arithmetic expression and return its value.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]

_client = None  # the openai client, set by DBOSPeer before DBOS.launch()


@DBOS.step()
def call_model(messages: list[dict]) -> dict:
    reply = _client.chat.completions.create(model="gpt-4o-mini", messages=messages,
                                            tools=TOOLS)
    return reply.choices[0].message.model_dump(exclude_none=True)


@DBOS.step()
def call_tool(name: str, arguments: str) -> dict:
    from agentq.tools.safe_math import evaluate as safe_evaluate
    if name != "math_evaluate":
        return {"error": f"unknown tool {name}"}
    expression = json.loads(arguments or "{}").get("expression", "")
    return {"expression": expression, "result": safe_evaluate(expression)}


@DBOS.workflow()
def agent_job(content: str) -> str | None:
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": content}]
    for _ in range(MAX_TURNS):
        message = call_model(messages)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return message.get("content")
        for tool_call in calls:
            result = call_tool(tool_call["function"]["name"], tool_call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": tool_call["id"],
                             "content": json.dumps(result)})
    return None


class StatusWatcher(threading.Thread):
    """Polls dbos.workflow_status for the workflows it is given; records when each ended."""

    def __init__(self, pg_url: str, interval_s: float = 0.01):
        super().__init__(daemon=True, name="dbos-status-watcher")
        import psycopg
        self.conn = psycopg.connect(pg_url, autocommit=True)
        self.interval_s = interval_s
        self.pending: set[str] = set()
        self.ended: dict[str, tuple[str, float]] = {}
        self.cond = threading.Condition()
        self._halt = threading.Event()
        self.start()

    def watch(self, ids: list[str]) -> None:
        with self.cond:
            self.pending.update(i for i in ids if i not in self.ended)

    def wait_all(self, ids: list[str], timeout_s: float) -> dict[str, tuple[str, float]]:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while any(i not in self.ended for i in ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{sum(i not in self.ended for i in ids)} DBOS "
                                       f"workflows did not end within {timeout_s:g} s")
                self.cond.wait(min(left, 1.0))
            return {i: self.ended[i] for i in ids}

    def run(self) -> None:
        cur = self.conn.cursor()
        while not self._halt.wait(self.interval_s):
            with self.cond:
                ids = list(self.pending)
            if not ids:
                continue
            cur.execute("SELECT workflow_uuid, status, updated_at FROM dbos.workflow_status "
                        "WHERE workflow_uuid = ANY(%s) AND status NOT IN "
                        "('ENQUEUED', 'PENDING', 'DELAYED')", (ids,))
            rows = cur.fetchall()
            if rows:
                with self.cond:
                    for wid, status, updated_ms in rows:
                        self.ended[wid] = (status, updated_ms / 1000.0)
                        self.pending.discard(wid)
                    self.cond.notify_all()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)
        self.conn.close()


class DBOSPeer(Peer):
    kind = "dbos"

    def __init__(self, base_url: str, pg_url: str, db_pool: int, max_concurrency: int = 8,
                 poll_s: float = 0.01, **_kw: Any):
        global _client
        import openai
        _client = openai.OpenAI(base_url=base_url, api_key="sk-bench", max_retries=0,
                                timeout=120)
        DBOS(config={"name": "agentq-bench-peer", "system_database_url": pg_url,
                     "sys_db_pool_size": db_pool, "log_level": "WARNING",
                     "max_executor_threads": max_concurrency + 8})
        DBOS.launch()
        self.queue = DBOS.register_queue(QUEUE, worker_concurrency=1,
                                         polling_interval_sec=poll_s)
        self.concurrency = 1
        self.watcher = StatusWatcher(pg_url)

    def _enqueue(self, _i: int) -> str:
        return self.queue.enqueue(agent_job, CONTENT).workflow_id

    def run(self, n: int, concurrency: int) -> list[Outcome]:
        if concurrency != self.concurrency:
            self.queue.set_worker_concurrency(concurrency)
            self.concurrency = concurrency
        if n == 1:
            ids = [self._enqueue(0)]
        else:
            with ThreadPoolExecutor(max_workers=min(ENQUEUERS, n)) as executor:
                ids = list(executor.map(self._enqueue, range(n)))
        self.watcher.watch(ids)
        ended = self.watcher.wait_all(ids, JOB_TIMEOUT_S)
        outcomes = []
        for wid in ids:
            status, end = ended[wid]
            ok = status == "SUCCESS" and DBOS.retrieve_workflow(wid).get_result() == EXPECTED
            outcomes.append((ok, end))
        return outcomes

    def close(self) -> None:
        self.watcher.stop()
        DBOS.destroy(workflow_completion_timeout_sec=5)
