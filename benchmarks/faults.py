"""The fault suite: the Procfile's processes against their own Postgres and Redis (private
ports, scratch directories), a stream of one-tool jobs, and one fault injected while it
flows. Every scenario asserts the promise: every job `completed`, nothing duplicated, no
non-idempotent tool run twice, at most one file per call, no API 500.

    python -m benchmarks faults [--jobs 1000] [--rate 10] [--only NAME]

The jobs: most call `math.evaluate`; every 10th (n % 10 == 3) calls `files.create_document`
(a side effect, idempotent by its tool_use_id) and every 25th (n % 25 == 7) a slow
`code.run_python` (sleeps 2 s in the sandbox, on the tools-slow worker, 2 at a time; not
idempotent), as one of the few users the lab made `user` level. Few and short enough that
no code call waits in the tools-slow queue past the 8 s step deadline: the sweeper
re-dispatches a call pending that long (agentq/loop/step.py `_collect`), and a
non-idempotent one then runs twice (docs/faults.md).

Also run by tests/faults/ at a reduced size (AGENTQ_FAULT_JOBS, default 100).

The submitter is a well-behaved client: on a 503 `unavailable`, a 429 `rate_limited` (the
key's requests a second: the submitters' resends bunch up when the API comes back) or a
connection cut while `web` is killed, it resends the same request with the same
Idempotency-Key after `Retry-After`, so a job is created exactly once whatever the API went
through. A 500 is never retried: it is counted and fails the scenario.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import requests
from standardwebhooks import Webhook, WebhookVerificationError

from benchmarks.harness import BenchStack, ModelServer
from benchmarks.netns import Network, Node, node_stack
from tests.support.services import PrivatePostgres, PrivateRabbitMQ, PrivateRedis
from tests.support.stack import WORKERS, Stack, StackError

ONE_TOOL_JOB = "What is 6*7? turns=1"
FILE_JOB = "Write it down. tool=create_document turns=1"
CODE_JOB = "Compute it slowly. tool=run_python:2 turns=1"
CODERS = 3
"""users of `user` level (code.run_python needs it), made by the lab: coder0..coder2"""
STORM_S = float(os.environ.get("AGENTQ_FAULT_STORM_S", "300"))
"""The provider storm's length for `python -m benchmarks faults` (5 minutes; the tests'
size is set in tests/support/fault_lab.py)."""


def job_content(n: int) -> tuple[str, str]:
    """Job n's user (platform_user_id) and message."""
    if n % 10 == 3:
        return f"u{n % 50}", FILE_JOB
    if n % 25 == 7:
        return f"coder{n % CODERS}", CODE_JOB
    return f"u{n % 50}", ONE_TOOL_JOB


def sandbox_cgroup_mode() -> str:
    """`required` where this machine can delegate cgroup v2 to the sandbox's runs, else `off`
    (a hybrid cgroup v1 host: docs/security.md)."""
    from agentq.tools import cgroups
    return "required" if cgroups.check() is None else "off"


FAULT_ENV = {
    "AGENTQ_MODEL": "gpt-4o-mini",
    "AGENTQ_GUEST_MONTHLY_TOKENS": "1000000000",
    "AGENTQ_MAX_ITERATIONS": "25",
    # a storm's hangs (10 s) run past the model call's timeout, and its parked jobs come
    # back within 2..20 s (agentq's defaults: 5..300 s, for a real provider); the wait
    # window stays agentq's 30 minutes, far past the longest storm (5 minutes)
    "AGENTQ_LLM_TIMEOUT_S": "4",
    "AGENTQ_PROVIDER_RETRY_BASE_S": "2",
    "AGENTQ_PROVIDER_RETRY_MAX_S": "20",
    "AGENTQ_STEP_DEADLINE_S": os.environ.get("AGENTQ_FAULT_STEP_DEADLINE_S", "8"),
    "AGENTQ_SWEEP_INTERVAL_S": "2",
    "AGENTQ_REDRIVE_BACKOFF_MAX_S": "30",
    "AGENTQ_ORCHESTRATOR_CONCURRENCY": os.environ.get("AGENTQ_FAULT_ORCHESTRATOR_CONCURRENCY",
                                                       "200"),
    "AGENTQ_ORCHESTRATOR_POOL": os.environ.get("AGENTQ_FAULT_ORCHESTRATOR_POOL", "threads"),
    "AGENTQ_LOG_LEVEL": "INFO",
    # every job has a callback: its end event must reach the receiver once, with one id,
    # whatever the fault; retries keep going for 20 minutes (the receiver's longest outage
    # is 10), and a delivery whose message was lost is sent again after 10 s
    "AGENTQ_WEBHOOK_SECRET": "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    "AGENTQ_WEBHOOK_ALLOW_PRIVATE": "1",
    "AGENTQ_WEBHOOK_TIMEOUT_S": "5",
    "AGENTQ_WEBHOOK_RETRY_SCHEDULE_S": "1,2,4,8,15" + ",30" * 40,
    "AGENTQ_WEBHOOK_OVERDUE_S": "10",
    # the code sandbox's per-run cgroups as this machine allows (as tests/conftest.py does:
    # `off` on a host that cannot delegate cgroup v2, where `required` runs no code at all
    # and every code call of the mix would fail before its tool ran)
    "AGENTQ_SANDBOX_CGROUP": os.environ.get("AGENTQ_SANDBOX_CGROUP", sandbox_cgroup_mode()),
}
SUBMIT_GIVE_UP_S = 300.0
RETRIED = frozenset({(503, "unavailable"), (429, "rate_limited")})
"""The answers a well-behaved client resends after `Retry-After` (status, error code)."""


@dataclass
class Outcome:
    name: str
    jobs: int
    statuses: dict[str, int] = field(default_factory=dict)
    api: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    not_submitted: int = 0
    webhooks: dict[str, int] = field(default_factory=dict)
    tool_reruns: dict[str, int] = field(default_factory=dict)
    """tool calls run more than once (at-least-once delivery), idempotent or not; the
    non-idempotent ones also count in `duplicates` (they fail the scenario)"""
    tool_calls: dict[str, dict[str, int]] = field(default_factory=dict)
    """tool name → {status: calls}: what the jobs' mix ran"""
    files_made: int = 0
    provider_waits: int = 0
    """jobs that waited for their provider (a `waiting_provider` event)"""
    model_calls: int = 0
    """chat requests the model server answered or refused during the scenario: a one-tool
    job needs two; more are calls asked again (a step re-run after a fault, a storm's
    refusals)"""
    drain_s: float | None = None
    fault_s: float | None = None
    total_s: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def completed(self) -> int:
        return self.statuses.get("completed", 0)

    @property
    def api_500(self) -> int:
        return sum(n for code, n in self.api.items()
                   if code.isdigit() and int(code) >= 500 and code != "503")

    def ok(self) -> bool:
        return (self.completed == self.jobs and self.not_submitted == 0
                and self.api_500 == 0 and not any(self.duplicates.values())
                and not self.webhook_problems())

    def webhook_problems(self) -> dict[str, int]:
        """What went wrong with the callbacks: jobs whose end event never arrived, jobs
        whose event arrived under more than one id, requests that failed verification."""
        return {k: n for k, n in self.webhooks.items()
                if k in ("jobs_not_delivered", "jobs_with_two_ids", "bad_signatures") and n}

    def as_dict(self) -> dict[str, Any]:
        return {"scenario": self.name, "jobs": self.jobs, "completed": self.completed,
                "failed": self.statuses.get("failed", 0), "statuses": self.statuses,
                "api": self.api, "api_5xx_not_503": self.api_500,
                "not_submitted": self.not_submitted, "duplicates": self.duplicates,
                "webhooks": self.webhooks, "tool_reruns": self.tool_reruns,
                "provider_waits": self.provider_waits,
                "model_calls_per_job": round(self.model_calls / self.jobs, 3)
                if self.jobs else None, "tool_calls": self.tool_calls,
                "files_made": self.files_made,
                "fault_s": self.fault_s, "drain_s": self.drain_s, "total_s": self.total_s,
                "notes": self.notes, "ok": self.ok()}


class Receiver:
    """Every job's webhook endpoint: verifies each request's signature (the standardwebhooks
    library), records its `webhook-id` per job, answers 204. `down()` closes its port (the
    sender's connections are refused) and `up()` opens it again, on the same port."""

    def __init__(self, secret: str):
        self._webhook = Webhook(secret)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._lock = threading.Lock()
        self.ids: dict[str, set[str]] = {}
        """job id → the webhook-ids its events arrived under"""
        self.requests: dict[str, int] = {}
        """job id → the requests that carried its events (a retry after a lost answer
        arrives twice under one id: at-least-once delivery)"""
        self.bad_signatures = 0
        self._server: ThreadingHTTPServer | None = None

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    event = receiver._webhook.verify(body, dict(self.headers.items()))
                except WebhookVerificationError:
                    with receiver._lock:
                        receiver.bad_signatures += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                job_id = event["data"]["id"]
                with receiver._lock:
                    receiver.requests[job_id] = receiver.requests.get(job_id, 0) + 1
                    receiver.ids.setdefault(job_id, set()).add(self.headers["webhook-id"])
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True,
                         name="webhook-receiver").start()
        self._server = server

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def not_delivered(self, job_ids: list[str]) -> list[str]:
        with self._lock:
            return [j for j in job_ids if not self.ids.get(j)]

    def report(self, job_ids: list[str]) -> dict[str, int]:
        with self._lock:
            return {"requests": sum(self.requests.get(j, 0) for j in job_ids),
                    "bad_signatures": self.bad_signatures,
                    "jobs_not_delivered": sum(1 for j in job_ids if not self.ids.get(j)),
                    "jobs_with_two_ids": sum(1 for j in job_ids
                                             if len(self.ids.get(j, ())) > 1)}


class FaultLab:
    """Private Redis + Postgres + model server + the Procfile's processes, and the jobs'
    webhook receiver. `broker="amqp"`: a private RabbitMQ node is the broker (Redis stays
    the result backend, as docs/deploying.md recommends).

    `nodes=N`: N more nodes, each an orchestrator and a tools worker in a network namespace
    of its own (benchmarks/netns.py), reaching Postgres, the broker and the model server
    over a link `lab.nodes[i].cut()` takes down; the servers then also listen on the host's
    address on that network. Root only. `node_cpus`: each node's CPU quota (None: none);
    `host_workers`: the workers the host runs beside web and beat (default: every kind)."""

    def __init__(self, scratch: Path, extra_env: dict[str, str] | None = None,
                 broker: str = "redis", nodes: int = 0, node_cpus: float | None = None,
                 host_workers=WORKERS):
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        if broker not in ("redis", "amqp"):
            raise ValueError(f"broker: redis or amqp, not {broker!r}")
        self.network = Network().create() if nodes else None
        self.node_count, self.node_cpus = nodes, node_cpus
        self.host_workers = tuple(host_workers)
        self.nodes: list[Node] = []
        self.node_stacks: list[Stack] = []
        also = self.network.host_address if self.network else ""
        self.redis = PrivateRedis(self.scratch, listen_also=also)
        self.rabbit = PrivateRabbitMQ(self.scratch, listen_also=also) \
            if broker == "amqp" else None
        self.pg = PrivatePostgres(self.scratch, listen_also=also,
                                  clients=str(self.network.subnet) if self.network else "")
        self.extra_env = extra_env or {}
        self.server: ModelServer | None = None
        self.receiver = Receiver(FAULT_ENV["AGENTQ_WEBHOOK_SECRET"])
        self.stack: BenchStack | None = None
        self.key = ""
        self.database_url = ""
        # Faults run here: a process started from a thread gets its parent-death signal
        # when THAT thread ends (PR_SET_PDEATHSIG), so restarts come from one thread that
        # lives as long as the lab.
        self.control = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fault")

    def start(self) -> "FaultLab":
        self.redis.start()
        if self.rabbit is not None:
            self.rabbit.start()
        self.pg.start()
        self.database_url = self.pg.create_database("agentq_faults")
        self.server = ModelServer(host=self.network.host_address if self.network
                                  else "127.0.0.1")
        self.receiver.up()
        env = {**FAULT_ENV,
               "AGENTQ_BROKER_URL": self.rabbit.url if self.rabbit else self.redis.url,
               "AGENTQ_RESULT_BACKEND_URL": self.redis.url, **self.extra_env}
        self.stack = BenchStack(self.database_url, self.server.base_url,
                                self.scratch / "stack", env, web_workers=2, web_threads=8,
                                workers=self.host_workers)
        (self.scratch / "stack").mkdir(exist_ok=True)
        try:
            self.stack.start()
            self.key = self.stack.create_key("faults", admin=True)
            for n in range(CODERS):  # code.run_python's permission: `user`
                made = self.stack.agentq("users", "set", "api", f"coder{n}", "--level", "user")
                if made.returncode != 0:
                    raise StackError(made.stderr)
            for _ in range(self.node_count):
                node = self.network.node()
                self.nodes.append(node)
                # listed before it starts: a start that fails is stopped with the others
                self.node_stacks.append(node_stack(node, self.stack.env,
                                                   self.scratch / node.name))
                self.node_stacks[-1].start()
            for node in self.nodes:  # once started: a start under a quota is slow, not less
                node.cpu.limit(self.node_cpus)
        except Exception:  # a half-made lab (a node that did not start) is taken down
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            for node_stack_ in self.node_stacks:
                node_stack_.stop()
            if self.stack is not None:
                self.stack.stop()
            if self.server is not None:
                self.server.stop()
            self.receiver.down()
            self.redis.stop()
            if self.rabbit is not None:
                self.rabbit.destroy()
            self.pg.destroy()
            self.control.shutdown(wait=False)
        finally:
            if self.network is not None:
                self.network.destroy()

    # -- faults -------------------------------------------------------------------------
    def kill9(self, name: str, down_s: float = 0.0) -> None:
        """kill -9 one process (its whole group: a prefork pool's children too), then the
        process manager's restart after `down_s`."""
        proc = self.stack.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        time.sleep(down_s)
        self.stack.spawn(name)

    def _procs(self) -> dict[str, tuple[Stack, str]]:
        """Every process of the lab by name (a node's as `n<i>-<kind>`): its stack and its
        name there."""
        procs = {name: (self.stack, name) for name in self.stack.procs}
        for node, stack in zip(self.nodes, self.node_stacks, strict=True):
            procs.update({f"n{node.index}-{name}": (stack, name) for name in stack.procs})
        return procs

    def alive(self) -> dict[str, bool]:
        return {name: stack.procs[own].poll() is None
                for name, (stack, own) in self._procs().items()}

    def log_tail(self, name: str, chars: int = 3000) -> str:
        stack, own = self._procs()[name]
        return stack.logs[own].read_text(errors="replace")[-chars:]

    # -- measurements -------------------------------------------------------------------
    def _sql(self, query: str) -> list[tuple]:
        import psycopg2
        conn = psycopg2.connect(self.database_url)
        try:
            with conn.cursor() as cur:
                cur.execute(query)
                return cur.fetchall()
        finally:
            conn.close()

    def ddl(self, statement: str) -> None:
        """A schema change, committed, as a migration run beside the processes would."""
        import psycopg2
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()

    def sql(self, query: str, timeout_s: float = 120.0) -> list[tuple]:
        """A query that waits out a Postgres restart."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._sql(query)
            except Exception:  # noqa: BLE001 - the database may be restarting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def statuses(self, job_ids: list[str]) -> dict[str, str]:
        if not job_ids:
            return {}
        ids = ",".join(f"'{j}'" for j in job_ids)
        return {str(i): s for i, s in self.sql(f"SELECT id, status FROM jobs WHERE id IN ({ids})")}

    def duplicates(self, job_ids: list[str]) -> dict[str, int]:
        """What must never exist twice, for the given jobs."""
        ids = ",".join(f"'{j}'" for j in job_ids) or "NULL"
        one = lambda q: int(self.sql(q)[0][0] or 0)  # noqa: E731
        return {
            # the same message stored twice in a job (role + content)
            "messages": one(f"""SELECT COALESCE(SUM(n - 1), 0) FROM (
                SELECT COUNT(*) n FROM messages WHERE job_id IN ({ids})
                GROUP BY job_id, role, content HAVING COUNT(*) > 1) d"""),
            # a tool call recorded twice for one turn, or a call's result written twice
            "tool_results": one(f"""SELECT COALESCE(SUM(n - 1), 0) FROM (
                SELECT COUNT(*) n FROM tool_calls WHERE job_id IN ({ids})
                GROUP BY job_id, iteration, position HAVING COUNT(*) > 1) d"""),
            # an event a job emits once, emitted twice
            "events": one(f"""SELECT COALESCE(SUM(n - 1), 0) FROM (
                SELECT COUNT(*) n FROM job_events WHERE job_id IN ({ids})
                AND type IN ('job_start', 'job_end', 'turn_end', 'tool_execution_end')
                GROUP BY job_id, type, data->>'turn', data->>'tool_use_id'
                HAVING COUNT(*) > 1) d"""),
            "token_logs": one(f"""SELECT COALESCE(SUM(n - 1), 0) FROM (
                SELECT COUNT(*) n FROM token_logs WHERE job_id IN ({ids})
                GROUP BY job_id, iteration HAVING COUNT(*) > 1) d"""),
            # a job's end event made twice (two webhook ids for one job and event type)
            "webhook_events": one(f"""SELECT COALESCE(SUM(n - 1), 0) FROM (
                SELECT COUNT(DISTINCT event_id) n FROM webhook_deliveries
                WHERE job_id IN ({ids}) GROUP BY job_id, event_type
                HAVING COUNT(DISTINCT event_id) > 1) d"""),
        }

    def delivery_retries(self, job_ids: list[str]) -> int:
        """Delivery attempts after a first one that failed."""
        ids = ",".join(f"'{j}'" for j in job_ids) or "NULL"
        return int(self.sql(f"SELECT COUNT(*) FROM webhook_deliveries "
                            f"WHERE job_id IN ({ids}) AND attempt > 1")[0][0])

    def tool_reruns(self, job_ids: list[str]) -> dict[str, int]:
        """Tool calls whose execution was started more than once (`attempts` counts the
        deliveries that began running the tool), split by what the call's
        `tool_execution_start` event said of the tool: idempotent or not."""
        ids = ",".join(f"'{j}'" for j in job_ids) or "NULL"
        row = self.sql(f"""SELECT
              COUNT(*) FILTER (WHERE idempotent),
              COUNT(*) FILTER (WHERE NOT idempotent),
              COALESCE(SUM(attempts - 1) FILTER (WHERE NOT idempotent), 0)
            FROM (SELECT tc.attempts, COALESCE((
                    SELECT bool_and((e.data->>'idempotent')::boolean) FROM job_events e
                    WHERE e.job_id = tc.job_id AND e.type = 'tool_execution_start'
                      AND e.data->>'tool_use_id' = tc.tool_use_id), false) idempotent
                  FROM tool_calls tc WHERE tc.job_id IN ({ids}) AND tc.attempts > 1) r""")[0]
        interrupted = self.sql(f"""SELECT COUNT(*) FROM tool_calls WHERE job_id IN ({ids})
            AND result->'error'->>'code' = 'tool_interrupted'""")[0][0]
        return {"idempotent_calls": int(row[0]), "non_idempotent_calls": int(row[1]),
                "non_idempotent_extra_runs": int(row[2]),
                # not idempotent, its worker died mid-run: answered, not run again
                "non_idempotent_interrupted": int(interrupted)}

    def file_problems(self, job_ids: list[str]) -> dict[str, int]:
        """`files.create_document` writes one file per call: files whose id is not the one
        derived from a recorded call of their job (uuid5 of its tool_use_id; as ids are
        unique, none such means at most one file per call), and files beyond one per job
        (each job makes one call)."""
        from tool_workers.files import FILE_ID_NAMESPACE
        ids = ",".join(f"'{j}'" for j in job_ids) or "NULL"
        calls = self.sql(f"SELECT job_id, tool_use_id FROM tool_calls WHERE job_id IN ({ids}) "
                         "AND name = 'files.create_document'")
        files = self.sql(f"SELECT job_id, id FROM files WHERE job_id IN ({ids})")
        expected = {(str(j), str(uuid.uuid5(FILE_ID_NAMESPACE, t))) for j, t in calls}
        per_job: dict[str, int] = {}
        for job_id, _ in files:
            per_job[str(job_id)] = per_job.get(str(job_id), 0) + 1
        return {"files_without_their_call": sum(1 for j, f in files
                                                if (str(j), str(f)) not in expected),
                "files_per_job_beyond_one": sum(n - 1 for n in per_job.values())}

    def tool_calls(self, job_ids: list[str]) -> dict[str, dict[str, int]]:
        ids = ",".join(f"'{j}'" for j in job_ids) or "NULL"
        out: dict[str, dict[str, int]] = {}
        for name, status, n in self.sql(f"SELECT name, status, COUNT(*) FROM tool_calls "
                                        f"WHERE job_id IN ({ids}) GROUP BY 1, 2"):
            out.setdefault(name, {})[status] = int(n)
        return out

    def files_made(self, job_ids: list[str]) -> int:
        ids = ",".join(f"'{j}'" for j in job_ids) or "NULL"
        return int(self.sql(f"SELECT COUNT(*) FROM files WHERE job_id IN ({ids})")[0][0])

    def provider_waits(self, job_ids: list[str]) -> int:
        ids = ",".join(f"'{j}'" for j in job_ids) or "NULL"
        return int(self.sql(f"SELECT COUNT(DISTINCT job_id) FROM job_events WHERE job_id IN "
                            f"({ids}) AND type = 'waiting_provider'")[0][0])

    def storm(self, seconds: float | None, share: float = 0.8, hang_s: float = 10.0,
              retry_after_s: float = 2.0) -> dict:
        """Start a provider storm on the model server (None: end it)."""
        spec = None if seconds is None else {"seconds": seconds, "share": share,
                                             "hang_s": hang_s, "retry_after_s": retry_after_s}
        r = self.server.http.post(f"{self.server.root}/config", json={"storm": spec},
                                  timeout=10)
        r.raise_for_status()
        return r.json()


class Submitter:
    """POST /v1/messages at a steady rate, each request retried (same Idempotency-Key) on
    503 or a cut connection until it is answered 202."""

    def __init__(self, base: str, key: str, callback_url: str | None = None,
                 threads: int = 16,
                 content: Callable[[int], tuple[str, str]] = job_content):
        self.base, self.key, self.callback_url = base, key, callback_url
        self.content = content
        self.pool = ThreadPoolExecutor(max_workers=threads)
        self.local = threading.local()
        self.lock = threading.Lock()
        self.api: dict[str, int] = {}
        self.job_ids: list[str] = []
        self.lost = 0

    def _count(self, code: str) -> None:
        with self.lock:
            self.api[code] = self.api.get(code, 0) + 1

    def _http(self) -> requests.Session:
        if not hasattr(self.local, "s"):
            self.local.s = requests.Session()
            self.local.s.headers["Authorization"] = f"Bearer {self.key}"
        return self.local.s

    def _one(self, n: int) -> None:
        key = uuid.uuid4().hex
        user, content = self.content(n)
        body = {"platform": "api", "platform_user_id": user,
                "platform_channel_id": f"c-{key}", "content": content}
        if self.callback_url:
            body["callback_url"] = self.callback_url
        deadline = time.monotonic() + SUBMIT_GIVE_UP_S
        while time.monotonic() < deadline:
            try:
                r = self._http().post(f"{self.base}/v1/messages", json=body, timeout=30,
                                      headers={"Idempotency-Key": key})
            except requests.RequestException:
                self._count("conn_error")
                self.local.__dict__.pop("s", None)
                time.sleep(0.5)
                continue
            self._count(str(r.status_code))
            if r.status_code in (200, 202):
                with self.lock:
                    self.job_ids.append(r.json()["id"])
                return
            if (r.status_code, _error_code(r)) in RETRIED:
                time.sleep(min(float(r.headers.get("Retry-After", "1")), 5.0))
                continue
            break  # a 500 or another 4xx: not retried, counted
        with self.lock:
            self.lost += 1

    def run(self, n: int, rate: float, at: Callable[[int], None] | None = None) -> None:
        futures = []
        t0 = time.monotonic()
        for i in range(n):
            if at is not None:
                at(i)
            futures.append(self.pool.submit(self._one, i))
            pause = t0 + (i + 1) / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        for f in futures:
            f.result()
        self.pool.shutdown()


def _error_code(r: requests.Response) -> str | None:
    """The API's error code of an answer, None when it is not the API's error shape."""
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def run_scenario(lab: FaultLab, name: str, fault: Callable[[FaultLab], None] | None,
                 jobs: int, rate: float, drain_timeout_s: float = 600.0) -> Outcome:
    """Submit `jobs` at `rate`, inject `fault` 40% of the way in (in a thread, so the
    submissions continue through it), wait until every job has ended."""
    outcome = Outcome(name, jobs)
    sub = Submitter(lab.stack.base, lab.key, lab.receiver.url)
    fault_done = threading.Event()
    fault_box: dict[str, float] = {}

    def inject() -> None:
        f0 = time.monotonic()
        try:
            fault(lab)
        finally:
            fault_box["s"] = round(time.monotonic() - f0, 2)
            fault_done.set()

    def at(i: int) -> None:
        if fault is not None and i == int(jobs * 0.4):
            lab.control.submit(inject)

    lab.server.reset()
    t0 = time.monotonic()
    sub.run(jobs, rate, at)
    if fault is not None:
        fault_done.wait(drain_timeout_s)
    t_submitted = time.monotonic()
    deadline = t_submitted + drain_timeout_s
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        statuses = lab.statuses(sub.job_ids)
        if all(s in ("completed", "failed", "cancelled") for s in statuses.values()) \
                and not lab.receiver.not_delivered(sub.job_ids):
            break
        time.sleep(1.0)
    outcome.drain_s = round(time.monotonic() - t_submitted, 1)
    outcome.total_s = round(time.monotonic() - t0, 1)
    outcome.fault_s = fault_box.get("s")
    counts: dict[str, int] = {}
    for s in statuses.values():
        counts[s] = counts.get(s, 0) + 1
    outcome.statuses = counts
    outcome.api = dict(sub.api)
    outcome.not_submitted = sub.lost + (jobs - sub.lost - len(sub.job_ids))
    outcome.duplicates = lab.duplicates(sub.job_ids)
    outcome.tool_reruns = lab.tool_reruns(sub.job_ids)
    # a side-effecting (non-idempotent) tool executed twice is a duplicate; an idempotent
    # tool run again (at-least-once delivery) is reported only
    outcome.duplicates["non_idempotent_tool_runs"] = \
        outcome.tool_reruns["non_idempotent_extra_runs"]
    outcome.duplicates.update(lab.file_problems(sub.job_ids))
    outcome.files_made = lab.files_made(sub.job_ids)
    outcome.tool_calls = lab.tool_calls(sub.job_ids)
    outcome.provider_waits = lab.provider_waits(sub.job_ids)
    outcome.model_calls = lab.server.stats()["calls"]
    failed = [j for j, s in statuses.items() if s == "failed"]
    if failed:
        ids = ",".join(f"'{j}'" for j in failed)
        reasons = lab.sql(f"SELECT response->'error'->>'code', COUNT(*) FROM jobs "
                          f"WHERE id IN ({ids}) GROUP BY 1")
        outcome.notes.append("failed by error code: "
                             + ", ".join(f"{code}: {n}" for code, n in reasons))
    outcome.webhooks = {**lab.receiver.report(sub.job_ids),
                        "retried_attempts": lab.delivery_retries(sub.job_ids)}
    dead = [n for n, up in lab.alive().items() if not up]
    if dead:
        outcome.notes.append(f"processes dead at the end: {dead}")
    return outcome


# --- the faults -------------------------------------------------------------------------

def kill9(name: str, down_s: float = 2.0) -> Callable[[FaultLab], None]:
    return lambda lab: lab.kill9(name, down_s)


def redis_restart(lab: FaultLab) -> None:
    lab.redis.restart(down_s=2.0)


def rabbitmq_restart(lab: FaultLab) -> None:
    """The RabbitMQ node killed (SIGKILL) and started again on the same data after 2 s
    (a lab started with broker="amqp")."""
    if lab.rabbit is None:
        raise ValueError("rabbitmq_restart needs a lab on RabbitMQ (--broker amqp)")
    lab.rabbit.restart(down_s=2.0)


def redis_flushall(lab: FaultLab) -> None:
    lab.redis.flushall()


def postgres_restart(lab: FaultLab) -> None:
    lab.pg.restart(down_s=3.0)


def migration_mid_run(lab: FaultLab) -> None:
    """A migration while jobs flow: the type of a column every job read returns changes, and
    changes back. Each statement the processes had prepared that answers it can no longer
    run as prepared ("cached plan must not change result type", agentq.prepared)."""
    lab.ddl("ALTER TABLE jobs ALTER COLUMN custom_id TYPE text")
    time.sleep(2.0)
    lab.ddl("ALTER TABLE jobs ALTER COLUMN custom_id TYPE varchar(255)")


def orchestrator_down(seconds: float) -> Callable[[FaultLab], None]:
    return lambda lab: lab.kill9("orchestrator", seconds)


def provider_storm(seconds: float, share: float = 0.8) -> Callable[[FaultLab], None]:
    """The model provider in a storm for `seconds`: a share of the calls answer 429 with
    `Retry-After`, 429 without, 500, or hang 10 s (past the lab's 4 s call timeout), in
    turn; the jobs must wait for the provider (`waiting_for: provider`) and resume."""
    def fault(lab: FaultLab) -> None:
        lab.storm(seconds, share)
        try:
            time.sleep(seconds)
        finally:
            lab.storm(None)
    return fault


def webhook_receiver_down(seconds: float) -> Callable[[FaultLab], None]:
    """The jobs' webhook receiver refuses connections for `seconds`, then is back."""
    def fault(lab: FaultLab) -> None:
        lab.receiver.down()
        time.sleep(seconds)
        lab.receiver.up()
    return fault


def node_cut(seconds: float) -> Callable[[FaultLab], None]:
    """The lab's first node (an orchestrator and a tools worker in a network namespace of
    their own: FaultLab(nodes=1)) cut off from Postgres, the broker and the model server
    for `seconds`, its link down at the host's end, then back: its connections are not
    closed, they wait, as across a partition. Meanwhile the sweeper re-drives what it held
    to the host's orchestrator; back, the node finds its steps taken over."""
    def fault(lab: FaultLab) -> None:
        if not lab.nodes:
            raise ValueError("node_cut needs a lab with a node (FaultLab(nodes=1))")
        node = lab.nodes[0]
        node.cut()
        try:
            time.sleep(seconds)
        finally:
            node.restore()
    return fault


SCENARIOS: dict[str, Callable[[FaultLab], None] | None] = {
    "none": None,
    "orchestrator_kill9": kill9("orchestrator"),
    "tools_kill9": kill9("tools"),
    "tools_slow_kill9": kill9("tools-slow"),
    "webhooks_kill9": kill9("webhooks"),
    "web_kill9": kill9("web"),
    "beat_kill9": kill9("beat"),
    "redis_restart": redis_restart,
    "redis_flushall": redis_flushall,
    "rabbitmq_restart": rabbitmq_restart,
    "postgres_restart": postgres_restart,
    "migration_mid_run": migration_mid_run,
    "webhook_receiver_down": webhook_receiver_down(
        float(os.environ.get("AGENTQ_FAULT_WEBHOOK_DOWN_S", "20"))),
    "provider_storm": provider_storm(STORM_S),
}
PARAMETRIC = {"orchestrator_down_": orchestrator_down, "node_cut_": node_cut,
              "webhook_receiver_down_": webhook_receiver_down,
              "provider_storm_": provider_storm}
"""Scenarios named with their length: orchestrator_down_600, webhook_receiver_down_600s,
provider_storm_300s, node_cut_60s (a lab with a node in a network namespace: root)."""


def scenario(name: str) -> Callable[[FaultLab], None] | None:
    """The fault a scenario name stands for; ValueError for a name that is none."""
    if name in SCENARIOS:
        return SCENARIOS[name]
    for prefix, make in PARAMETRIC.items():
        if name.startswith(prefix):
            try:
                seconds = float(name[len(prefix):].rstrip("s"))
            except ValueError:
                break
            if seconds > 0:
                return make(seconds)
    raise ValueError(
        f"unknown fault scenario {name!r}; known: {', '.join(SCENARIOS)}, or "
        + ", ".join(f"{p}<seconds>" for p in PARAMETRIC))


def main(args) -> int:
    import sys
    import tempfile
    broker = getattr(args, "broker", "redis")
    names = args.only or [n for n in SCENARIOS
                          if broker == "amqp" or n != "rabbitmq_restart"]
    try:
        faults = {name: scenario(name) for name in names}
    except ValueError as exc:
        print(f"python -m benchmarks faults: {exc}", file=sys.stderr)
        return 2
    results = []
    scratch = Path(tempfile.mkdtemp(prefix="agentq-faults-"))
    nodes = 1 if any(name.startswith("node_cut_") for name in names) else 0
    lab = FaultLab(scratch, broker=broker, nodes=nodes).start()
    try:
        for name, fault in faults.items():
            out = run_scenario(lab, name, fault, args.jobs, args.rate)
            results.append(out.as_dict())
            print(json.dumps(out.as_dict()), flush=True)
    finally:
        lab.stop()
    if args.results:
        Path(args.results).write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1
