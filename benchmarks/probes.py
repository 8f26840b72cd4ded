"""Probes: the small measurements behind the suggested changes, one process, no broker.

    python -m benchmarks probe

  statements   SQL statements and commits of one one-tool-turn job on the in-process floor
               (counted with SQLAlchemy engine events), grouped by kind; its round trips
               on the wire (every string psycopg2 sends: statements, PREPAREs, the BEGIN it
               sends before a transaction's first statement, COMMIT and ROLLBACK of an open
               transaction), its transactions, and the rows it inserted and updated
               (pg_stat_user_tables of the probe's own database)
  commit       a durable commit vs a commit that writes no WAL to fsync (temp table)
  sdk          LLMRouter.chat vs the same request posted through the SDK's low-level
               client.post (no typed-params transform), at 15 and 202 messages
  window       recent_messages on a 10,000-message conversation before and after ANALYZE,
               and with a seq bound (seq > message_seq - limit): the plan and its time

Needs Postgres and the model server (started here); not Redis or the stack.
"""
from __future__ import annotations

import collections
import json
import os
import statistics
import threading
import time
from typing import Any

from benchmarks.harness import ModelServer, plain_pg_url


def _median_ms(fn, n: int = 30) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 3)


class _FakeLab:
    """Just enough of a Lab for the floor and the seeding helper."""

    def __init__(self, database_url: str, server: ModelServer):
        self.database_url = database_url
        self.server = server
        from agentq.config import Settings
        self._settings = Settings.from_env({
            "AGENTQ_DATABASE_URL": database_url, "AGENTQ_HOME": "/tmp/agentq-probe",
            "AGENTQ_GUEST_MONTHLY_TOKENS": "1000000000", "AGENTQ_BROKER_URL": "memory://",
            "AGENTQ_TOOL_JOIN": "chord"})

    def settings(self):
        return self._settings


BACKGROUND_THREADS = ("agentq-cancel-watch", "agentq-LeaseKeeper")
"""A worker's threads that poll for all its jobs at once, each second or so
(`agentq.loop.cancel_watch`, `agentq.loop.leases`): what they send is a cost per second,
counted apart from the job's."""
ONE_TIME = ("SAVEPOINT agentq_prepare", "PREPARE", "DEALLOCATE")
"""What a pooled connection sends once per statement (`agentq.prepared`), counted apart."""


class _Wire:
    """What agentq's psycopg2 connections (agentq.prepared) send, one entry a round trip:
    each string executed (a statement, an EXECUTE, a PREPARE; statements sent ahead with the
    next count with it), each row of an executemany, the BEGIN psycopg2 sends before the
    first statement of a transaction, the COMMIT or ROLLBACK of an open one. The job's
    round trips are the entries sent by neither a background poller (`BACKGROUND_THREADS`)
    nor a connection preparing a statement (`ONE_TIME`)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.background = 0
        self.one_time = 0
        self._undo: list[Any] = []

    def __enter__(self) -> "_Wire":
        import psycopg2.extensions

        from agentq import prepared
        idle = psycopg2.extensions.TRANSACTION_STATUS_IDLE
        sent = self.sent

        wire = self

        def apart(text: str) -> bool:
            """Counted apart from the job's round trips (and said so)."""
            if threading.current_thread().name.startswith(BACKGROUND_THREADS):
                wire.background += 1
                return True
            if text.lstrip().startswith(ONE_TIME):
                wire.one_time += 1
                return True
            return False

        def opens(conn) -> None:
            if not conn.autocommit and conn.get_transaction_status() == idle \
                    and not apart("BEGIN"):
                sent.append("BEGIN")

        plain = prepared._PLAIN_EXECUTE

        def execute(cursor, query, vars=None):
            opens(cursor.connection)
            text = query if isinstance(query, str) else str(query)
            if not apart(text):
                sent.append(text.split(None, 1)[0].rstrip(";").upper() if text.strip()
                            else "?")
            return plain(cursor, query, vars)

        many = prepared.Cursor.executemany

        def executemany(cursor, query, vars_list):
            vars_list = list(vars_list)
            opens(cursor.connection)
            if not apart("EXECUTEMANY"):
                sent.extend(["EXECUTEMANY"] * len(vars_list))
            return many(cursor, query, vars_list)

        def ending(name: str, method):
            def end(conn) -> None:
                # (a folded transaction's end is a statement: counted as one)
                if not getattr(conn, "folded", False) and conn.get_transaction_status() != idle \
                        and not apart(name):
                    sent.append(name)
                return method(conn)
            return end

        commit, rollback = prepared.Connection.commit, prepared.Connection.rollback
        prepared._PLAIN_EXECUTE = execute
        prepared.Cursor.executemany = executemany  # type: ignore[method-assign]
        prepared.Connection.commit = ending("COMMIT", commit)  # type: ignore[method-assign]
        prepared.Connection.rollback = ending("ROLLBACK", rollback)  # type: ignore[method-assign]
        self._undo = [(prepared, "_PLAIN_EXECUTE", plain), (prepared.Cursor, "executemany", many),
                      (prepared.Connection, "commit", commit),
                      (prepared.Connection, "rollback", rollback)]
        return self

    def __exit__(self, *_exc) -> None:
        for owner, name, value in self._undo:
            setattr(owner, name, value)

    def counts(self) -> dict[str, Any]:
        kinds = collections.Counter(self.sent)
        return {"round_trips": len(self.sent), "transactions": kinds["BEGIN"],
                "wire": dict(kinds.most_common()), "background_round_trips": self.background,
                "one_time_round_trips": self.one_time}


_TUPLES = ("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
           "FROM pg_stat_user_tables")


def _table_counts(lab: _FakeLab) -> dict[str, tuple[int, ...]]:
    """Rows inserted, updated (HOT of them) and deleted per table of the probe's database,
    as its statistics say once every connection that wrote has ended (a backend reports
    its counts as it exits, a moment after its client closed it): read until two reads
    a quarter of a second apart agree."""
    from benchmarks.harness import query
    last: dict[str, tuple[int, ...]] | None = None
    for _ in range(40):
        now = {name: tuple(rest) for name, *rest in query(lab.database_url, _TUPLES)}
        if now == last:
            return now
        last = now
        time.sleep(0.25)
    return last or {}


def _rows_written(before: dict[str, tuple[int, ...]],
                  after: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    delta = {name: tuple(a - b for a, b in zip(after[name], before.get(name, (0,) * 4),
                                                   strict=True))
             for name in after}
    inserted = {name: d[0] for name, d in delta.items() if d[0]}
    updated = {name: d[1] for name, d in delta.items() if d[1]}
    return {"rows_inserted": sum(inserted.values()), "inserted_by_table": inserted,
            "rows_updated": sum(updated.values()), "updated_by_table": updated,
            "hot_updates": sum(d[2] for d in delta.values()),
            "row_versions": sum(d[0] + d[1] for d in delta.values())}


def probe_statements(lab: _FakeLab) -> dict[str, Any]:
    from sqlalchemy import event

    from agentq.db import engine_for
    from benchmarks.floor import Floor, new_ids
    floor = Floor(lab.settings(), lab.server.base_url)
    for _ in range(2):
        floor.run_job("warm up turns=1", *new_ids())
    engine = engine_for(lab.settings())
    seen: list[str] = []

    def statement(_conn, _cursor, text, *_args):
        words = text.split()
        verb = words[0].upper()
        table = ""
        for marker in ("FROM", "INTO", "UPDATE"):
            if marker in words:
                i = words.index(marker)
                if i + 1 < len(words):
                    table = words[i + 1].strip('"(')
                    break
        seen.append(f"{verb} {table}".strip())

    def commit(_conn):
        seen.append("COMMIT")

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "commit", commit)
    try:
        with _Wire() as wire:
            floor.run_job("What is 6*7? turns=1", *new_ids())
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "commit", commit)
    # the rows of one more such job: the statistics of a connection are complete once it
    # ended (a backend reports its counts when it exits)
    try:
        engine.dispose()
        before = _table_counts(lab)
        floor.run_job("What is 6*7? turns=1", *new_ids())
        engine.dispose()
        rows = _rows_written(before, _table_counts(lab))
    finally:
        floor.close()
    kinds = collections.Counter(s for s in seen if s != "COMMIT")
    return {"statements": sum(kinds.values()), "commits": seen.count("COMMIT"),
            **wire.counts(), **rows, "by_kind": dict(kinds.most_common()),
            "sequence": seen, "wire_sequence": list(wire.sent), **_floor_cost(lab)}


def _floor_cost(lab: _FakeLab, jobs: int = 15) -> dict[str, float]:
    """Median wall and CPU (this process: agentq's code, SQLAlchemy, the SDK) per floor job."""
    from benchmarks.floor import Floor, new_ids
    floor = Floor(lab.settings(), lab.server.base_url)
    walls, cpus = [], []
    try:
        for _ in range(jobs):
            w0, c0 = time.perf_counter(), time.process_time()
            floor.run_job("What is 6*7? turns=1", *new_ids())
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    finally:
        floor.close()
    return {"floor_job_wall_ms": round(statistics.median(walls) * 1000, 1),
            "floor_job_cpu_ms": round(statistics.median(cpus) * 1000, 1)}


def probe_commit(lab: _FakeLab) -> dict[str, Any]:
    import psycopg2
    conn = psycopg2.connect(plain_pg_url(lab.database_url))
    cur = conn.cursor()
    cur.execute("CREATE TEMP TABLE probe_temp (x int)")
    cur.execute("CREATE TABLE IF NOT EXISTS probe_durable (x int)")
    conn.commit()

    def write(table: str):
        def go():
            cur.execute(f"INSERT INTO {table} VALUES (1)")
            conn.commit()
        return go

    def roundtrip():
        cur.execute("SELECT 1")
        cur.fetchall()

    out = {"select_1_ms": _median_ms(roundtrip, 100),
           "durable_commit_ms": _median_ms(write("probe_durable"), 50),
           "no_fsync_commit_ms": _median_ms(write("probe_temp"), 50)}
    cur.execute("DROP TABLE probe_durable")
    conn.commit()
    conn.close()
    return out


def probe_sdk(lab: _FakeLab) -> dict[str, Any]:
    import httpx2  # the openai SDK's HTTP client

    from agentq.llm.router import LLMRouter
    from agentq.tools.registry import get_registry
    os.environ["OPENAI_BASE_URL"] = lab.server.base_url
    os.environ["OPENAI_API_KEY"] = "sk-probe"
    settings = lab.settings()
    router, registry = LLMRouter(settings), get_registry(settings)
    specs = registry.specs(registry.offered("guest", registry.allowed_modules(None)))
    tools = [{"type": "function", "function": {"name": s.name.replace(".", "-"),
                                               "description": s.description,
                                               "parameters": s.parameters}} for s in specs]
    out: dict[str, Any] = {"tools_offered": len(tools)}
    for n in (13, 200):
        messages = [{"role": "system", "content": "You are a helpful assistant."}] + [
            {"role": "user" if i % 2 == 0 else "assistant",
             "content": f"Earlier message number {i}: how many apples are left if I eat "
                        f"{i % 7} of {i % 13 + 10}?"} for i in range(n)] + [
            {"role": "user", "content": "What is 6*7? turns=1"}]
        body = {"model": "gpt-4o-mini", "messages": messages, "tools": tools}

        def raw(body=body):
            response = router._client().post("/chat/completions", body=body,
                                           cast_to=httpx2.Response,
                                           options={"timeout": 30})
            json.loads(response.read())

        out[f"{len(messages)}_messages"] = {
            "router_chat_ms": _median_ms(lambda messages=messages: router.chat(
                messages, specs, model="gpt-4o-mini"), 20),
            "client_post_ms": _median_ms(raw, 20)}
    router.close()
    return out


def probe_window(lab: _FakeLab) -> dict[str, Any]:
    import psycopg2

    import benchmarks.scenarios as scenarios
    from benchmarks.floor import new_ids
    from benchmarks.scenarios import seed_conversation
    user, channel = new_ids()
    analyze = scenarios.analyze_messages
    scenarios.analyze_messages = lambda _lab: None  # seed without fresh statistics
    try:
        seed_conversation(lab, user, channel, 10000)
    finally:
        scenarios.analyze_messages = analyze
    conn = psycopg2.connect(plain_pg_url(lab.database_url))
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("SELECT id, message_seq FROM conversations WHERE platform_channel_id = %s",
                (channel,))
    cid, last = cur.fetchone()
    plain = ("SELECT seq, role, content, token_count FROM messages WHERE conversation_id = %s "
             "ORDER BY seq DESC LIMIT 200")
    bounded = ("SELECT seq, role, content, token_count FROM messages WHERE conversation_id = %s "
               "AND seq > %s ORDER BY seq DESC LIMIT 200")

    def explain(sql: str, args) -> dict[str, Any]:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, args)
        plan = cur.fetchone()[0][0]
        node = plan["Plan"]
        kinds = []
        while node:
            kinds.append(node["Node Type"])
            node = (node.get("Plans") or [None])[0]
        return {"plan": " > ".join(kinds), "execution_ms": round(plan["Execution Time"], 3)}

    out = {"stale_statistics": explain(plain, (cid,)),
           "bounded_by_seq": explain(bounded, (cid, last - 200))}
    cur.execute("ANALYZE messages")
    out["after_analyze"] = explain(plain, (cid,))
    conn.close()
    return out


PROBES = {"statements": probe_statements, "commit": probe_commit, "sdk": probe_sdk,
          "window": probe_window}


def run_probes(names: list[str] | None = None) -> dict[str, Any]:
    from tests.support.stack import create_database, drop_database
    name = f"agentq_probe_{os.getpid()}"
    database_url = create_database(name)
    server = ModelServer()
    results: dict[str, Any] = {}
    try:
        lab = _FakeLab(database_url, server)
        for probe in names or list(PROBES):
            try:
                results[probe] = PROBES[probe](lab)
            except Exception as exc:  # noqa: BLE001 - reported
                results[probe] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        server.stop()
        drop_database(name)
    return results


def render(results: dict[str, Any]) -> str:
    lines = ["### Probes (`python -m benchmarks probe`)", ""]
    st = results.get("statements") or {}
    if "statements" in st:
        inserted = ", ".join(f"{k} {v}" for k, v in (st.get("inserted_by_table") or {}).items())
        lines.append(f"- One one-tool-turn job on the floor: **{st['statements']} SQL statements "
                     f"in {st['commits']} commits**, **{st.get('round_trips')} round trips** "
                     f"({st.get('transactions')} transactions), "
                     f"{st.get('rows_inserted')} rows inserted ({inserted}), "
                     f"{st.get('rows_updated')} updated; by kind: "
                     + ", ".join(f"{k} ×{v}" for k, v in st["by_kind"].items()) + ". "
                     f"Per floor job: {st.get('floor_job_wall_ms')} ms wall, "
                     f"{st.get('floor_job_cpu_ms')} ms of the client process's CPU.")
    cm = results.get("commit") or {}
    if "durable_commit_ms" in cm:
        lines.append(f"- Round trip `SELECT 1`: {cm['select_1_ms']} ms; durable commit: "
                     f"{cm['durable_commit_ms']} ms; commit with nothing to fsync: "
                     f"{cm['no_fsync_commit_ms']} ms.")
    sdk = results.get("sdk") or {}
    for key, value in sdk.items():
        if key.endswith("_messages"):
            lines.append(f"- Model call with {key.split('_')[0]} messages: `LLMRouter.chat` "
                         f"{value['router_chat_ms']} ms vs the SDK's `client.post` with a plain "
                         f"body {value['client_post_ms']} ms (instant server).")
    win = results.get("window") or {}
    if "stale_statistics" in win:
        for key in ("stale_statistics", "after_analyze", "bounded_by_seq"):
            lines.append(f"- Window of 200 from 10,000 messages, {key.replace('_', ' ')}: "
                         f"{win[key]['plan']}, {win[key]['execution_ms']} ms.")
    return "\n".join(lines) + "\n"
