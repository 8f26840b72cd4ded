"""Repeated statements are prepared on their connection (agentq/prepared.py), on real
Postgres: the same rows, counts and types come back as from the statement sent whole, a
statement Postgres cannot prepare still runs in its transaction, and a connection keeps a
bounded number of them."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Iterator

import psycopg2
import pytest
from sqlalchemy import text

from agentq import prepared
from agentq.config import Settings
from agentq.db import make_engine
from tests.support.sql import wire_sent

ROW = text("INSERT INTO probe (id, n, label, at, amount, doc) "
           "VALUES (CAST(:id AS UUID), :n, :label, :at, :amount, CAST(:doc AS JSONB)) "
           "RETURNING id, n, label, at, amount, doc")


def _engine(tmp_path, url, threshold):
    return make_engine(Settings.from_env({
        "AGENTQ_DATABASE_URL": url, "AGENTQ_HOME": str(tmp_path),
        "AGENTQ_DB_POOL_SIZE": "1", "AGENTQ_DB_PREPARE_THRESHOLD": str(threshold)}))


@pytest.fixture
def engines(tmp_path, pg_url):
    made = []

    def make(threshold: int = 2):
        engine = _engine(tmp_path, pg_url, threshold)
        made.append(engine)
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS probe"))
            conn.execute(text("CREATE TABLE probe (id uuid PRIMARY KEY, n int, label text, "
                              "at timestamptz, amount numeric(12, 4), doc jsonb)"))
        return engine
    yield make
    for engine in made:
        engine.dispose()


@pytest.fixture
def sent() -> Iterator[list[str]]:
    """What agentq's connections send from now on, one string a round trip."""
    with wire_sent() as strings:
        yield strings


def _prepared_here(conn) -> list[str]:
    """The connection's prepared statements, oldest first (read past the engine's events,
    so this read is not prepared itself)."""
    cursor = conn.connection.dbapi_connection.cursor()
    cursor.execute("SELECT statement FROM pg_prepared_statements "
                   "ORDER BY substring(name FROM '[0-9]+$')::int")
    return [row[0] for row in cursor.fetchall()]


def _rows(engine, count: int) -> list[tuple]:
    out = []
    with engine.begin() as conn:
        for i in range(count):
            out.append(tuple(conn.execute(ROW, {
                "id": str(uuid.UUID(int=i + 1)), "n": i, "label": f"it's {i}% done",
                "at": datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=i),
                "amount": Decimal("1.25") * i if i % 2 else 0.5 * i,
                "doc": '{"k": [1, "two"]}' if i % 3 else None}).one()))
        counted = conn.execute(text("UPDATE probe SET n = n + :step WHERE n >= :low"),
                               {"step": 10, "low": 2}).rowcount
    return out + [("updated", counted)]


def test_a_repeated_statement_is_prepared_and_answers_as_when_sent_whole(engines):
    # given an engine that prepares on the second run and one that never prepares
    whole, preparing = engines(threshold=0), None
    expected = _rows(whole, 5)
    with whole.connect() as conn:
        assert _prepared_here(conn) == []
    preparing = engines(threshold=2)
    # when the same statements run on a connection that prepares them
    got = _rows(preparing, 5)
    # then the rows, their types and the count are the same
    assert got == expected
    assert [type(v) for v in got[1]] == [type(v) for v in expected[1]]
    # and the insert was prepared once on the connection, its values numbered
    with preparing.connect() as conn:
        statements = _prepared_here(conn)
    inserts = [s for s in statements if "INSERT INTO probe" in s]
    assert len(inserts) == 1
    assert "VALUES (CAST($1 AS UUID), $2, $3, $4, $5, CAST($6 AS JSONB))" in inserts[0]


def test_a_statement_postgres_cannot_prepare_runs_whole_and_its_transaction_goes_on(engines):
    # given a statement whose value's type Postgres cannot infer alone
    engine = engines(threshold=1)
    untyped = text("SELECT :x IS NULL AS empty")
    with engine.begin() as conn:
        # when it runs (its PREPARE refused) inside a transaction, twice
        answers = [conn.execute(untyped, {"x": None}).scalar_one() for _ in range(2)]
        # then it answered, and the transaction is still usable
        conn.execute(text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), :n)"),
                     {"id": str(uuid.uuid4()), "n": 7})
    assert answers == [True, True]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM probe WHERE n = 7")).scalar_one() == 1
        assert not [s for s in _prepared_here(conn) if "IS NULL" in s]


def test_a_prepared_statement_outlives_a_rollback(engines):
    engine = engines(threshold=1)
    count = text("SELECT count(*) FROM probe WHERE n > :n")
    with engine.connect() as conn:
        assert conn.execute(count, {"n": 0}).scalar_one() == 0
        conn.rollback()
        assert conn.execute(count, {"n": -1}).scalar_one() == 0
        assert len([s for s in _prepared_here(conn) if "FROM probe" in s]) == 1


def test_a_connection_keeps_at_most_max_prepared(engines, monkeypatch):
    monkeypatch.setattr(prepared, "MAX_PREPARED", 3)
    engine = engines(threshold=1)
    with engine.connect() as conn:
        for i in range(6):  # six different statements, each prepared on first run
            assert conn.execute(text(f"SELECT :v + {i}"), {"v": 1}).scalar_one() == 1 + i
        kept = _prepared_here(conn)
    assert len(kept) == 3
    assert [s.split(" AS ", 1)[1].split(";")[0] for s in kept] == [
        "SELECT $1 + 3", "SELECT $1 + 4", "SELECT $1 + 5"]


def test_values_of_other_types_and_many_rows_go_as_they_were(engines):
    engine = engines(threshold=1)
    with engine.begin() as conn:
        ids = [str(uuid.uuid4()) for _ in range(3)]
        conn.execute(text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), :n)"),
                     [{"id": i, "n": k} for k, i in enumerate(ids)])
        listed = text("SELECT count(*) FROM probe WHERE n = ANY(:ns)")
        assert [conn.execute(listed, {"ns": [0, 2]}).scalar_one() for _ in range(2)] == [2, 2]
        assert not [s for s in _prepared_here(conn) if "ANY" in s or "INSERT" in s]


def test_never_with_threshold_zero(engines):
    engine = engines(threshold=0)
    with engine.connect() as conn:
        for _ in range(3):
            conn.execute(text("SELECT count(*) FROM probe WHERE n > :n"), {"n": 1})
        assert _prepared_here(conn) == []


def _setting(session) -> str:
    return session.execute(text("SELECT current_setting('synchronous_commit')")).scalar_one()


@pytest.mark.parametrize("threshold", [0, 1])
def test_a_relaxed_unit_of_work_skips_its_flush_and_the_next_one_does_not(engines, threshold):
    # given a pool of one connection (prepared statements on or off)
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    sessions = sessionmaker(bind=engines(threshold=threshold), expire_on_commit=False)
    # when a unit of work that may be lost in a crash runs, then a durable one
    for _ in range(2):
        with UnitOfWork(sessions, durable=False) as relaxed:
            inside_relaxed = _setting(relaxed.session)
        with UnitOfWork(sessions) as durable:
            inside_durable = _setting(durable.session)
        # then only the first skipped its flush
        assert (inside_relaxed, inside_durable) == ("off", "on")
    # and a relaxed one that ran no statement leaves nothing for the next transaction
    with UnitOfWork(sessions, durable=False):
        pass
    with UnitOfWork(sessions) as durable:
        assert _setting(durable.session) == "on"


def test_a_composed_or_bytes_statement_goes_as_it_is(engines):
    from psycopg2 import sql
    engine = engines(threshold=1)
    with engine.connect() as conn:
        cursor = conn.connection.dbapi_connection.cursor()
        for _ in range(2):
            cursor.execute(sql.SQL("SELECT count(*) FROM {} WHERE n > %(n)s").format(
                sql.Identifier("probe")), {"n": 0})
            assert cursor.fetchone() == (0,)
            cursor.execute(b"SELECT count(*) FROM probe WHERE n > %(n)s", {"n": 0})
            assert cursor.fetchone() == (0,)
        assert not [s for s in _prepared_here(conn) if "probe" in s]


def _alter(engine, statement: str) -> None:
    """DDL from another connection, as a migration run beside the workers would."""
    url = engine.url
    other = psycopg2.connect(host=url.host, port=url.port, user=url.username,
                             password=url.password, dbname=url.database)
    other.autocommit = True
    try:
        other.cursor().execute(statement)
    finally:
        other.close()


def test_a_statement_a_migration_made_stale_goes_whole_and_fails_only_inside_a_transaction(
        engines, caplog):
    from sqlalchemy.exc import OperationalError

    from agentq.db import DATABASE_UNREACHABLE, RELAXED
    caplog.set_level("INFO", logger="agentq.prepared")
    # given a prepared read of a column, on a pool of one connection
    engine = engines(threshold=1)
    read = text("SELECT n FROM probe WHERE id = CAST(:id AS UUID)")
    ident = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), 5)"),
                     {"id": ident})
        assert conn.execute(read, {"id": ident}).scalar_one() == 5
    # when a migration changes the type of the column it answers
    _alter(engine, "ALTER TABLE probe ALTER COLUMN n TYPE text")
    with engine.connect() as conn:
        # then, as the first statement of a relaxed transaction, it answers the new type
        # (its transaction, which held nothing else, begun again) and the relaxation holds
        conn.connection.dbapi_connection.ahead = RELAXED
        assert conn.execute(read, {"id": ident}).scalar_one() == "5"
        assert conn.execute(text("SELECT current_setting('synchronous_commit')")
                            ).scalar_one() == "off"
        conn.commit()
        assert any("went stale" in r.getMessage() for r in caplog.records)
        # and prepared again, it answers the new type too
        assert conn.execute(read, {"id": ident}).scalar_one() == "5"
        conn.commit()
    # when the type changes again, and the statement runs after another in its transaction
    _alter(engine, "ALTER TABLE probe ALTER COLUMN n TYPE int USING n::int")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM probe")).scalar_one() == 1
        # then it fails as an error agentq retries (a database blip), not as a bug
        with pytest.raises(OperationalError) as failed:
            conn.execute(read, {"id": ident})
        assert isinstance(failed.value, DATABASE_UNREACHABLE)
        assert isinstance(failed.value.orig, prepared.StalePlan)
        assert "cached plan must not change result type" in str(failed.value)
        conn.rollback()
        # and the retry answers, and the connection keeps one prepared copy of it
        assert conn.execute(read, {"id": ident}).scalar_one() == 5
        assert conn.execute(read, {"id": ident}).scalar_one() == 5
        assert len([s for s in _prepared_here(conn) if "SELECT n FROM probe" in s]) == 1


def test_a_connection_whose_prepared_statements_vanish_stops_preparing(engines, caplog):
    # given a prepared statement on a pool of one connection
    engine = engines(threshold=1)
    count = text("SELECT count(*) FROM probe WHERE n > :n")
    with engine.connect() as conn:
        assert conn.execute(count, {"n": 0}).scalar_one() == 0
        # when it vanishes from the server connection (a pooler's DEALLOCATE ALL)
        conn.connection.dbapi_connection.cursor().execute(b"DEALLOCATE ALL")
        conn.commit()
        # then its next run, opening its transaction, answers (begun again, sent whole),
        # with a warning that says what to set
        assert conn.execute(count, {"n": 0}).scalar_one() == 0
        assert any("AGENTQ_DB_PREPARE_THRESHOLD=0" in r.getMessage() for r in caplog.records)
        conn.commit()
        # and from then on the connection sends every statement whole
        for other in range(3):
            assert conn.execute(text(f"SELECT count(*) + {other} FROM probe WHERE n > :n"),
                                {"n": 0}).scalar_one() == other
            assert conn.execute(count, {"n": 0}).scalar_one() == 0
        assert _prepared_here(conn) == []


def _tell_prefix(answers) -> None:
    answers.put(prepared._prefix)


def test_a_forked_process_names_its_statements_apart():
    # statement names of two processes never meet on one server connection (a pooler's)
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    answers = ctx.Queue()
    children = [ctx.Process(target=_tell_prefix, args=(answers,)) for _ in range(2)]
    for child in children:
        child.start()
    prefixes = {answers.get(timeout=60) for _ in children}
    for child in children:
        child.join()
    assert len(prefixes) == 2 and prepared._prefix not in prefixes


@pytest.fixture
def bouncer():
    """PgBouncer in transaction mode, two server connections (tests/support/services.py)."""
    from tests.support.services import PgBouncer, require_pgbouncer
    require_pgbouncer()
    with PgBouncer(pool_size=2) as pooler:
        yield pooler


def test_behind_a_transaction_pooler_a_statement_on_another_server_connection_fails_once(
        tmp_path, pg_url, bouncer, caplog):
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError
    # given agentq's engine (statements prepared on their first run) through PgBouncer in
    # transaction mode, which reuses the server connection released last
    engine = make_engine(Settings.from_env({
        "AGENTQ_DATABASE_URL": bouncer.url(make_url(pg_url).database),
        "AGENTQ_HOME": str(tmp_path), "AGENTQ_DB_POOL_SIZE": "2",
        "AGENTQ_DB_PREPARE_THRESHOLD": "1"}))
    count = text("SELECT count(*) FROM pg_class WHERE relpages >= :n")
    server = text("SELECT pg_backend_pid()")
    try:
        with engine.connect() as a, engine.connect() as b:
            # when client A prepares a statement in its transaction on server connection S1,
            first = a.execute(count, {"n": 0}).scalar_one()
            s1 = a.execute(server).scalar_one()
            a.commit()
            # client B's transaction takes S1 and holds it,
            assert b.execute(server).scalar_one() == s1
            # and A runs the statement again, after another one, in a transaction on the
            # other server connection
            assert a.execute(text("SELECT :x + 1"), {"x": 1}).scalar_one() == 2
            with pytest.raises(OperationalError) as failed:
                a.execute(count, {"n": 0})
            # then it failed once as a blip (agentq retries it), naming the setting to change
            assert isinstance(failed.value.orig, prepared.StalePlan)
            assert any("AGENTQ_DB_PREPARE_THRESHOLD=0" in r.getMessage()
                       for r in caplog.records)
            a.rollback()
            # and from then on A sends it whole, wherever its transactions run
            assert a.execute(count, {"n": 0}).scalar_one() == first
            assert a.execute(server).scalar_one() != s1
            a.commit()
            b.commit()
            for _ in range(3):
                assert a.execute(count, {"n": 0}).scalar_one() == first
                a.commit()
            assert a.connection.dbapi_connection.agentq_prepared is None
    finally:
        engine.dispose()


def test_a_unit_of_work_sends_its_begin_with_its_first_statement_and_ends_as_before(
        engines, sent):
    # given a pool of one connection, and what it sends
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    sessions = sessionmaker(bind=engines(threshold=1), expire_on_commit=False)
    insert = text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), :n)")
    count = text("SELECT count(*) FROM probe")
    xid = text("SELECT txid_current()")
    for n in range(3):  # (the statements prepared on the way)
        sent.clear()
        # when a unit of work writes a row and reads in its transaction
        with UnitOfWork(sessions) as unit:
            conn = unit.session.connection().connection.dbapi_connection
            unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": n})
            first = unit.session.execute(xid).scalar_one()
            assert unit.session.execute(xid).scalar_one() == first  # one transaction
            assert conn.autocommit and conn.folded  # psycopg2 sends no BEGIN of its own
        # then its BEGIN went with its first statement, its end as a statement of its own
        # (a statement prepared on its first run is PREPAREd before it, outside)
        statements = [s for s in sent if not s.startswith("PREPARE")]
        assert statements[0].startswith("BEGIN; ") and statements[-1] == "COMMIT"
        assert not any(s.startswith("BEGIN") for s in statements[1:])
        assert (conn.autocommit, conn.folded, conn.ahead) == (False, False, None)
    with sessions() as session:
        assert session.execute(count).scalar_one() == 3
    # and a unit of work that fails is rolled back whole
    with pytest.raises(RuntimeError), UnitOfWork(sessions, durable=False) as unit:
        unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 9})
        raise RuntimeError("after a write")
    assert sent[-1] == "ROLLBACK"
    with sessions() as session:
        assert session.execute(count).scalar_one() == 3
        dbapi = session.connection().connection.dbapi_connection
        assert (dbapi.autocommit, dbapi.folded) == (False, False)
    # and one that sends nothing sends no end either
    sent.clear()
    with UnitOfWork(sessions):
        pass
    assert sent == []


def _row_of_five(sessions, read, lone: bool = False) -> str:
    """A row of n = 5 written, then `read` (of its n first) run once, in a unit of work
    (`lone` or not) of its own: prepared from now on. Its id."""
    from agentq.loop.uow import UnitOfWork
    ident = str(uuid.uuid4())
    with UnitOfWork(sessions) as unit:
        unit.session.execute(text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), 5)"),
                             {"id": ident})
    with UnitOfWork(sessions, lone=lone) as unit:
        assert unit.session.execute(read, {"id": ident}).first()[0] == 5
    return ident


def test_a_stale_plan_in_a_folded_transaction_begins_it_again_only_as_its_first_statement(
        engines):
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    # given a prepared read of a column, on a pool of one connection
    engine = engines(threshold=1)
    sessions = sessionmaker(bind=engine, expire_on_commit=False)
    read = text("SELECT n FROM probe WHERE id = CAST(:id AS UUID)")
    ident = _row_of_five(sessions, read)
    # when a migration changes its type and it is a unit of work's first statement
    _alter(engine, "ALTER TABLE probe ALTER COLUMN n TYPE text")
    with UnitOfWork(sessions, durable=False) as unit:
        # then it answers the new type in a transaction begun again, folded and relaxed
        assert unit.session.execute(read, {"id": ident}).scalar_one() == "5"
        assert unit.session.execute(read, {"id": ident}).scalar_one() == "5"  # prepared
        assert unit.session.execute(text("SELECT current_setting('synchronous_commit')")
                                    ).scalar_one() == "off"
        unit.session.execute(text("UPDATE probe SET label = 'kept' WHERE id = CAST(:id AS UUID)"),
                             {"id": ident})
        conn = unit.session.connection().connection.dbapi_connection
        assert conn.folded
    with sessions() as session:
        assert session.execute(text("SELECT label FROM probe")).scalar_one() == "kept"
    # when it changes again and the read comes after a write in its transaction
    _alter(engine, "ALTER TABLE probe ALTER COLUMN n TYPE int USING n::int")
    with pytest.raises(OperationalError) as failed, UnitOfWork(sessions) as unit:
        unit.session.execute(text("UPDATE probe SET label = 'lost' WHERE id = CAST(:id AS UUID)"),
                             {"id": ident})
        unit.session.execute(read, {"id": ident})
    # then it fails (retried as a blip by agentq), and the write before it is not kept
    assert isinstance(failed.value.orig, prepared.StalePlan)
    with sessions() as session:
        assert session.execute(text("SELECT label FROM probe")).scalar_one() == "kept"


def test_a_unit_of_works_last_writes_go_with_its_commit_in_one_round_trip(engines, sent):
    # given a pool of one connection that prepares on the first run, and what it sends
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    from agentq.prepared import deferred_writes
    sessions = sessionmaker(bind=engines(threshold=1), expire_on_commit=False)
    insert = text("INSERT INTO probe (id, n, label) VALUES (CAST(:id AS UUID), :n, :label)")
    count = text("SELECT count(*) FROM probe")
    for n in range(3):  # sent whole, then prepared
        sent.clear()
        # when a unit of work's only writes are deferred
        with UnitOfWork(sessions) as unit:
            with deferred_writes(unit.session):
                unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": n,
                                              "label": "it's; done"})
                unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 10 + n,
                                              "label": None})
            assert [s for s in sent if not s.startswith("PREPARE")] == []  # nothing yet
        # then its BEGIN, both writes and its COMMIT went in one round trip
        statements = [s for s in sent if not s.startswith("PREPARE")]
        assert len(statements) == 1
        assert statements[0].startswith("BEGIN; ") and statements[0].endswith("; COMMIT")
    with sessions() as session:
        assert session.execute(count).scalar_one() == 6
        assert session.execute(text("SELECT count(*) FROM probe WHERE label = 'it''s; done'")
                               ).scalar_one() == 3
        dbapi = session.connection().connection.dbapi_connection
        assert (dbapi.autocommit, dbapi.folded, dbapi.deferring, dbapi.deferred) == (
            False, False, False, False)
    # when a statement follows a deferred write in the same transaction
    with UnitOfWork(sessions) as unit:
        with deferred_writes(unit.session):
            unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 50, "label": "x"})
        # then it sees the write (sent before it, in the same round trip)
        assert unit.session.execute(count).scalar_one() == 7
    # and a unit of work that fails drops its deferred writes
    with pytest.raises(RuntimeError), UnitOfWork(sessions) as unit:
        with deferred_writes(unit.session):
            unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 60, "label": "x"})
        raise RuntimeError("after a deferred write")
    with sessions() as session:
        assert session.execute(count).scalar_one() == 7


def test_a_deferred_write_that_fails_fails_the_commit_and_nothing_of_it_is_kept(engines):
    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    from agentq.prepared import deferred_writes
    # given a row
    sessions = sessionmaker(bind=engines(threshold=1), expire_on_commit=False)
    insert = text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), :n)")
    taken = str(uuid.uuid4())
    with UnitOfWork(sessions) as unit:
        unit.session.execute(insert, {"id": taken, "n": 1})
    # when a unit of work writes a row, then a deferred write that breaks a key
    with pytest.raises(IntegrityError), UnitOfWork(sessions) as unit:
        unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 2})
        with deferred_writes(unit.session):
            unit.session.execute(insert, {"id": taken, "n": 3})
    # then the commit failed, nothing of the transaction is kept, and the connection (the
    # pool's only one) is out of its transaction and usable
    with sessions() as session:
        assert session.execute(text("SELECT n FROM probe ORDER BY n")).scalars().all() == [1]
        dbapi = session.connection().connection.dbapi_connection
        assert (dbapi.autocommit, dbapi.folded, dbapi.deferred) == (False, False, False)
    with UnitOfWork(sessions) as unit:
        with deferred_writes(unit.session):
            unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 4})
    with sessions() as session:
        assert session.execute(text("SELECT n FROM probe ORDER BY n")).scalars().all() == [1, 4]


def test_writes_outside_a_folded_transaction_are_sent_at_once(engines):
    from sqlalchemy.orm import sessionmaker

    from agentq.prepared import deferred_writes
    # given a plain session (no unit of work: its BEGIN is psycopg2's own)
    sessions = sessionmaker(bind=engines(threshold=1), expire_on_commit=False)
    with sessions() as session:
        # when a write is asked to be deferred
        with deferred_writes(session):
            result = session.execute(text("INSERT INTO probe (id, n) VALUES "
                                          "(CAST(:id AS UUID), 1) RETURNING n"),
                                     {"id": str(uuid.uuid4())})
        # then it was sent: its answer is there
        assert result.scalar_one() == 1
        session.commit()


def test_a_read_scope_sends_no_transaction_and_gives_its_connection_back_as_it_was(
        engines, sent, tmp_path, pg_url):
    from agentq import db
    # given agentq's engine on a pool of one connection, and what it sends
    settings = Settings.from_env({
        "AGENTQ_DATABASE_URL": pg_url, "AGENTQ_HOME": str(tmp_path),
        "AGENTQ_DB_POOL_SIZE": "1", "AGENTQ_DB_PREPARE_THRESHOLD": "1"})
    engines(threshold=1)  # the table
    db.dispose_engines()
    sent.clear()
    try:
        # when a read scope reads twice
        with db.read_scope(settings) as session:
            first = session.execute(text("SELECT txid_current()")).scalar_one()
            second = session.execute(text("SELECT txid_current()")).scalar_one()
        # then each read was its own transaction, and no BEGIN, COMMIT or ROLLBACK was sent
        assert second != first
        assert not any(s.split()[0].rstrip(";") in ("BEGIN", "COMMIT", "ROLLBACK")
                       for s in sent)
        # and the next session of the pool is a transaction again
        with db.session_scope(settings) as session:
            one = session.execute(text("SELECT txid_current()")).scalar_one()
            assert session.execute(text("SELECT txid_current()")).scalar_one() == one
            assert session.connection().connection.dbapi_connection.autocommit is False
    finally:
        db.dispose_engines()


def test_a_lone_unit_of_works_first_statement_is_one_round_trip_and_commits_as_it_ends(
        engines, sent):
    # given a pool of one connection that prepares on the first run, and what it sends
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    sessions = sessionmaker(bind=engines(threshold=1), expire_on_commit=False)
    insert = text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), :n) "
                  "RETURNING current_setting('synchronous_commit')")
    for n in range(3):  # sent whole, then prepared
        sent.clear()
        # when a lone, relaxed unit of work writes a row in its one statement
        with UnitOfWork(sessions, durable=False, lone=True) as unit:
            setting = unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": n}
                                           ).scalar_one()
            conn = unit.session.connection().connection.dbapi_connection
            assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
        # then that statement was the one round trip: no BEGIN, no COMMIT, its SET ahead of
        # it in force (one implicit transaction)
        statements = [s for s in sent if not s.startswith("PREPARE")]
        assert len(statements) == 1 and not statements[0].startswith("BEGIN")
        assert statements[0].startswith("SET LOCAL synchronous_commit") and setting == "off"
        assert (conn.autocommit, conn.folded, conn.lone, conn.ahead) == (False, False, False,
                                                                         None)
    with sessions() as session:
        assert session.execute(text("SELECT count(*) FROM probe")).scalar_one() == 3
        # and the next session is a transaction as usual, durable again
        assert _setting(session) == "on"


def test_statements_after_a_lone_one_are_a_transaction_of_their_own(engines, sent):
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    sessions = sessionmaker(bind=engines(threshold=1), expire_on_commit=False)
    xid = text("SELECT txid_current()")
    insert = text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), :n)")
    count = text("SELECT count(*) FROM probe")
    sent.clear()
    # when a lone unit of work reads after its first statement
    with UnitOfWork(sessions, lone=True) as unit:
        first = unit.session.execute(xid).scalar_one()
        second = unit.session.execute(xid).scalar_one()
        assert unit.session.execute(xid).scalar_one() == second
        unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 1})
    # then the first was a transaction of its own, the rest one more, begun and committed
    assert second != first
    statements = [s for s in sent if not s.startswith("PREPARE")]
    assert not statements[0].startswith("BEGIN") and statements[1].startswith("BEGIN; ")
    assert statements[-1] == "COMMIT"
    assert not any(s.startswith("BEGIN") for s in statements[2:])
    # when one fails after its first statement wrote
    with pytest.raises(RuntimeError), UnitOfWork(sessions, lone=True) as unit:
        unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 2})  # committed
        unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 3})  # rolled back
        raise RuntimeError("after two writes")
    # then what its first statement wrote is kept (it was committed as it ended: `lone` is
    # for a first statement that does all the writing), and the rest is not
    with sessions() as session:
        assert session.execute(text("SELECT n FROM probe ORDER BY n")).scalars().all() == [
            1, 2]
        assert session.execute(count).scalar_one() == 2


def test_a_lone_statement_that_fails_keeps_nothing_and_leaves_its_connection_usable(
        engines, sent):
    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    sessions = sessionmaker(bind=engines(threshold=1), expire_on_commit=False)
    insert = text("INSERT INTO probe (id, n) VALUES (CAST(:id AS UUID), :n)")
    taken = str(uuid.uuid4())
    with UnitOfWork(sessions) as unit:
        unit.session.execute(insert, {"id": taken, "n": 1})
    # when a lone unit of work's statement breaks a key
    sent.clear()
    with pytest.raises(IntegrityError), UnitOfWork(sessions, lone=True) as unit:
        unit.session.execute(insert, {"id": taken, "n": 2})
    # then nothing was sent to end it, nothing is kept, and the pool's one connection is
    # as before
    assert not any(s in ("COMMIT", "ROLLBACK") for s in sent)
    with sessions() as session:
        assert session.execute(text("SELECT n FROM probe")).scalars().all() == [1]
        dbapi = session.connection().connection.dbapi_connection
        assert (dbapi.autocommit, dbapi.folded, dbapi.lone) == (False, False, False)
    with UnitOfWork(sessions) as unit:
        unit.session.execute(insert, {"id": str(uuid.uuid4()), "n": 3})
    with sessions() as session:
        assert session.execute(text("SELECT n FROM probe ORDER BY n")).scalars().all() == [
            1, 3]


def test_a_lone_statement_a_migration_made_stale_runs_again_whole_and_alone(engines, sent):
    from sqlalchemy.orm import sessionmaker

    from agentq.loop.uow import UnitOfWork
    # given a prepared read of a column, on a pool of one connection
    engine = engines(threshold=1)
    sessions = sessionmaker(bind=engine, expire_on_commit=False)
    read = text("SELECT n, txid_current() FROM probe WHERE id = CAST(:id AS UUID)")
    ident = _row_of_five(sessions, read, lone=True)
    # when a migration changes its type and it is a lone unit of work's first statement
    _alter(engine, "ALTER TABLE probe ALTER COLUMN n TYPE text")
    sent.clear()
    with UnitOfWork(sessions, durable=False, lone=True) as unit:
        n, first = unit.session.execute(read, {"id": ident}).one()
        _, second = unit.session.execute(read, {"id": ident}).one()
    # then it answers the new type, sent again whole and still alone (no BEGIN, no COMMIT
    # for it), and the statement after it is a transaction of its own
    assert n == "5" and second != first
    statements = [s for s in sent if not s.startswith(("PREPARE", "DEALLOCATE"))]
    assert [s.split(";")[0] for s in statements] == [
        "SET LOCAL synchronous_commit = off",  # as prepared: the plan is stale
        "SET LOCAL synchronous_commit = off",  # whole, and still a transaction of its own
        "BEGIN", "COMMIT"]
