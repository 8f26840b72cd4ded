"""The Celery + LangGraph service: what a user builds instead of agentq with LangGraph.

A Flask front (run under gunicorn) takes `POST /jobs {"content": ...}`, enqueues a Celery task
on Redis and answers 202 `{"id": task id}`; `GET /jobs/<id>` answers `{"status": "pending" |
"completed" | "failed", "answer"}` from the Celery result backend (Redis). The task, in a
Celery worker (threads pool), runs LangGraph's `create_react_agent` with `PostgresSaver` at
`durability="sync"` (every checkpoint written before the next node: agentq's guarantee) on a
new thread per job (the task id), the same one tool (`math_evaluate`) and the same model
server. Configured by the environment:

    FAIR_PG_URL        the checkpointer's database (libpq URL)
    FAIR_REDIS_URL     the broker and result backend
    FAIR_DB_POOL       the checkpointer's pool size (default 10)
    OPENAI_BASE_URL    the model server

    gunicorn benchmarks.peers.celery_langgraph:app
    celery -A benchmarks.peers.celery_langgraph:celery_app worker --pool threads -Q fair_langgraph
"""
from __future__ import annotations

import os

from celery import Celery

from benchmarks.peers import job_front, once

QUEUE = "fair_langgraph"
REDIS_URL = os.environ.get("FAIR_REDIS_URL", "redis://127.0.0.1:6379/0")

celery_app = Celery("fair_langgraph", broker=REDIS_URL, backend=REDIS_URL)
celery_app.conf.update(task_default_queue=QUEUE, task_acks_late=True,
                       worker_prefetch_multiplier=1, result_expires=3600,
                       broker_connection_retry_on_startup=True)


@once
def agent():
    """The compiled graph, built once per worker process (its pool shared by the threads)."""
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.prebuilt import create_react_agent
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from benchmarks.peer import SYSTEM_PROMPT, math_tool
    pool = ConnectionPool(os.environ["FAIR_PG_URL"], min_size=1,
                          max_size=int(os.environ.get("FAIR_DB_POOL", "10")), open=True,
                          kwargs={"autocommit": True, "prepare_threshold": 0,
                                  "row_factory": dict_row})
    saver = PostgresSaver(pool)
    saver.setup()
    model = ChatOpenAI(model="gpt-4o-mini", base_url=os.environ["OPENAI_BASE_URL"],
                       api_key="sk-bench", max_retries=0, timeout=120)
    return create_react_agent(model, [math_tool()], checkpointer=saver, prompt=SYSTEM_PROMPT)


@celery_app.task(bind=True, name="fair.run_agent")
def run_agent(self, content: str) -> str | None:
    from benchmarks.peer import last_text
    out = agent().invoke({"messages": [("user", content)]},
                         config={"configurable": {"thread_id": self.request.id}},
                         durability="sync")
    return last_text(out)


def outcome(job_id: str) -> tuple[str, str | None]:
    result = celery_app.AsyncResult(job_id)
    state = result.state  # one read of the backend
    if state == "SUCCESS":
        return "completed", result.result
    if state in ("FAILURE", "REVOKED"):
        return "failed", None
    return "pending", None


app = job_front(__name__, lambda content: run_agent.delay(content).id, outcome)
