"""Starting the Procfile's processes on loopback against a fresh Postgres database and a
Redis broker: used by the integration tests and the benchmarks."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import requests

if TYPE_CHECKING:
    from agentq.config import Settings

ROOT = Path(__file__).resolve().parents[2]
SHARED_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
READY_TIMEOUT_S = 180
"""How long a stack may take to start. Reached only when a process never says it is ready
(one that exits is reported at once): at load average 40 (two busy loops and a second suite)
a stack took over 60 s to start and the tests using it errored (issue 32)."""
WORKERS = ("orchestrator", "tools", "tools-slow", "webhooks")


class StackError(RuntimeError):
    pass


def pg_admin_url() -> str:
    """The Postgres the tests and benchmarks create their databases in: AGENTQ_TEST_PG (in a
    test session, the session's private cluster: tests/support/suite_servers.py), else the
    machine's (the benchmarks' default)."""
    return os.environ.get("AGENTQ_TEST_PG", SHARED_PG_ADMIN_URL)


def worker_redis_url() -> str:
    """The Redis database this test process's stacks use: AGENTQ_TEST_REDIS (in a test
    session, database 9 of the session's private Redis: tests/support/suite_servers.py; else
    the machine's, database 9); under pytest-xdist each further worker takes the database two
    below the previous one's (gw0 9, gw1 7, ...), since a stack flushes its database when it
    starts."""
    url = os.environ.get("AGENTQ_TEST_REDIS", "redis://127.0.0.1:6379/9")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker.removeprefix("gw") or 0)
    if n == 0:
        return url
    base, _, db = url.rpartition("/")
    number = int(db or 0) - 2 * n
    if number < 0:
        raise StackError(f"no Redis database left for pytest-xdist worker {worker} below {url}")
    return f"{base}/{number}"


RABBITMQ_URL = os.environ.get("AGENTQ_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")
"""The RabbitMQ the tests' amqp stacks use (no vhost: each test process makes its own)."""
_VHOST_PREFIX = "agentq-test-"
_vhosts: set[str] = set()


def test_broker() -> str:
    """The broker the tests' stacks run on: AGENTQ_TEST_BROKER, `redis` (the default) or
    `amqp` (RabbitMQ, in a virtual host of this test process's own: `rabbitmq_vhost`)."""
    kind = os.environ.get("AGENTQ_TEST_BROKER", "redis").strip().lower() or "redis"
    if kind not in ("redis", "amqp"):
        raise StackError(f"AGENTQ_TEST_BROKER: expected redis or amqp, got {kind!r}")
    return kind


def rabbitmqctl(*args: str) -> subprocess.CompletedProcess:
    import shutil
    command = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    result = subprocess.run([command, "-q", *args], capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        raise StackError(f"rabbitmqctl {' '.join(args)}: {result.stdout}{result.stderr}")
    return result


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rabbitmq_vhost(suffix: str = "") -> str:
    """This test process's own virtual host on the machine's RabbitMQ, made on first use
    (`rabbitmqctl add_vhost`, guest allowed everything in it) and deleted when the process
    exits, with every queue in it: the tests never declare, purge or delete anything in the
    shared default vhost. Vhosts left by test processes that are gone (killed) are deleted
    first. `suffix`: another vhost of this process (a second stack's)."""
    name = f"{_VHOST_PREFIX}{os.getpid()}" + (f"-{suffix}" if suffix else "")
    if name not in _vhosts:
        import atexit
        listed = rabbitmqctl("list_vhosts", "name").stdout.split()
        for other in listed:
            pid = other.removeprefix(_VHOST_PREFIX).partition("-")[0]
            if other.startswith(_VHOST_PREFIX) and pid.isdigit() and not _pid_alive(int(pid)):
                rabbitmqctl("delete_vhost", other)
        if name in listed:
            rabbitmqctl("delete_vhost", name)
        rabbitmqctl("add_vhost", name)
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        atexit.register(_delete_vhost, name)
        _vhosts.add(name)
    return name


def _delete_vhost(name: str) -> None:
    try:
        rabbitmqctl("delete_vhost", name)
    except (StackError, OSError, subprocess.TimeoutExpired):
        pass


def broker_env() -> dict[str, str]:
    """The broker settings of this test process's stacks (AGENTQ_TEST_BROKER): its Redis
    database; or, on RabbitMQ, its own vhost as the broker and that Redis database as the
    result backend (the pairing docs/deploying.md recommends)."""
    if test_broker() == "amqp":
        return {"AGENTQ_BROKER_URL": f"{RABBITMQ_URL}/{rabbitmq_vhost()}",
                "AGENTQ_RESULT_BACKEND_URL": worker_redis_url()}
    return {"AGENTQ_BROKER_URL": worker_redis_url()}


def queue_depth(broker_url: str, queue: str) -> int:
    """How many messages wait in `queue` (not those delivered and unacknowledged), on
    either broker; 0 for a queue that does not exist."""
    from kombu import Connection
    with Connection(broker_url) as conn:
        channel = conn.channel()
        try:
            return channel.queue_declare(queue, passive=True).message_count
        except conn.channel_errors:  # not declared yet
            return 0
        finally:
            try:
                channel.close()
            except conn.connection_errors + conn.channel_errors:
                pass


def purge_queues(broker_url: str, queues) -> None:
    """Drop the waiting messages of these queues (those that exist), on either broker."""
    from kombu import Connection
    with Connection(broker_url) as conn:
        for queue in queues:
            channel = conn.channel()
            try:
                channel.queue_purge(queue)
            except conn.channel_errors:  # not declared: nothing in it
                pass
            finally:
                try:
                    channel.close()
                except conn.connection_errors + conn.channel_errors:
                    pass


def redis_db(number: int) -> str:
    """Database `number` of the Redis server the tests use (AGENTQ_TEST_REDIS's)."""
    return f"{worker_redis_url().rpartition('/')[0]}/{number}"


def __getattr__(name: str) -> str:
    """PG_ADMIN_URL and REDIS_URL, read when asked for: a test session sets the variables
    they come from before its conftests import this module, but after the plugin that
    starts the session's servers (which imports it) did."""
    if name == "PG_ADMIN_URL":
        return pg_admin_url()
    if name == "REDIS_URL":
        return worker_redis_url()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _libc():
    import ctypes
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None  # not Linux: the stop() in a finally block is all there is


_LIBC = _libc()
"""Loaded here, in the parent: a child that changed its user cannot always load it."""


def die_with_parent() -> None:
    """In a child before exec: receive SIGTERM when the process that started it dies, so a
    killed test run or benchmark leaves no workers behind consuming its Redis database."""
    PR_SET_PDEATHSIG = 1
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_empty_database(name: str, template: str | None = None) -> str:
    """A fresh database (dropped first if it exists), empty or a copy of the database
    `template`; returns its libpq URL."""
    import psycopg2
    admin = psycopg2.connect(pg_admin_url())
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{name}"'
                        + (f' TEMPLATE "{template}"' if template else ''))
    finally:
        admin.close()
    return pg_admin_url().rsplit("/", 1)[0] + "/" + name


def create_database(name: str) -> str:
    """A fresh database, migrated by Alembic; returns its URL in the plain `postgresql://`
    form a user writes (agentq.config resolves it to the driver agentq installs)."""
    url = create_empty_database(name)
    from agentq import migrate
    from agentq.config import Settings
    try:
        migrate.upgrade(Settings.from_env({"AGENTQ_DATABASE_URL": url}))
    except BaseException:  # a failed set-up leaves no database behind
        drop_database(name)
        raise
    return url


def drop_database(name: str) -> None:
    import psycopg2

    from agentq.db import dispose_engines
    dispose_engines()
    admin = psycopg2.connect(pg_admin_url())
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.close()


@contextlib.contextmanager
def scratch_database(name: str, migrated: bool = True) -> Iterator["Settings"]:
    """A database of the block's own (`create_database`, or empty with `migrated=False`),
    as the settings that name it; dropped after the block, whatever it raised."""
    from agentq.config import Settings
    url = create_database(name) if migrated else create_empty_database(name)
    try:
        yield Settings.from_env({"AGENTQ_DATABASE_URL": url})
    finally:
        drop_database(name)


def flush_redis(url: str | None = None) -> None:
    import redis
    client = redis.Redis.from_url(url or worker_redis_url())
    try:
        client.flushdb()
    finally:
        client.close()


class Stack:
    """The processes of one deployment: web, workers per queue kind, beat."""

    def __init__(self, database_url: str, llm_base_url: str, scratch: Path,
                 extra_env: dict[str, str] | None = None, workers=WORKERS,
                 web_threads: int = 16, beat: bool = True, web: bool = True):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url
        self.scratch = Path(scratch)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTQ_", "OPENAI_",
                                                                      "PROMETHEUS_"))}
        env.update({
            "AGENTQ_DATABASE_URL": database_url,
            # a stack given a broker of its own (a private Redis) keeps its own pairing
            **({} if "AGENTQ_BROKER_URL" in (extra_env or {}) else broker_env()),
            "AGENTQ_HOME": str(self.scratch), "AGENTQ_TEST_SCRATCH": str(self.scratch),
            "OPENAI_BASE_URL": llm_base_url, "OPENAI_API_KEY": "sk-test",
            "AGENTQ_PUBLIC_URL": self.base, "PORT": str(self.port),
            "AGENTQ_LOG_LEVEL": "INFO", "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore",
        })
        if os.environ.get("AGENTQ_TEST_COVERAGE_WORKERS") == "1":
            # coverage starts in each of the stack's processes (coverage's own .pth file
            # reads this), saving .coverage.<host>.<pid>.* in ROOT for `coverage combine`
            env["COVERAGE_PROCESS_START"] = str(ROOT / "setup.cfg")
        env.update(extra_env or {})
        self.env = env
        self.workers = tuple(workers)
        self.web_threads = web_threads
        self.with_beat = beat
        self.with_web = web
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def agentq_bin(self) -> str:
        return str(Path(sys.executable).with_name("agentq"))

    def web_command(self) -> list[str]:
        return [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{self.port}",
                "--workers", "1", "--threads", str(self.web_threads), "api.wsgi:app"]

    def commands(self) -> dict[str, list[str]]:
        commands = {"web": self.web_command()} if self.with_web else {}
        for kind in self.workers:
            commands[kind] = [self.agentq_bin(), "worker", kind]
        if self.with_beat:
            commands["beat"] = [self.agentq_bin(), "beat"]
        return commands

    def spawn(self, name: str) -> subprocess.Popen:
        """Start (or start again) one process; its log is appended to."""
        self.logs[name] = self.scratch / f"{name}.log"
        with self.logs[name].open("ab") as out:
            self.procs[name] = subprocess.Popen(self.commands()[name], cwd=ROOT, env=self.env,
                                                stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True,
                                                preexec_fn=self.preexec)
        return self.procs[name]

    def preexec(self) -> None:
        """Run in each process between fork and exec (a node's stack also enters its
        network namespace and cgroup: benchmarks/netns.py)."""
        die_with_parent()

    def start(self) -> "Stack":
        broker = self.env["AGENTQ_BROKER_URL"]
        if broker.startswith("amqp://"):  # what an earlier stack of this process left
            purge_queues(broker, ("orchestrator", "maintenance", "webhooks"))
        for name in self.commands():
            self.spawn(name)
        self._wait_ready()
        return self

    ready_timeout_s = READY_TIMEOUT_S
    """How long start() waits for every process to say it is ready."""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        pending = set(self.workers) | ({"beat"} if self.with_beat else set())
        while pending and time.monotonic() < deadline:
            pending = {n for n in pending if b" ready." not in self.logs[n].read_bytes()}
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise StackError(f"{name} exited: {self.logs[name].read_text()[-3000:]}")
            time.sleep(0.2)
        while self.with_web and time.monotonic() < deadline:
            try:
                if requests.get(f"{self.base}/health", timeout=1).ok:
                    break
            except (requests.ConnectionError, requests.Timeout):  # a worker still booting
                time.sleep(0.2)
        else:
            if self.with_web:
                raise StackError("the web process did not answer")
        if pending:
            raise StackError(f"not ready: {sorted(pending)}")

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def settings(self):
        from agentq.config import Settings
        return Settings.from_env(self.env)

    def sessions(self):
        from agentq.db import session_factory
        return session_factory(self.settings())

    def agentq(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.agentq_bin(), *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=60)

    def create_key(self, name: str = "key", admin: bool = True,
                   tenant: str | None = None) -> str:
        """A new key, made as `agentq keys create` makes it (the same functions, in this
        process: a CLI process a key cost 1-8 s; tests/integration/test_cli_admin.py runs
        the command itself): an admin key without a tenant is an operator, with one that
        tenant's admin."""
        from agentq.db import session_scope
        from agentq.keys import create_key
        from agentq.tenants import find_tenant
        with session_scope(self.settings()) as session:
            _row, key = create_key(session, name, admin, find_tenant(session, tenant).id,
                                   operator=admin and tenant is None)
        return key

    def create_tenant(self, name: str) -> str:
        """A new tenant, made as `agentq tenants create` makes it; returns its id."""
        from agentq.db import session_scope
        from agentq.tenants import create_tenant, tenant_object
        with session_scope(self.settings()) as session:
            return tenant_object(create_tenant(session, name))["id"]


@contextlib.contextmanager
def own_stack(name: str, llm_base_url: str, scratch: Path, env: dict[str, str],
              workers=("orchestrator", "tools"), pythonpath: Path | None = None,
              beat: bool = False, database_via: Callable[[str], str] | None = None,
              broker_url: str | None = None):
    """A stack of its own: its own Redis server on a free port (so its queues are nobody
    else's), its own database, the given settings; stopped and dropped after.
    `database_via`: the URL its processes reach that database by (through a pooler, say),
    from the database's own URL. `broker_url`: a broker the test runs itself (a server it
    stops, a RabbitMQ vhost) instead of that Redis."""
    import shutil
    redis = None
    if broker_url is None:
        redis_port = free_port()
        redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port",
                                  str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no"], stdout=subprocess.DEVNULL,
                                 preexec_fn=die_with_parent)
        broker_url = f"redis://127.0.0.1:{redis_port}/0"
    database_name = f"agentq_{name}_{os.getpid()}"
    stack = None
    try:
        database = create_database(database_name)
        stack = Stack(database_via(database) if database_via else database, llm_base_url,
                      scratch, {**env, "AGENTQ_BROKER_URL": broker_url},
                      workers=workers, beat=beat)
        if pythonpath is not None:
            stack.env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{pythonpath}"
        stack.start()
        yield stack
    finally:  # a failed set-up too: nothing left running, no database left behind
        if stack is not None:
            stack.stop()
        if redis is not None:
            redis.terminate()
            redis.wait(timeout=30)
        drop_database(database_name)
