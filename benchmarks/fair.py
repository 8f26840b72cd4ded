"""The fair comparison (issue 34): agentq against the services a user would build instead, with
the same guarantees, and against the library peers, in one run against the same model server.

    python -m benchmarks run --only fair [--quick | --quick --smoke]

Everything runs on servers of its own, so nobody else's load is counted: a private Postgres
cluster (`shared_preload_libraries=pg_stat_statements`, the extension created) and a private
Redis, on loopback ports; one database per system. The systems, one after another:

    agentq            the Procfile's processes (gunicorn API, orchestrator and tools workers),
                      offered only the `math` module (AGENTQ_DEFAULT_MODULES=math: one tool,
                      as the peers); its call goes by chord to the tools worker, the default
    agentq-local      the same, `math` a local module (AGENTQ_LOCAL_MODULES=math): its call
                      runs in the orchestrator's step and the next model call follows in the
                      same task; no tools worker runs. Its own row, beside agentq's: the
                      headline ratios are the chord's
    celery-langgraph  a Flask front (gunicorn) enqueuing a Celery task (Redis broker and
                      result backend) that runs LangGraph's ReAct agent with `PostgresSaver` at
                      `durability="sync"` (benchmarks/peers/celery_langgraph.py)
    dbos-service      a Flask front (gunicorn) enqueuing to a DBOS queue through `DBOSClient`;
                      the queue's worker a DBOS process of its own
                      (benchmarks/peers/dbos_service.py)
  and as libraries (the second table), each in a process of its own driven phase by phase
  (benchmarks/peers/library.py):
    langgraph-sync    `invoke` in a thread pool, `durability="sync"`
    langgraph-async   `ainvoke` on one event loop, `durability="sync"`
    langgraph-default `invoke`, LangGraph's default `durability="async"` (for reference)
    dbos              DBOS in-process, its queue polled every 10 ms

Each system runs the same phases with the same sizes: a warm-up (not measured), a burst (N jobs
submitted at once; the services run at most P at once, P = the jobs' pool, the libraries run
them P at a time) and a closed loop (the same M jobs by C clients, each submitting one job and
waiting for its end before the next). A job is the same one-tool-turn conversation (two model
calls, one `math_evaluate`), on a new conversation each (agentq: a new user and channel; the
peers: a new thread id / workflow). The HTTP clients (agentq, the two services) poll the job
over HTTP every POLL_S seconds until it ends (agentq: `GET /v1/jobs/{id}`), as a client does.

Per phase and system:
- machine CPU per job: the system's processes (with their children) plus the private
  Postgres's (the postmaster and every backend, exited ones included) and Redis's, user +
  system, sampled before and after (psutil); the load generator (this process) and the model
  server are reported apart and not counted;
- jobs/s (N / (last end − start)) and the latency of the closed loop's jobs;
- per job, from the system's own database: statements and round trips (pg_stat_statements'
  calls; round trips = statements + BEGIN/COMMIT/ROLLBACK), transactions (pg_stat_database
  xact_commit + xact_rollback), rows inserted / updated and row versions (tup_inserted +
  tup_updated, the sum over the database's tables of pg_stat_user_tables' n_tup_ins and
  n_tup_upd), and WAL bytes (`pg_current_wal_lsn()` delta: the cluster's, so the systems run
  one at a time), and Redis commands (the private Redis's `total_commands_processed`: a
  broker's round trips). Counts do not depend on the machine's load; times do. A system that polls
  Postgres while idle (DBOS's queue, every 10 ms) sends round trips in proportion to the run's
  length, not its jobs: each system's idle round trips per second (measured while its counters
  settle after the warm-up) are given beside the counts.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import requests

from benchmarks.peer import CONTENT, EXPECTED
from tests.support.services import PG_BIN, PrivateRedis, SuitePostgres
from tests.support.stack import ROOT, Stack, StackError, die_with_parent, free_port

POLL_S = 0.02
"""How often an HTTP client asks whether its job has ended (the same for every service)."""
JOB_TIMEOUT_S = 300
SERVICES = ("agentq", "celery-langgraph", "dbos-service")
VARIANTS = ("agentq-local",)
"""agentq configured otherwise: a service, shown beside agentq, never a peer of it."""
LIBRARIES = {"langgraph-sync": ("langgraph", "sync"),
             "langgraph-async": ("langgraph-async", "sync"),
             "langgraph-default": ("langgraph", None),
             "dbos": ("dbos", None)}
WEB_WORKERS, WEB_THREADS = 2, 8
"""Every Flask front's gunicorn sizing: agentq's bench stack's (benchmarks/harness.py)."""
TX_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "START TRANSACTION", "END")


@dataclass
class FairSizes:
    warmup: int = 3
    burst_jobs: int = 200
    closed_jobs: int = 200
    clients: int = 8
    pool: int = 16
    """At most this many jobs run at once in each service's workers (agentq's orchestrator
    is given the same: AGENTQ_ORCHESTRATOR_CONCURRENCY) and in a library's burst."""
    db_pool: int = 20


SIZES = {"full": FairSizes(),
         "quick": FairSizes(warmup=2, burst_jobs=40, closed_jobs=40, clients=4, pool=8),
         "smoke": FairSizes(warmup=1, burst_jobs=3, closed_jobs=4, clients=2, pool=2,
                            db_pool=4)}


# --- servers of its own -------------------------------------------------------------------

class StatsPostgres(SuitePostgres):
    """The suite's private cluster (tests/support/services.py), its postgresql.conf given
    SETTINGS: pg_stat_statements preloaded, and commits that do not wait for the WAL flush
    (as PrivatePostgres's; the command line's settings win over the file's)."""

    MAX_CONNECTIONS = 400
    SETTINGS = {"synchronous_commit": "off",
                "shared_preload_libraries": "pg_stat_statements",
                "pg_stat_statements.track_utility": "on",
                "pg_stat_statements.max": "10000"}

    def start(self) -> "StatsPostgres":
        if not self.data.exists() and (PG_BIN / "initdb").exists():  # else start() says so
            self._init_data()
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.writelines(f"{name} = '{value}'\n" for name, value in self.SETTINGS.items())
        super().start()
        deadline = time.monotonic() + 30
        while True:  # the port answers before the server takes connections
            try:
                self.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                return self
            except Exception:  # noqa: BLE001 - starting up
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def sql(self, statement: str, params: tuple = (), db: str = "postgres") -> list[tuple]:
        from benchmarks.harness import query
        return query(self.url(db), statement, params)

    def empty_database(self, name: str) -> str:
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)


# --- CPU ----------------------------------------------------------------------------------

def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants, the exited children they
    reaped included (a postmaster's ended backends, a gunicorn's replaced workers)."""
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


class Meter:
    """CPU of named process trees between start() and stop()."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids

    def start(self) -> "Meter":
        self.before = {n: tree_cpu_s(p) for n, p in self.pids.items()}
        self.self0 = time.process_time()
        return self

    def stop(self) -> dict[str, float]:
        out = {n: round(tree_cpu_s(p) - self.before[n], 3) for n, p in self.pids.items()}
        out["load_generator"] = round(time.process_time() - self.self0, 3)
        return out


# --- database counts ------------------------------------------------------------------------

STATS_SETTLE_S = 11.0
"""An idle backend (a pooled connection) flushes its table and transaction counters up to 10 s
after its last transaction (PGSTAT_IDLE_INTERVAL): wait this long before reading them.
pg_stat_statements' counts are immediate."""


def db_snapshot(pg: StatsPostgres, db: str) -> dict[str, float]:
    """The database's cumulative counters (see the module docstring)."""
    [(oid,)] = pg.sql("SELECT oid FROM pg_database WHERE datname = %s", (db,))
    rows = pg.sql("SELECT upper(split_part(ltrim(query), ' ', 1)), sum(calls) "
                  "FROM pg_stat_statements WHERE dbid = %s GROUP BY 1", (oid,))
    control = sum(float(c) for verb, c in rows if verb.rstrip(";") in TX_CONTROL)
    total = sum(float(c) for _verb, c in rows)
    [(commits, rollbacks, inserted, updated, deleted)] = pg.sql(
        "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted "
        "FROM pg_stat_database WHERE datname = %s", (db,))
    [(lsn,)] = pg.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
    return {"statements": total - control, "round_trips": total,
            "transactions": float(commits + rollbacks), "rows_inserted": float(inserted),
            "rows_updated": float(updated), "rows_deleted": float(deleted),
            "wal_bytes": float(lsn)}


def round_trips(pg: StatsPostgres, db: str) -> float:
    """pg_stat_statements' calls in the database so far (immediate, unlike the table counts)."""
    [(calls,)] = pg.sql("SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s "
                        "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s", (db,))
    return float(calls)


def per_job(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    """The counters' growth per job; row versions = rows inserted + rows updated."""
    out = {k: round((after[k] - before[k]) / jobs, 1) for k in before}
    out["row_versions"] = round(out["rows_inserted"] + out["rows_updated"], 1)
    return out


# --- drivers: how each system is given jobs ---------------------------------------------------

class HttpDriver:
    """A service reached over HTTP: `submit()` → job id, `ended(id)` → None while running,
    else (ok, end time seen)."""

    def __init__(self, submit: Callable[[requests.Session], str],
                 ended: Callable[[requests.Session, str], bool | None]):
        self._submit, self._ended = submit, ended
        self._local = threading.local()

    def http(self) -> requests.Session:
        if getattr(self._local, "http", None) is None:
            self._local.http = requests.Session()
        return self._local.http

    def wait(self, job_id: str) -> tuple[bool, float]:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            ok = self._ended(self.http(), job_id)
            if ok is not None:
                return ok, time.time()
            time.sleep(POLL_S)
        return False, time.time()

    def run(self, n: int, clients: int, burst: bool) -> tuple[float, list[tuple[bool, float]]]:
        """Burst: every job submitted at once (by `clients` threads), then each thread waits
        for its own; closed loop: each client submits one job and waits for it, n in all."""
        start = time.time()
        share = [list(range(i, n, clients)) for i in range(clients)]

        def client(mine: list[int]) -> list[tuple[bool, float]]:
            if burst:
                ids = [self._submit(self.http()) for _ in mine]
                return [self.wait(job_id) for job_id in ids]
            return [self.wait(self._submit(self.http())) for _ in mine]

        with ThreadPoolExecutor(max_workers=clients) as pool:
            outcomes = [o for part in pool.map(client, share) for o in part]
        return start, outcomes


def agentq_driver(base: str, key: str) -> HttpDriver:
    from benchmarks.harness import uid

    def submit(http: requests.Session) -> str:
        r = http.post(f"{base}/v1/messages", headers={"Authorization": f"Bearer {key}"},
                      json={"platform": "api", "platform_user_id": uid("u"),
                            "platform_channel_id": uid("c"), "content": CONTENT}, timeout=60)
        if r.status_code != 202:
            raise RuntimeError(f"agentq answered {r.status_code}: {r.text[:300]}")
        return r.json()["id"]

    def ended(http: requests.Session, job_id: str) -> bool | None:
        r = http.get(f"{base}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"},
                     timeout=60)
        job = r.json()
        if job.get("status") not in ("completed", "failed", "cancelled"):
            return None
        return job["status"] == "completed" and job.get("finish_reason") == "end_turn"

    return HttpDriver(submit, ended)


def service_driver(base: str) -> HttpDriver:
    def submit(http: requests.Session) -> str:
        r = http.post(f"{base}/jobs", json={"content": CONTENT}, timeout=60)
        if r.status_code != 202:
            raise RuntimeError(f"{base} answered {r.status_code}: {r.text[:300]}")
        return r.json()["id"]

    def ended(http: requests.Session, job_id: str) -> bool | None:
        job = http.get(f"{base}/jobs/{job_id}", timeout=60).json()
        if job["status"] == "pending":
            return None
        return job["status"] == "completed" and job.get("answer") == EXPECTED

    return HttpDriver(submit, ended)


class LibraryDriver:
    """benchmarks/peers/library.py in a process of its own, a phase per stdin line."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def run(self, n: int, concurrency: int, burst: bool) -> tuple[float, list]:
        self.proc.stdin.write(f"{n} {concurrency}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise StackError("the library peer exited")
        data = json.loads(line)
        return data["start"], [tuple(o) for o in data["outcomes"]]


# --- one system ------------------------------------------------------------------------------

class Procs:
    """Processes started for one system, stopped (their process groups) at the end."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.procs: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str, cmd: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
        # the peers run from their scratch directory: gunicorn reads ./gunicorn.conf.py,
        # and the repository's is agentq's (gevent workers)
        with (self.scratch / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                cmd, cwd=self.scratch, env=env, stdout=kw.pop("stdout", log), stderr=log,
                start_new_session=True, preexec_fn=die_with_parent, **kw)
        return self.procs[name]

    def log(self, name: str) -> str:
        path = self.scratch / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_log(self, name: str, text: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log(name):
            if self.procs[name].poll() is not None:
                raise StackError(f"{name} exited: {self.log(name)[-2000:]}")
            if time.monotonic() > deadline:
                raise StackError(f"{name} not ready: {self.log(name)[-2000:]}")
            time.sleep(0.2)

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items()}

    stop = Stack.stop
    """The agentq stack's own stop (it reads only `procs`): each process group SIGTERM, then
    SIGKILL after 15 s."""


def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise StackError(f"{url} did not answer")


def gunicorn(app: str, port: int) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers",
            str(WEB_WORKERS), "--threads", str(WEB_THREADS), "--backlog", "4096", app]


class Run:
    """One fair run: the private servers, the model server, and each system in turn."""

    def __init__(self, sizes: FairSizes, log: Callable[[str], None]):
        self.sizes, self.log = sizes, log
        self.scratch = Path(tempfile.mkdtemp(prefix="agentq-fair-"))
        self.pg = StatsPostgres(self.scratch)
        self.redis = PrivateRedis(self.scratch)
        self.model = None
        self.last_snapshot: dict[str, float] | None = None
        self.idle_round_trips_per_s: float | None = None
        self.idle_redis_commands_per_s: float | None = None
        self.keep_logs = False

    def start(self) -> "Run":
        from benchmarks.harness import ModelServer
        self.pg.start()
        self.redis.start()
        self.model = ModelServer()
        return self

    def stop(self) -> None:
        if self.model is not None:
            self.model.stop()
        self.redis.stop()
        self.pg.stop()
        if self.keep_logs:
            self.log(f"fair: a system failed; its logs are kept in {self.scratch}")
        else:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AGENTQ_", "OPENAI_", "FAIR_"))}
        env.update({"PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore",
                    "OPENAI_BASE_URL": self.model.base_url, "OPENAI_API_KEY": "sk-bench"})
        return env

    # each system: (driver, the pids whose CPU is its own, procs to stop, its database)

    def start_agentq(self, procs: Procs):
        db = "fair_agentq"
        stack, key = self.agentq_stack(procs, db, "math")  # one tool, as the peers
        return agentq_driver(stack.base, key), db

    def start_agentq_local(self, procs: Procs):
        """agentq with `math` local: no tools worker runs (its call cannot go by chord)."""
        db = "fair_agentq_local"
        stack, key = self.agentq_stack(procs, db, "math", {"AGENTQ_LOCAL_MODULES": "math"},
                                       workers=("orchestrator",))
        return agentq_driver(stack.base, key), db

    def agentq_stack(self, procs: Procs, db: str, modules: str,
                     extra: dict[str, str] | None = None,
                     workers: tuple[str, ...] = ("orchestrator", "tools")):
        """agentq's stack on this run's servers, offering `modules` (AGENTQ_DEFAULT_MODULES),
        in database `db`, with `extra` settings and `workers`; (the stack, an admin key)."""
        from benchmarks.harness import BENCH_ENV, BenchStack
        url = self.pg.create_database(db)
        redis_url = f"redis://127.0.0.1:{self.redis.port}/1"
        env = {**BENCH_ENV, "AGENTQ_BROKER_URL": redis_url,
               "AGENTQ_RESULT_BACKEND_URL": redis_url,
               "AGENTQ_DEFAULT_MODULES": modules,
               "AGENTQ_ORCHESTRATOR_CONCURRENCY": str(self.sizes.pool),
               "AGENTQ_DB_POOL_SIZE": str(self.sizes.db_pool), **(extra or {})}
        stack = BenchStack(url, self.model.base_url, procs.scratch, env,
                           workers=workers, beat=False,
                           web_workers=WEB_WORKERS, web_threads=WEB_THREADS)
        try:
            stack.start()
        finally:
            procs.procs.update(stack.procs)  # stopped with the others, started or not
        return stack, stack.create_key("fair", admin=True)

    def start_celery_langgraph(self, procs: Procs):
        db = "fair_celery_langgraph"
        env = {**self.base_env(), "FAIR_PG_URL": self.pg.empty_database(db),
               "FAIR_REDIS_URL": f"redis://127.0.0.1:{self.redis.port}/2",
               "FAIR_DB_POOL": str(self.sizes.db_pool)}
        procs.spawn("celery", [sys.executable, "-m", "celery", "-A",
                               "benchmarks.peers.celery_langgraph:celery_app", "worker",
                               "--pool", "threads", "--concurrency", str(self.sizes.pool),
                               "-Q", "fair_langgraph", "--without-gossip", "--without-mingle",
                               "--without-heartbeat", "--loglevel", "INFO"], env)
        procs.wait_log("celery", " ready.")
        port = free_port()
        procs.spawn("web", gunicorn("benchmarks.peers.celery_langgraph:app", port), env)
        wait_http(f"http://127.0.0.1:{port}/health")
        return service_driver(f"http://127.0.0.1:{port}"), db

    def start_dbos_service(self, procs: Procs):
        db = "fair_dbos_service"
        env = {**self.base_env(), "FAIR_PG_URL": self.pg.empty_database(db),
               "FAIR_DB_POOL": str(self.sizes.db_pool)}
        procs.spawn("dbos_worker", [sys.executable, "-m", "benchmarks.peers.dbos_service",
                                    "worker", "--concurrency", str(self.sizes.pool)], env)
        procs.wait_log("dbos_worker", "dbos worker ready.")
        port = free_port()
        procs.spawn("web", gunicorn("benchmarks.peers.dbos_service:app", port), env)
        wait_http(f"http://127.0.0.1:{port}/health")
        return service_driver(f"http://127.0.0.1:{port}"), db

    def start_library(self, name: str, procs: Procs):
        kind, durability = LIBRARIES[name]
        db = f"fair_lib_{name.replace('-', '_')}"
        cmd = [sys.executable, "-m", "benchmarks.peers.library", "--kind", kind,
               "--base-url", self.model.base_url, "--pg-url", self.pg.empty_database(db),
               "--db-pool", str(self.sizes.db_pool),
               "--max-concurrency", str(max(self.sizes.pool, self.sizes.clients))]
        if durability:
            cmd += ["--durability", durability]
        proc = procs.spawn("peer", cmd, self.base_env(), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if line.strip() != "READY":
            raise StackError(f"{name} did not start: {line[:300]} {procs.log('peer')[-2000:]}")
        return LibraryDriver(proc), db

    def system(self, name: str) -> dict[str, Any]:
        """Start one system, run its phases, stop it."""
        procs = Procs(self.scratch / name)
        procs.scratch.mkdir(parents=True, exist_ok=True)
        try:
            service = name in SERVICES or name in VARIANTS
            if service:
                driver, db = getattr(self, "start_" + name.replace("-", "_"))(procs)
            else:
                driver, db = self.start_library(name, procs)
            s = self.sizes
            self.last_snapshot = None
            if s.warmup:
                driver.run(s.warmup, 1, False)
            pids = {**{f"system:{n}": p for n, p in procs.pids().items()},
                    "postgres": self.pg.proc.pid, "redis": self.redis.proc.pid,
                    "model_server": self.model.pid}
            # a library's burst runs P at a time; a service's clients submit all at once and
            # its workers run P at a time
            burst_c = s.pool if not service else s.clients
            out = {"kind": "service" if service else "library",
                   "burst": self.phase(driver, db, pids, s.burst_jobs, burst_c, True)}
            out["idle_round_trips_per_s"] = self.idle_round_trips_per_s  # after the warm-up
            out["idle_redis_commands_per_s"] = self.idle_redis_commands_per_s
            out["closed_loop"] = self.phase(driver, db, pids, s.closed_jobs, s.clients, False)
            return out
        finally:
            procs.stop()

    def snapshot(self, db: str) -> dict[str, float]:
        """The database's counters once they are flushed, and the Redis server's commands;
        the wait, the system idle, also gives its background round trips per second (a
        polling queue's, a sweeper's) and Redis commands per second (a worker's polls)."""
        t0, calls0 = time.monotonic(), round_trips(self.pg, db)
        commands0 = self.redis_commands()
        time.sleep(STATS_SETTLE_S)
        elapsed = time.monotonic() - t0
        self.idle_round_trips_per_s = round((round_trips(self.pg, db) - calls0) / elapsed, 1)
        self.idle_redis_commands_per_s = round((self.redis_commands() - commands0) / elapsed, 1)
        return {**db_snapshot(self.pg, db), "redis_commands": self.redis_commands()}

    def redis_commands(self) -> float:
        """Commands the private Redis has processed so far (`INFO stats`), its own INFO
        calls excluded: a broker's round trips (a system without Redis sends none)."""
        import redis
        client = redis.Redis(port=self.redis.port)
        try:
            return float(client.info("stats")["total_commands_processed"]) - self._info_calls
        finally:
            self._info_calls += 1
            client.close()

    _info_calls = 0

    def phase(self, driver, db: str, pids: dict[str, int], n: int, clients: int,
              burst: bool) -> dict[str, Any]:
        before = self.last_snapshot if self.last_snapshot is not None else self.snapshot(db)
        meter = Meter(pids).start()
        start, outcomes = driver.run(n, clients, burst)
        cpu = meter.stop()
        after = self.last_snapshot = self.snapshot(db)
        ok_ends = [end for ok, end in outcomes if ok]
        elapsed = max(end for _ok, end in outcomes) - start if outcomes else 0.0
        system_cpu = sum(v for k, v in cpu.items() if k.startswith("system:"))
        machine = system_cpu + cpu["postgres"] + cpu["redis"]
        from benchmarks.harness import summary
        return {
            "jobs": n, "clients": clients, "completed": len(ok_ends),
            "failed": len(outcomes) - len(ok_ends), "elapsed_s": round(elapsed, 3),
            "jobs_per_s": round(len(ok_ends) / elapsed, 2) if elapsed > 0 else None,
            "latency": summary(end - start for end in ok_ends) if burst else None,
            "cpu_s": cpu,
            "cpu_ms_per_job": {
                "machine": round(1000 * machine / n, 2),
                "system": round(1000 * system_cpu / n, 2),
                "postgres": round(1000 * cpu["postgres"] / n, 2),
                "redis": round(1000 * cpu["redis"] / n, 2),
                "load_generator": round(1000 * cpu["load_generator"] / n, 2),
                "model_server": round(1000 * cpu["model_server"] / n, 2)},
            "per_job": per_job(before, after, n)}


def best(results: dict[str, Any], names, phase: str, key: Callable[[dict], float | None],
         highest: bool) -> tuple[str | None, float | None]:
    values = [(n, key(results[n][phase])) for n in names
              if n in results and "error" not in results[n]]
    values = [(n, v) for n, v in values if v is not None]
    if not values:
        return None, None
    return (max if highest else min)(values, key=lambda nv: nv[1])


def ratios(systems: dict[str, Any]) -> dict[str, Any]:
    """agentq's figures against the best service peer and the best library peer."""
    if "error" in systems.get("agentq", {"error": 1}):
        return {}
    out: dict[str, Any] = {}
    a = systems["agentq"]
    peers = {"service": [n for n in SERVICES if n != "agentq"], "library": list(LIBRARIES)}
    for group, names in peers.items():
        for phase in ("burst", "closed_loop"):
            name, value = best(systems, names, phase, lambda p: p["jobs_per_s"], True)
            if value:
                out[f"{phase}_jobs_per_s_vs_best_{group}"] = {
                    "peer": name, "ratio": round(a[phase]["jobs_per_s"] / value, 2)}
            name, value = best(systems, names, phase,
                               lambda p: p["cpu_ms_per_job"]["machine"], False)
            if value:
                out[f"{phase}_machine_cpu_vs_best_{group}"] = {
                    "peer": name, "ratio": round(a[phase]["cpu_ms_per_job"]["machine"] / value,
                                                 2)}
    return out


def local_vs_chord(systems: dict[str, Any]) -> dict[str, Any]:
    """agentq with `math` local against agentq with its call by chord, phase by phase:
    jobs/s, machine CPU per job and round trips per job (each local / chord)."""
    a, b = systems.get("agentq-local"), systems.get("agentq")
    if not a or not b or "error" in a or "error" in b:
        return {}
    from benchmarks.harness import ratio
    out: dict[str, Any] = {}
    for phase in ("burst", "closed_loop"):
        out[f"{phase}_jobs_per_s"] = ratio(a[phase]["jobs_per_s"], b[phase]["jobs_per_s"])
        out[f"{phase}_machine_cpu"] = ratio(a[phase]["cpu_ms_per_job"]["machine"],
                                            b[phase]["cpu_ms_per_job"]["machine"])
        out[f"{phase}_round_trips"] = ratio(a[phase]["per_job"]["round_trips"],
                                            b[phase]["per_job"]["round_trips"])
        out[f"{phase}_redis_commands"] = ratio(a[phase]["per_job"].get("redis_commands"),
                                               b[phase]["per_job"].get("redis_commands"))
    return out


ALL = (*SERVICES, *VARIANTS, *LIBRARIES)
"""Every system, in the order a run takes them."""


def run(mode: str, log: Callable[[str], None], only: list[str] | None = None) -> dict[str, Any]:
    """The fair comparison at the mode's sizes; every system's figures (or those of `only`),
    the ratios, and local tools against the chord."""
    sizes = SIZES[mode]
    names = only or list(ALL)
    fair = Run(sizes, log)
    log(f"fair: private Postgres and Redis, logs in {fair.scratch}")
    systems: dict[str, Any] = {}
    try:
        fair.start()
        for name in names:
            log(f"fair: {name}")
            t0 = time.perf_counter()
            try:
                systems[name] = fair.system(name)
            except Exception as exc:  # noqa: BLE001 - one system failing does not end the run
                import traceback
                traceback.print_exc()
                systems[name] = {"error": f"{type(exc).__name__}: {exc}"}
                fair.keep_logs = True
            systems[name]["setup_and_run_s"] = round(time.perf_counter() - t0, 1)
    finally:
        fair.stop()
    return {"sizes": asdict(sizes), "poll_s": POLL_S, "systems": systems,
            "ratios": ratios(systems), "local_vs_chord": local_vs_chord(systems)}
