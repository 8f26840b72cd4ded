"""What the scenarios stand on: a fresh Postgres database, Redis, the model server in its own
process, the Procfile's processes (gunicorn API, workers, beat), an HTTP client, a watcher
that sees jobs end, and samplers for memory and CPU.

Redis: `AGENTQ_BENCH_REDIS` (default: `AGENTQ_TEST_REDIS` when set, else
`redis://127.0.0.1:6379/11`) — its database is flushed at start and end, so give the benchmark
a database number nobody else uses.
Postgres: `AGENTQ_TEST_PG` (an admin URL) when set; else a cluster of the run's own
(`LabPostgres`: durable as the machine's, room for 1,000 connections, ended with the run), so
that a lab's ~150 connections (an orchestrator of 1,000 threads, 2 x 8 API threads, workers)
never meet a machine server's 100 (`sorry, too many clients already`, on a Debian default)
nor another program's load. The benchmark makes `agentq_bench_<pid>` (and one
`agentq_bench_peer_<kind>_<pid>` per peer) and drops them after.
"""
from __future__ import annotations

import os

BENCH_REDIS_URL = (os.environ.get("AGENTQ_BENCH_REDIS") or os.environ.get("AGENTQ_TEST_REDIS")
                   or "redis://127.0.0.1:6379/11")
"""AGENTQ_BENCH_REDIS; else the test session's Redis database (a benchmark started by a test,
or imported by one, stays on the suite's private server); else the machine's database 11."""
# tests.support.stack reads AGENTQ_TEST_REDIS when imported: set it first.
os.environ["AGENTQ_TEST_REDIS"] = BENCH_REDIS_URL

import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterable  # noqa: E402

import requests  # noqa: E402

from tests.support import stack as stack_mod  # noqa: E402
from tests.support.services import SuitePostgres, terminate  # noqa: E402
from tests.support.stack import (  # noqa: E402
    ROOT,
    Stack,
    StackError,
    answers,
    create_database,
    die_with_parent,
    drop_database,
    flush_redis,
)

TERMINAL = ("completed", "failed", "cancelled")
SERVER_START_TIMEOUT_S = 15

GROWTH_MODEL = "bench-small-window"
"""The model the growth scenario's jobs name (through a persona): the scripted server answers
it as any other, and its context window is small enough that its jobs compact."""
GROWTH_WINDOW_TOKENS = 4096

# The stack's configuration for every scenario: a budget that never stops a job, room for
# 200 tool turns, a small window for the growth scenario's model, the rest agentq's own
# defaults (the orchestrator's pool included, unless AGENTQ_ORCHESTRATOR_CONCURRENCY or
# AGENTQ_ORCHESTRATOR_POOL — `run --orchestrator-pool` — is set in the benchmark's environment).
BENCH_ENV = {
    "AGENTQ_MODEL": "gpt-4o-mini",
    "AGENTQ_GUEST_MONTHLY_TOKENS": "1000000000",
    "AGENTQ_MAX_ITERATIONS": "200",  # the most settings allow: the growth scenario's 200 turns
    "AGENTQ_LLM_TIMEOUT_S": "60",
    "AGENTQ_MODEL_CONTEXT_WINDOWS": f"{GROWTH_MODEL}={GROWTH_WINDOW_TOKENS}",
    # the scenarios measure what one key's clients get through: no per-key rate limit
    # (api/ratelimit.py); `front`'s stream keys keep the default streams_per_key
    "AGENTQ_QUOTA_REQUESTS_PER_SECOND": "0",
}
PASSED_THROUGH = ("AGENTQ_ORCHESTRATOR_CONCURRENCY", "AGENTQ_ORCHESTRATOR_POOL",
                  "AGENTQ_TOOLS_CONCURRENCY",
                  "AGENTQ_DB_POOL_SIZE", "AGENTQ_DB_PREPARE_THRESHOLD", "AGENTQ_LOG_LEVEL",
                  "AGENTQ_TOOL_JOIN",
                  "AGENTQ_HISTORY_MAX_MESSAGES", "AGENTQ_CONTEXT_MAX_TOKENS",
                  "AGENTQ_METRICS", "AGENTQ_TRACING")


# --- numbers ----------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values_s: Iterable[float]) -> dict[str, Any]:
    """Median, p95, mean, min, max of seconds, in milliseconds."""
    values = [v * 1000 for v in values_s]
    if not values:
        return {"n": 0, "median_ms": None, "p95_ms": None, "mean_ms": None,
                "min_ms": None, "max_ms": None}
    return {"n": len(values), "median_ms": round(statistics.median(values), 2),
            "p95_ms": round(percentile(values, 95), 2),
            "mean_ms": round(statistics.fmean(values), 2),
            "min_ms": round(min(values), 2), "max_ms": round(max(values), 2)}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


# --- processes: memory and CPU ---------------------------------------------------------

try:
    import psutil  # type: ignore
except ImportError:  # pragma: no cover - psutil is in the bench extra
    psutil = None

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    if psutil is not None:
        try:
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def rss_bytes(pid: int, with_children: bool = True) -> int:
    """Resident memory of a process (and its children: a prefork pool's processes)."""
    pids = [pid] + (_children(pid) if with_children else [])
    gone = (OSError, ValueError) if psutil is None else (OSError, psutil.Error)
    total = 0
    for p in pids:
        try:
            if psutil is not None:
                total += psutil.Process(p).memory_info().rss
            else:
                for line in Path(f"/proc/{p}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except gone:
            continue
    return total


def cpu_seconds(pid: int, with_children: bool = True) -> float:
    """User + system CPU seconds of a process and its live children."""
    pids = [pid] + (_children(pid) if with_children else [])
    total = 0.0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError, ValueError):
            continue
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        parts = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


class CpuMeter:
    """CPU seconds each named process used between start() and stop(), and machine load."""

    def __init__(self, pids: dict[str, int], alone: Iterable[str] = ("bench_client",)):
        self.pids = pids
        self.alone = set(alone)
        """Names counted without their children (the benchmark's own process is the
        parent of the whole stack)."""

    def _cpu(self, name: str) -> float:
        return cpu_seconds(self.pids[name], with_children=name not in self.alone)

    def start(self) -> "CpuMeter":
        self.t0 = time.perf_counter()
        self.before = {n: self._cpu(n) for n in self.pids}
        self.machine0 = machine_cpu()
        return self

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        used = {n: round(self._cpu(n) - self.before[n], 3) for n in self.pids}
        busy0, total0 = self.machine0
        busy1, total1 = machine_cpu()
        util = (busy1 - busy0) / (total1 - total0) if total1 > total0 else None
        return {"wall_s": round(wall, 3), "cpu_s": used,
                "machine_busy": round(util, 3) if util is not None else None}


class RssSampler(threading.Thread):
    """Samples one process's resident memory until stopped; keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        super().__init__(daemon=True, name="rss-sampler")
        self.pid, self.interval_s = pid, interval_s
        self.peak = self.first = rss_bytes(pid)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def stop(self) -> dict[str, float]:
        self._halt.set()
        self.join(timeout=2)
        last = rss_bytes(self.pid)
        self.peak = max(self.peak, last)
        return {"before_mib": round(self.first / 2**20, 1), "peak_mib": round(self.peak / 2**20, 1),
                "after_mib": round(last / 2**20, 1)}


# --- the model server -------------------------------------------------------------------

class ModelServerClient:
    """The benchmark model server's own routes (/stats, /reset, /config), from its base URL."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.root = base_url[:-3] if base_url.endswith("/v1") else base_url
        self.http = requests.Session()

    def stats(self) -> dict[str, Any]:
        return self.http.get(f"{self.root}/stats", timeout=10).json()

    def reset(self) -> None:
        self.http.post(f"{self.root}/reset", timeout=10).raise_for_status()

    def set_latency(self, seconds: float) -> None:
        self.http.post(f"{self.root}/config", json={"latency_s": seconds},
                       timeout=10).raise_for_status()


class ModelServer(ModelServerClient):
    """`python -m benchmarks.llm_server` as a child process."""

    def __init__(self, latency_s: float = 0.0, host: str = "127.0.0.1"):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.llm_server", "--latency", str(latency_s),
             "--host", host],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
            preexec_fn=die_with_parent)
        line = ""
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline and not line:
            line = self.proc.stdout.readline().strip()
            if self.proc.poll() is not None:
                break
        if not line.startswith("http"):
            self.stop()
            raise StackError(f"the model server did not start: {line!r}")
        super().__init__(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        terminate(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if hasattr(self, "http"):
            self.http.close()


# --- the stack --------------------------------------------------------------------------

ORCHESTRATORS_ENV = "AGENTQ_BENCH_ORCHESTRATORS"
"""How many orchestrator processes the bench stack runs (`run --orchestrators N`; 1 unless
set): the second and later are `agentq worker orchestrator -n orchestrator-<i>@%h`, each
with the pool and concurrency of the first, all consuming the one orchestrator queue, as
docs/deploying.md advises past one process's rate."""


def orchestrator_names(count: int) -> list[str]:
    """The stack's names of `count` orchestrator processes: orchestrator, orchestrator-2, …"""
    return ["orchestrator"] + [f"orchestrator-{i}" for i in range(2, count + 1)]


class BenchStack(Stack):
    """tests.support.stack.Stack with the Procfile's web sizing (workers × threads), and
    as many orchestrator processes as ORCHESTRATORS_ENV asks."""

    def __init__(self, *args, web_workers: int = 2, orchestrators: int = 1, **kw):
        super().__init__(*args, **kw)
        self.web_workers = web_workers
        self.orchestrators = orchestrator_names(orchestrators)
        self.workers = (*self.workers, *self.orchestrators[1:])

    def commands(self) -> dict[str, list[str]]:
        commands = super().commands()
        for name in self.orchestrators[1:]:
            # `agentq worker` passes what follows the kind to Celery; its last -n wins
            commands[name] = [self.agentq_bin(), "worker", "orchestrator", "-n", f"{name}@%h"]
        return commands

    def web_command(self) -> list[str]:
        return [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{self.port}",
                "--workers", str(self.web_workers), "--threads", str(self.web_threads),
                "--backlog", "4096", "api.wsgi:app"]

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}


def services_answer() -> list[str]:
    """Names of the services that do not answer on loopback."""
    pg_port = int(stack_mod.PG_ADMIN_URL.rsplit(":", 1)[1].split("/", 1)[0]) \
        if ":" in stack_mod.PG_ADMIN_URL.split("@")[-1] else 5432
    redis_hostport = BENCH_REDIS_URL.split("://", 1)[1].split("/", 1)[0]
    redis_host, _, redis_port = redis_hostport.rpartition(":")
    missing = []
    if not answers("127.0.0.1", pg_port):
        missing.append(f"PostgreSQL (127.0.0.1:{pg_port})")
    if not answers(redis_host or "127.0.0.1", int(redis_port or 6379)):
        missing.append(f"Redis ({redis_hostport})")
    return missing


def plain_pg_url(sqlalchemy_url: str) -> str:
    from agentq.config.urls import libpq_url
    return libpq_url(sqlalchemy_url)


def query(database_url: str, sql: str, params: tuple = ()) -> list[tuple]:
    """One statement on its own autocommit connection (psycopg2, outside agentq's pool);
    its rows, or [] for a statement that returns none."""
    import psycopg2
    conn = psycopg2.connect(plain_pg_url(database_url))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


class Lab:
    """Everything one benchmark run needs, started once and stopped at the end."""

    def __init__(self, scratch: Path, web_workers: int = 2, web_threads: int = 8):
        self.orchestrators = int(os.environ.get(ORCHESTRATORS_ENV) or 1)
        if self.orchestrators < 1:
            raise ValueError(f"{ORCHESTRATORS_ENV} must be 1 or more, not {self.orchestrators}")
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.db_name = f"agentq_bench_{os.getpid()}"
        self.peer_db_names: list[str] = []
        self.web_workers, self.web_threads = web_workers, web_threads
        self.server: ModelServer | None = None
        self.stack: BenchStack | None = None
        self.database_url = ""
        self.key = ""

    def env(self) -> dict[str, str]:
        env = dict(BENCH_ENV)
        env.update({k: os.environ[k] for k in PASSED_THROUGH if os.environ.get(k)})
        env["AGENTQ_BROKER_URL"] = BENCH_REDIS_URL
        env["AGENTQ_RESULT_BACKEND_URL"] = BENCH_REDIS_URL
        return env

    def start(self) -> "Lab":
        t0 = time.perf_counter()
        flush_redis(BENCH_REDIS_URL)
        self.database_url = create_database(self.db_name)
        self.server = ModelServer()
        self.stack = BenchStack(self.database_url, self.server.base_url, self.scratch,
                                self.env(), web_workers=self.web_workers,
                                web_threads=self.web_threads,
                                orchestrators=self.orchestrators)
        try:
            self.stack.start()
        except StackError:
            self.stop()
            raise
        self.key = self.stack.create_key("bench", admin=True)
        self.started_in_s = round(time.perf_counter() - t0, 2)
        return self

    def settings(self):
        return self.stack.settings()

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
        if self.server is not None:
            self.server.stop()
        try:
            drop_database(self.db_name)
        except Exception:  # noqa: BLE001 - best effort
            pass
        for name in self.peer_db_names:
            try:
                drop_database(name)
            except Exception:  # noqa: BLE001 - best effort
                pass
        try:
            flush_redis(BENCH_REDIS_URL)
        except Exception:  # noqa: BLE001
            pass

    def create_peer_database(self, kind: str = "langgraph") -> str:
        """An empty database of the peer's own (a checkpointer's, DBOS's system database);
        its plain libpq URL."""
        name = f"agentq_bench_peer_{kind.replace('-', '_')}_{os.getpid()}"
        if name not in self.peer_db_names:
            self.peer_db_names.append(name)
        return stack_mod.create_empty_database(name)


# --- the client -------------------------------------------------------------------------

class Client:
    """POST /v1/messages through HTTP, one keep-alive session per thread."""

    def __init__(self, base: str, key: str):
        self.base, self.key = base, key
        self._local = threading.local()

    def _http(self) -> requests.Session:
        http = getattr(self._local, "http", None)
        if http is None:
            http = self._local.http = requests.Session()
            http.headers["Authorization"] = f"Bearer {self.key}"
        return http

    def submit(self, content: str, user: str | None = None, channel: str | None = None,
               persona_id: str | None = None) -> tuple[str, float]:
        """(job id, wall-clock time just before the request)."""
        body = {"platform": "api", "platform_user_id": user or uid("u"),
                "platform_channel_id": channel or uid("c"), "content": content}
        if persona_id:
            body["persona_id"] = persona_id
        t0 = time.time()
        response = self._http().post(f"{self.base}/v1/messages", json=body, timeout=120)
        if response.status_code != 202:
            raise RuntimeError(f"submit answered {response.status_code}: {response.text[:300]}")
        return response.json()["id"], t0


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class JobWatcher(threading.Thread):
    """Polls Postgres for the jobs it is given and records when each ended.

    The end time is the job row's `finished_at` (written by the step that ended it), so the
    polling interval does not add to the measured latency.
    """

    def __init__(self, database_url: str, interval_s: float = 0.01):
        super().__init__(daemon=True, name="job-watcher")
        import psycopg2
        self.conn = psycopg2.connect(plain_pg_url(database_url))
        self.conn.autocommit = True
        self.interval_s = interval_s
        self.pending: dict[str, threading.Event] = {}
        self.ended: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self._halt = threading.Event()
        self.start()

    def watch(self, job_id: str) -> threading.Event:
        with self.lock:
            if job_id in self.ended:
                event = threading.Event()
                event.set()
                return event
            return self.pending.setdefault(job_id, threading.Event())

    def wait(self, job_id: str, timeout_s: float) -> dict[str, Any]:
        if not self.watch(job_id).wait(timeout_s):
            raise TimeoutError(f"job {job_id} did not end within {timeout_s:g} s")
        return self.ended[job_id]

    def wait_all(self, job_ids: Iterable[str], timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        out = []
        for job_id in job_ids:
            left = max(0.0, deadline - time.monotonic())
            if not self.watch(job_id).wait(left):
                raise TimeoutError(f"job {job_id} did not end within {timeout_s:g} s")
            out.append(self.ended[job_id])
        return out

    def run(self) -> None:
        cur = self.conn.cursor()
        while not self._halt.wait(self.interval_s):
            with self.lock:
                ids = list(self.pending)
            if not ids:
                continue
            cur.execute(
                "SELECT id::text, status, finish_reason, extract(epoch from created_at), "
                "extract(epoch from finished_at), iteration FROM jobs "
                "WHERE id = ANY(%s::uuid[]) AND status IN ('completed','failed','cancelled')",
                (ids,))
            rows = cur.fetchall()
            with self.lock:
                for job_id, status, reason, created, finished, iteration in rows:
                    self.ended[job_id] = {"id": job_id, "status": status,
                                          "finish_reason": reason, "created": float(created),
                                          "finished": float(finished),
                                          "iterations": iteration}
                    event = self.pending.pop(job_id, None)
                    if event is not None:
                        event.set()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)
        self.conn.close()


def job_breakdown(database_url: str, job_ids: list[str]) -> dict[str, Any]:
    """Where a one-tool-turn job's time goes, per hop, from the rows it wrote (medians).

    created → first claim (job_start event) → reply 1 persisted (token log 1) → tool task
    starts → tool result stored → reply 2 persisted (token log 2) → finished.
    """
    import psycopg2
    if not job_ids:
        return {}
    conn = psycopg2.connect(plain_pg_url(database_url))
    try:
        with conn.cursor() as cur:
            cur.execute("""
                SELECT j.id,
                  extract(epoch from j.created_at),
                  (SELECT extract(epoch from min(e.created_at)) FROM job_events e
                     WHERE e.job_id = j.id AND e.type = 'job_start'),
                  (SELECT extract(epoch from t.created_at) FROM token_logs t
                     WHERE t.job_id = j.id AND t.iteration = 1),
                  (SELECT extract(epoch from min(c.started_at)) FROM tool_calls c
                     WHERE c.job_id = j.id AND c.iteration = 1),
                  (SELECT extract(epoch from max(c.finished_at)) FROM tool_calls c
                     WHERE c.job_id = j.id AND c.iteration = 1),
                  (SELECT extract(epoch from t.created_at) FROM token_logs t
                     WHERE t.job_id = j.id AND t.iteration = 2),
                  extract(epoch from j.finished_at)
                FROM jobs j WHERE j.id = ANY(%s::uuid[])""", (job_ids,))
            rows = cur.fetchall()
    finally:
        conn.close()
    hops = {"queue_to_first_step": (1, 2), "step1_claim_model_persist": (2, 3),
            "dispatch_to_tool_start": (3, 4), "tool_run_and_store": (4, 5),
            "join_to_step2_persist": (5, 6), "step2_finish": (6, 7)}
    out = {}
    for name, (a, b) in hops.items():
        values = [float(r[b]) - float(r[a]) for r in rows
                  if r[a] is not None and r[b] is not None]
        out[name] = summary(values)["median_ms"]
    return out


def machine_info() -> dict[str, Any]:
    import platform
    info: dict[str, Any] = {"python": platform.python_version(),
                            "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    return info


def versions() -> dict[str, str | None]:
    from importlib import metadata
    out: dict[str, str | None] = {}
    for name in ("agentq", "celery", "kombu", "redis", "sqlalchemy", "psycopg2-binary",
                 "openai", "flask", "gunicorn", "langgraph", "langgraph-checkpoint-postgres",
                 "langchain-openai", "psycopg", "dbos"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        import psycopg2
        conn = psycopg2.connect(stack_mod.PG_ADMIN_URL)
        with conn.cursor() as cur:
            cur.execute("SHOW server_version")
            out["postgres"] = cur.fetchone()[0]
        conn.close()
    except Exception:  # noqa: BLE001
        out["postgres"] = None
    try:
        import redis
        client = redis.Redis.from_url(BENCH_REDIS_URL)
        out["redis_server"] = client.info("server").get("redis_version")
        client.close()
    except Exception:  # noqa: BLE001
        out["redis_server"] = None
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                           capture_output=True, text=True,
                                           timeout=5).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "agentq", "api", "tasks"],
                               cwd=ROOT, capture_output=True, text=True, timeout=5).stdout
        out["git_dirty"] = bool(dirty.strip())
    except (OSError, subprocess.SubprocessError):
        out["git_commit"] = None
    return out


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


def write_results(out_dir: Path, kind: str, data: Any, stamp: str) -> Path:
    """`data` as <stamp>-<kind>.json and latest-<kind>.json in `out_dir`; the first's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = dumps(data)
    path = out_dir / f"{stamp}-{kind}.json"
    path.write_text(text)
    (out_dir / f"latest-{kind}.json").write_text(text)
    return path


class LabPostgres(SuitePostgres):
    """The run's own cluster when AGENTQ_TEST_PG is not set: the suite's (a child of this
    process that does not outlive it), with fsync and full-page writes on as on the machine's
    server, so figures stay comparable with runs on it."""
    DURABILITY = ()


_own_postgres: LabPostgres | None = None


def own_postgres(log) -> None:
    """Unless AGENTQ_TEST_PG names a server, start the run's own cluster (once per process;
    stopped and deleted when the process exits) and point AGENTQ_TEST_PG at it: every
    database the run makes is made there."""
    global _own_postgres
    if os.environ.get("AGENTQ_TEST_PG") or _own_postgres is not None:
        return
    import atexit
    import shutil
    scratch = Path(tempfile.mkdtemp(prefix="agentq-bench-pg-"))
    _own_postgres = LabPostgres(scratch).start()
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    atexit.register(_own_postgres.stop)  # (run first: atexit runs last-registered first)
    os.environ["AGENTQ_TEST_PG"] = _own_postgres.admin_url
    log(f"PostgreSQL of the run's own on 127.0.0.1:{_own_postgres.port} "
        f"(AGENTQ_TEST_PG unset)")


def start_lab(prefix: str, log, what: str = "") -> "Lab | None":
    """A started Lab whose logs go to a new scratch directory; None (said on stderr) when
    the stack did not start."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    log(f"{what}starting the stack (logs in {scratch})")
    lab = Lab(scratch)
    try:
        own_postgres(log)
        lab.start()
    except Exception as exc:  # noqa: BLE001 - reported
        print(f"cannot start the stack: {exc}", file=sys.stderr)
        return None
    return lab
