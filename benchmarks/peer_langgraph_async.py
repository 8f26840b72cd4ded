"""The async LangGraph peer: `create_react_agent` driven with `ainvoke` on one event loop,
`AsyncPostgresSaver` on an async psycopg pool, `ChatOpenAI` (its AsyncOpenAI client).

Every job is a coroutine; a batch is gathered under a semaphore of the batch's concurrency, so
the in-flight phase holds every job's model call open at once on a single thread.
See benchmarks/peer.py for the phases and what is measured.
"""
from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

from benchmarks.peer import CONTENT, EXPECTED, SYSTEM_PROMPT, Outcome, Peer, last_text, math_tool


class AsyncLangGraphPeer(Peer):
    kind = "langgraph-async"

    def __init__(self, base_url: str, pg_url: str, db_pool: int,
                 durability: str | None = None, **_kw: Any):
        self.invoke_kw = {"durability": durability} if durability else {}
        # One loop for the peer's life, in its own thread: the pool and the HTTP client are
        # bound to it.
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="langgraph-async-loop")
        self.thread.start()
        self._call(self._open(base_url, pg_url, db_pool))

    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _open(self, base_url: str, pg_url: str, db_pool: int) -> None:
        from langchain_openai import ChatOpenAI
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.prebuilt import create_react_agent
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        self.pool = AsyncConnectionPool(pg_url, min_size=1, max_size=db_pool, open=False,
                                        kwargs={"autocommit": True, "prepare_threshold": 0,
                                                "row_factory": dict_row})
        await self.pool.open()
        saver = AsyncPostgresSaver(self.pool)
        await saver.setup()
        model = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="sk-bench",
                           max_retries=0, timeout=120)
        self.agent = create_react_agent(model, [math_tool()], checkpointer=saver,
                                        prompt=SYSTEM_PROMPT)

    async def _one(self, gate: asyncio.Semaphore) -> Outcome:
        async with gate:
            config = {"configurable": {"thread_id": uuid.uuid4().hex}}
            try:
                out = await self.agent.ainvoke({"messages": [("user", CONTENT)]},
                                               config=config, **self.invoke_kw)
            except Exception:  # noqa: BLE001 - a failed job is counted, not fatal
                return False, time.time()
            return last_text(out) == EXPECTED, time.time()

    async def _batch(self, n: int, concurrency: int) -> list[Outcome]:
        gate = asyncio.Semaphore(max(1, concurrency))
        return list(await asyncio.gather(*(self._one(gate) for _ in range(n))))

    def run(self, n: int, concurrency: int) -> list[Outcome]:
        return self._call(self._batch(n, concurrency))

    def close(self) -> None:
        try:
            self._call(self.pool.close(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
