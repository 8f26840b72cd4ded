"""Private Redis, RabbitMQ and Postgres servers on free loopback ports, in a scratch directory, so a
fault test can restart, flush or stop them without touching any shared server.

    redis = PrivateRedis(tmp).start();  redis.restart();  redis.flushall();  redis.stop()
    rabbit = PrivateRabbitMQ(tmp).start();  rabbit.restart(down_s=2);  rabbit.destroy()
    pg = PrivatePostgres(tmp).start();  pg.create_database("x");  pg.restart();  pg.stop()

`listen_also`: an address each also listens on beside 127.0.0.1 (the host's end of the
nodes' network, benchmarks/netns.py), with, for Postgres, `clients` the network let in.

Postgres refuses to run as root: when the tests run as root, its binaries run as the
`postgres` user (runuser) on a data directory that user owns.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.stack import StackError, answers, free_port


def _pg_bin() -> Path:
    """AGENTQ_PG_BIN, else the newest /usr/lib/postgresql/<version>/bin with initdb (Debian's
    `postgresql` package: 15 on bookworm, 17 on trixie)."""
    if os.environ.get("AGENTQ_PG_BIN"):
        return Path(os.environ["AGENTQ_PG_BIN"])
    found = sorted((p for p in Path("/usr/lib/postgresql").glob("*/bin")
                    if (p / "initdb").exists() and p.parent.name.isdigit()),
                   key=lambda p: int(p.parent.name))
    return found[-1] if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()
START_TIMEOUT_S = 60


def terminate(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout_s`; waited for."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_port(port: int, up: bool, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if answers("127.0.0.1", port) == up:
            return
        time.sleep(0.1)
    raise StackError(f"port {port} did not go {'up' if up else 'down'} in {timeout_s} s")


class PrivateRedis:
    def __init__(self, scratch: Path, port: int | None = None, databases: int = 16,
                 listen_also: str = ""):
        self.dir = Path(scratch) / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.databases = databases
        self.listen_also = listen_also
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "PrivateRedis":
        from tests.support.stack import die_with_parent
        with (self.dir / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [shutil.which("redis-server") or "redis-server", "--port", str(self.port),
                 "--bind", "127.0.0.1",
                 # another address: clients there are let in (protected mode would
                 # refuse every one but loopback's, a password not being set)
                 *([self.listen_also, "--protected-mode", "no"] if self.listen_also else []),
                 "--save", "", "--appendonly", "no",
                 "--dir", str(self.dir), "--maxclients", "10000",
                 "--databases", str(self.databases)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent)
        _wait_port(self.port, True)
        return self

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, its data with it (no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _wait_port(self.port, False)

    def stop(self) -> None:
        terminate(self.proc)

    def restart(self, down_s: float = 0.0) -> None:
        """A restart on the same port: every client connection is cut, every key lost."""
        self.kill()
        time.sleep(down_s)
        self.start()

    def flushall(self) -> None:
        import redis
        client = redis.Redis(port=self.port)
        try:
            client.flushall()
        finally:
            client.close()


RABBITMQ_SERVER = os.environ.get("AGENTQ_RABBITMQ_SERVER",
                                 "/usr/lib/rabbitmq/bin/rabbitmq-server")
"""The server's own start script (Debian's /usr/sbin/rabbitmq-server is a wrapper that
switches to the `rabbitmq` user and drops the environment this class sets)."""


class PrivateRabbitMQ:
    """A RabbitMQ node of its own: its own node name, AMQP and distribution ports, Erlang
    cookie (HOME), configuration, data and logs in a scratch directory, no plugins; it
    shares only the machine's epmd (a name registry). `restart()` kills it (SIGKILL, the
    whole process group) and starts it again on the same ports with the same data: durable
    queues and their messages come back, connections do not.

        rabbit = PrivateRabbitMQ(tmp).start();  rabbit.restart(down_s=2);  rabbit.destroy()
    """

    def __init__(self, scratch: Path, port: int | None = None, listen_also: str = ""):
        self.dir = Path(scratch) / "rabbitmq"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.dist_port = free_port()
        self.listen_also = listen_also
        self.node = f"agentq{self.port}@localhost"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            + (f"listeners.tcp.also = {self.listen_also}:{self.port}\n"
               if self.listen_also else "")
            + "loopback_users = none\n"
            "disk_free_limit.absolute = 50MB\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(self.dir), "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.dir / "plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"), "ERL_EPMD_ADDRESS": "127.0.0.1"})
        return env

    def start(self) -> "PrivateRabbitMQ":
        from tests.support.stack import die_with_parent
        if not os.access(RABBITMQ_SERVER, os.X_OK):
            raise StackError(f"no RabbitMQ server at {RABBITMQ_SERVER} (apt-get install -y "
                             f"rabbitmq-server, or set AGENTQ_RABBITMQ_SERVER)")
        with (self.dir / "server.log").open("ab") as log:
            self.proc = subprocess.Popen([RABBITMQ_SERVER], env=self._env(), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=die_with_parent)
        try:
            _wait_port(self.port, True, timeout_s=90)
        except StackError:
            self.kill()
            raise StackError(f"RabbitMQ did not start: "
                             f"{(self.dir / 'server.log').read_text()[-1500:]}") from None
        return self

    def kill(self) -> None:
        """SIGKILL to the node's process group: gone at once, as in a crash."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        _wait_port(self.port, False)

    def restart(self, down_s: float = 0.0) -> None:
        """Killed, down `down_s`, started on the same ports."""
        self.kill()
        time.sleep(down_s)
        self.start()

    def ctl(self, *args: str) -> str:
        """rabbitmqctl against this node (its own cookie, in its HOME); its output."""
        ctl = str(Path(RABBITMQ_SERVER).with_name("rabbitmqctl"))
        result = subprocess.run([ctl, "-q", "-n", self.node, *args], env=self._env(),
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise StackError(f"rabbitmqctl {' '.join(args)}: {result.stdout}{result.stderr}")
        return result.stdout

    def queues(self) -> list[dict]:
        """The node's queues as RabbitMQ lists them: name, type, durable, messages."""
        lines = self.ctl("list_queues", "--no-table-headers", "name", "type", "durable",
                         "messages").splitlines()
        rows = [line.split("\t") for line in lines if line.strip()]
        return [{"name": r[0], "type": r[1], "durable": r[2] == "true",
                 "messages": int(r[3]) if r[3].isdigit() else None} for r in rows]

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivatePostgres:
    def __init__(self, scratch: Path, port: int | None = None, listen_also: str = "",
                 clients: str = ""):
        self.dir = Path(scratch) / "pg"
        self.data = self.dir / "data"
        self.port = port or free_port()
        self.as_root = os.geteuid() == 0
        self.listen_also, self.clients = listen_also, clients

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(a) for a in args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise StackError(f"{args[0]} failed: {result.stdout}{result.stderr}")
        return result

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def start(self) -> "PrivatePostgres":
        if not self.data.exists():
            self._init_data()
        self._run(PG_BIN / "pg_ctl", "-D", self.data, "-l", self.dir / "pg.log", "-w",
                  "-t", str(START_TIMEOUT_S), "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses="
                  f"127.0.0.1{',' + self.listen_also if self.listen_also else ''} "
                  "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                  "-c max_connections=400", "start")
        _wait_port(self.port, True)
        return self

    def _init_data(self) -> None:
        """initdb, in a directory the server's user owns (as root: `postgres`)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
            os.chmod(self.dir, 0o700)
            # runuser needs to reach the directory through its parents
            for parent in self.dir.parents:
                if parent == Path("/"):
                    break
                mode = os.stat(parent).st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
        self._run(PG_BIN / "initdb", "-D", self.data, "-U", "postgres",
                  "--auth=trust", "--no-sync", "-E", "UTF8")
        if self.clients:
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.clients} trust\n")

    def stop(self, mode: str = "fast") -> None:
        if self.data.exists():
            self._run(PG_BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop",
                      check=False)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop (fast: every session cut) and start again on the same port."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def create_database(self, name: str) -> str:
        """A fresh database migrated by Alembic; its SQLAlchemy URL."""
        import psycopg2
        admin = psycopg2.connect(self.admin_url)
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            admin.close()
        from agentq import migrate
        from agentq.config import Settings
        migrate.upgrade(Settings.from_env({"AGENTQ_DATABASE_URL": self.url(name)}))
        return self.url(name)

    def destroy(self) -> None:
        self.stop(mode="immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class SuitePostgres(PrivatePostgres):
    """The test session's own cluster (tests/support/suite_servers.py): `postgres` run in the
    foreground as a child of the session's first process, which it does not outlive (a
    killed test run leaves no server behind); room for every stack the suite starts at once
    (the shared server's 100 connections were not: `sorry, too many clients already`)."""

    MAX_CONNECTIONS = 1000
    DURABILITY = ("-c", "fsync=off", "-c", "full_page_writes=off")
    """What a crash may lose here (a test's cluster is thrown away); () for a server that
    flushes as the machine's does (benchmarks.harness.LabPostgres)."""

    def __init__(self, scratch: Path, port: int | None = None):
        super().__init__(scratch, port)
        self.proc: subprocess.Popen | None = None

    def start(self) -> "SuitePostgres":
        if not (PG_BIN / "postgres").exists():
            raise StackError(f"no PostgreSQL server binaries in {PG_BIN} (apt-get install -y "
                             f"postgresql, or set AGENTQ_PG_BIN)")
        if not self.data.exists():
            super()._init_data()
        from tests.support.stack import die_with_parent
        # as root, the server runs as `postgres`: Popen changes the user before it calls
        # die_with_parent (a change of user after it would clear the death signal)
        as_user = ({"user": "postgres", "group": "postgres", "extra_groups": []}
                   if self.as_root else {})
        with (self.dir / "pg.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 # synchronous_commit stays on, as on a real server: agentq's relaxed units
                 # of work turn it off themselves (tests/unit/test_prepared.py reads it);
                 # with fsync off a flush costs nothing here anyway
                 "-k", str(self.dir), "-c", "listen_addresses=127.0.0.1", *self.DURABILITY,
                 "-c", f"max_connections={self.MAX_CONNECTIONS}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent, **as_user)
        try:
            _wait_port(self.port, True)
        except StackError:
            self.stop()
            raise StackError(f"PostgreSQL did not start: "
                             f"{(self.dir / 'pg.log').read_text()[-1000:]}") from None
        return self

    def stop(self, mode: str = "fast") -> None:
        """SIGINT: Postgres's fast shutdown (sessions cut, no wait for them); the data
        directory is deleted after."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


PGBOUNCER = os.environ.get("AGENTQ_PGBOUNCER", "/usr/sbin/pgbouncer")


def require_pgbouncer() -> None:
    """Skip the calling test (fail it under CI) when PgBouncer is not installed."""
    import pytest
    if not os.access(PGBOUNCER, os.X_OK):
        message = f"PgBouncer not installed at {PGBOUNCER}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message + " (apt-get install -y pgbouncer, which .ci/run installs)")


class PgBouncer:
    """PgBouncer on a free loopback port in front of the suite's Postgres (AGENTQ_TEST_PG),
    in transaction mode: each transaction of a client may run on another server connection
    (server connections are reused most recently released first). It refuses to run as
    root, so as root it runs as `postgres`."""

    def __init__(self, pool_size: int = 2, port: int | None = None):
        import tempfile
        # its own scratch directory, under /tmp: the `postgres` user must reach it
        self.dir = Path(tempfile.mkdtemp(prefix="agentq-pgbouncer-"))
        self.port = port or free_port()
        self.pool_size = pool_size
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "PgBouncer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> "PgBouncer":
        from urllib.parse import urlsplit

        from tests.support.stack import die_with_parent, pg_admin_url
        admin = urlsplit(pg_admin_url())  # the suite's Postgres (AGENTQ_TEST_PG)
        pg_host, pg_port = admin.hostname or "127.0.0.1", admin.port or 5432
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            f"[databases]\n* = host={pg_host} port={pg_port} user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmax_client_conn = 2000\n"
            "server_round_robin = 0\nignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n")
        cmd = [PGBOUNCER, str(ini)]
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            for parent in self.dir.parents:  # runuser needs to reach it through its parents
                if parent == Path("/"):
                    break
                mode = os.stat(parent).st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=die_with_parent)
        _wait_port(self.port, True)
        return self

    def stop(self) -> None:
        terminate(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
