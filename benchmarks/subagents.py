"""Sub-agents against top-level jobs (issue 36's benchmark row): a parent with N children
(ten in the full and quick runs), time and CPU per child, against N top-level jobs doing the
same work.

    python -m benchmarks run --only subagents [--quick | --quick --smoke]

On servers of its own, as the fair comparison (benchmarks/fair.py: a private Postgres
cluster with pg_stat_statements and a private Redis, the scripted model server, agentq's
gunicorn web, orchestrator and tools processes, `AGENTQ_DEFAULT_MODULES=agents,math`), each
round runs both kinds, the order alternating round by round:

    parent     one job whose model delegates N children in its first reply (N
               `agents.delegate` calls in one turn, each handing over DELEGATED_TASK); each
               child a one-tool-turn job (two model calls and `math.evaluate`) in a
               conversation of its own; once the last child ends, the parent's answer (its
               own two model calls)
    top_level  the same N one-tool-turn jobs submitted at once by N client threads, the same
               user, a conversation each

Every submit is `POST /v1/messages?wait=60` (the job object once the job ends; the parent's
client waits for the parent only, whose end comes after its last child's). Per round and kind:
the wall time (the last job's `finished_at` − just before the first submit), the machine CPU
(the stack's processes with their children + the Postgres cluster + Redis, user + system:
`fair.Meter`; the model server and this process reported apart), the Postgres round trips
(pg_stat_statements calls) and the model calls (the model server's count). The figures are
medians over the rounds, per child, and the ratios parent / top-level.
"""
from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Callable

from benchmarks import fair
from benchmarks.harness import TERMINAL, Client, ratio, uid
from benchmarks.llm_server import DELEGATED_TASK, FINAL_TEXT

MODULES = "agents,math"
WAIT_S = 60
CPU_PARTS = ("machine", "system", "postgres", "redis", "model_server", "load_generator")


@dataclass
class SubagentSizes:
    children: int = 10
    rounds: int = 10
    warmup: int = 1
    """Unmeasured rounds of each kind first."""


SIZES = {"full": SubagentSizes(),
         "quick": SubagentSizes(rounds=4),
         "smoke": SubagentSizes(children=2, rounds=1)}


class Agentq(Client):
    """The stack's HTTP API, one keep-alive session per thread (harness.Client); `clients`
    threads kept across rounds (so their sessions are too)."""

    def __init__(self, base: str, key: str, clients: int):
        super().__init__(base, key)
        self.clients = ThreadPoolExecutor(max_workers=clients)

    def run(self, content: str, user: str) -> dict[str, Any]:
        """Submit a job in a new conversation of `user` and hold until it ends: its object."""
        r = self._http().post(f"{self.base}/v1/messages?wait={WAIT_S}", timeout=WAIT_S + 30,
                             json={"platform": "api", "platform_user_id": user,
                                   "platform_channel_id": uid("c"), "content": content})
        if r.status_code not in (200, 202):
            raise RuntimeError(f"submit answered {r.status_code}: {r.text[:300]}")
        job = r.json()
        deadline = time.monotonic() + fair.JOB_TIMEOUT_S
        while job["status"] not in TERMINAL and time.monotonic() < deadline:
            job = self.job(job["id"], wait=True)
        return job

    def job(self, job_id: str, wait: bool = False) -> dict[str, Any]:
        r = self._http().get(f"{self.base}/v1/jobs/{job_id}",
                            params={"wait": WAIT_S} if wait else None, timeout=WAIT_S + 30)
        r.raise_for_status()
        return r.json()


def _ok(job: dict[str, Any]) -> bool:
    return (job.get("status") == "completed" and job.get("finish_reason") == "end_turn"
            and (job.get("response") or {}).get("content") == FINAL_TEXT)


def _ended_at(job: dict[str, Any]) -> float:
    return datetime.fromisoformat(job["finished_at"]).timestamp()


def one_round(api: Agentq, kind: str, n: int, measure: Callable[[], Any],
              settle: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """One kind's jobs: `measure()` just before the first submit, `settle(it)` once every
    job has ended (their figures); then whether every job did its work."""
    user = uid("sub-u")
    mark = measure()
    start = time.time()
    if kind == "parent":
        jobs = [api.run(f"Split this up among sub-agents. delegate={n}", user)]
    else:
        jobs = list(api.clients.map(lambda _i: api.run(DELEGATED_TASK, user), range(n)))
    figures = settle(mark)
    ended = [_ended_at(j) for j in jobs if j.get("finished_at")]
    wall = (max(ended) - start) if ended else None
    failed = sum(not _ok(j) for j in jobs)
    if kind == "parent":  # read after the measurement: the children, each its own job
        children = [api.job(child) for child in jobs[0].get("children") or ()]
        failed += sum(not _ok(c) for c in children) + max(0, n - len(children))
    return {"kind": kind, "wall_s": round(wall, 3) if wall is not None else None,
            "failed": failed, **figures}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def _kind_summary(rounds: list[dict[str, Any]], n: int) -> dict[str, Any]:
    return {"rounds": len(rounds), "failed": sum(r["failed"] for r in rounds),
            "wall_ms": _median([1000 * r["wall_s"] for r in rounds if r["wall_s"]]),
            "wall_ms_per_child": _median([1000 * r["wall_s"] / n for r in rounds
                                          if r["wall_s"]]),
            "cpu_ms_per_child": {part: _median([r["cpu_ms_per_child"][part] for r in rounds])
                                 for part in CPU_PARTS},
            "round_trips_per_child": _median([r["round_trips_per_child"] for r in rounds]),
            "model_calls": _median([r["model_calls"] for r in rounds])}


def run(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    sizes, n = SIZES[mode], SIZES[mode].children
    servers = fair.Run(fair.FairSizes(), log)  # its pool (16) and database pool (20)
    log(f"subagents: private Postgres and Redis, logs in {servers.scratch}")
    procs = fair.Procs(servers.scratch / "agentq")
    procs.scratch.mkdir(parents=True, exist_ok=True)
    db = "subagents_agentq"
    api = None
    try:
        servers.start()
        stack, key = servers.agentq_stack(procs, db, MODULES)
        api = Agentq(stack.base, key, n)
        pids = {**{f"system:{name}": pid for name, pid in procs.pids().items()},
                "postgres": servers.pg.proc.pid, "redis": servers.redis.proc.pid,
                "model_server": servers.model.pid}

        def measure():
            servers.model.reset()
            return fair.round_trips(servers.pg, db), fair.Meter(pids).start()

        def settle(mark) -> dict[str, Any]:
            calls0, meter = mark
            cpu = meter.stop()
            trips = fair.round_trips(servers.pg, db) - calls0
            system = sum(v for k, v in cpu.items() if k.startswith("system:"))
            seconds = {"machine": system + cpu["postgres"] + cpu["redis"], "system": system,
                       **{k: cpu[k] for k in ("postgres", "redis", "model_server",
                                              "load_generator")}}
            return {"cpu_s": cpu,
                    "cpu_ms_per_child": {k: round(1000 * v / n, 2) for k, v in seconds.items()},
                    "round_trips_per_child": round(trips / n, 1),
                    "model_calls": servers.model.stats().get("calls")}

        for _ in range(sizes.warmup):
            for kind in ("parent", "top_level"):
                one_round(api, kind, n, measure, settle)
        rounds = []
        for i in range(sizes.rounds):
            order = ("parent", "top_level") if i % 2 == 0 else ("top_level", "parent")
            for kind in order:
                rounds.append(one_round(api, kind, n, measure, settle))
                log(f"subagents: round {i + 1} {kind}: {rounds[-1]['wall_s']} s, "
                    f"{rounds[-1]['cpu_ms_per_child']['machine']} ms CPU per child")
    except BaseException:
        servers.keep_logs = True  # the stack's logs say why
        raise
    finally:
        if api is not None:
            api.clients.shutdown()
        procs.stop()
        servers.stop()
    parent = _kind_summary([r for r in rounds if r["kind"] == "parent"], n)
    top = _kind_summary([r for r in rounds if r["kind"] == "top_level"], n)
    return {"sizes": asdict(sizes), "children": n, "modules": MODULES,
            "pool": fair.FairSizes().pool, "parent": parent, "top_level": top,
            "ratios": {"wall": ratio(parent["wall_ms"], top["wall_ms"]),
                       "machine_cpu": ratio(parent["cpu_ms_per_child"]["machine"],
                                             top["cpu_ms_per_child"]["machine"]),
                       "round_trips": ratio(parent["round_trips_per_child"],
                                             top["round_trips_per_child"])},
            "rounds_detail": rounds,
            "rule": "per round: wall = the last job's finished_at − just before the first "
                    "submit; machine CPU = the stack's processes + Postgres + Redis (user + "
                    "system), the model server and the client apart; per child = / N; "
                    "medians over the rounds, the order of the kinds alternating"}
