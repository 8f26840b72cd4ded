"""The step's claim, the unit of work's event numbering and the conversation's message
numbering on real Postgres (row locks and `UPDATE … RETURNING` are what make them safe;
SQLite cannot show it)."""
from __future__ import annotations

import threading
import uuid
from contextlib import ExitStack

import pytest
from sqlalchemy import select

from agentq.loop.busy import request_cancel
from agentq.loop.store import append_messages
from agentq.loop.uow import UnitOfWork
from agentq.models import Conversation, Job, JobEvent, Message
from tests.support.sql import sql_sent


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: row locks and
    `UPDATE … RETURNING` are what is tested."""
    return make_pg


JOIN_S = 60
"""A failure bound for a thread that waits on a row lock, never a measured margin."""


def _in_thread(work) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    return thread, out



def test_two_deliveries_of_one_step_claim_it_once(make):
    # given a queued job and a worker whose claim transaction is still open
    h = make()
    job_id = h.submit()
    with h.sessions() as first, first.begin():
        assert h.stepper._claim(first, uuid.UUID(job_id), 0, "worker-a") is not None
        # when a second delivery claims the same step meanwhile (it waits on the row)
        def second():
            with h.sessions() as other, other.begin():
                return h.stepper._claim(other, uuid.UUID(job_id), 0, "worker-b")
        thread, out = _in_thread(second)
    thread.join(JOIN_S)
    # then it finds the step taken, whenever it ran
    assert out == [None]
    assert h.job(job_id).step_owner == "worker-a"


def test_events_numbered_under_the_claim_never_collide_with_another_writer(make):
    # given a step that holds its job's row (its claim) and numbers events from the row
    h = make()
    job_id = uuid.UUID(h.submit())
    with UnitOfWork(h.sessions) as step:
        job = h.stepper._claim(step.session, job_id, 0, "worker-a")
        step.holds(job)
        step.event(job_id, "job_start")
        step.event(job_id, "turn_start", turn=1)

        # when a cancel arrives meanwhile (its own unit of work, numbering by UPDATE …
        # RETURNING on the same row: it waits for the step's commit)
        def cancel():
            with UnitOfWork(h.sessions) as other:
                request_cancel(other, other.session.get(Job, job_id))
            return other.sent
        thread, _out = _in_thread(cancel)
    thread.join(JOIN_S)
    # then every event has its own number, gap-free, and the row's counter agrees
    with h.sessions() as session:
        seqs = list(session.execute(select(JobEvent.seq, JobEvent.type)
                                    .where(JobEvent.job_id == job_id)
                                    .order_by(JobEvent.seq)).all())
        counter = session.get(Job, job_id).event_seq
    assert [seq for seq, _ in seqs] == list(range(1, len(seqs) + 1)) and counter == len(seqs)
    assert {kind for _, kind in seqs} == {"job_start", "turn_start", "cancel_requested"}


def test_messages_appended_at_once_to_one_conversation_are_numbered_gap_free(make):
    # given one conversation, and writers appending to it at once: one message a time (the
    # counter advanced and the row written in one statement) and three at a time
    h = make()
    job_id = uuid.UUID(h.submit())
    conversation_id = h.job(str(job_id)).conversation_id
    start = threading.Barrier(8)

    def writer(n: int, rows: int):
        def work():
            start.wait(JOIN_S)
            for i in range(5):
                with UnitOfWork(h.sessions) as unit:
                    append_messages(unit.session, conversation_id, job_id,
                                    [("user", f"w{n}-{i}-{r}", None) for r in range(rows)])
        return work
    threads = [_in_thread(writer(n, 1 if n % 2 else 3))[0] for n in range(8)]
    for thread in threads:
        thread.join(JOIN_S)
    # then every message has its own number, gap-free, each batch's in order, and the
    # conversation's counter agrees
    with h.sessions() as session:
        rows = session.execute(select(Message.seq, Message.content)
                               .where(Message.conversation_id == conversation_id)
                               .order_by(Message.seq)).all()
        counter = session.get(Conversation, conversation_id).message_seq
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1)) == list(range(1, counter + 1))
    assert len(rows) == 4 * 5 * 1 + 4 * 5 * 3
    by_content = {content: seq for seq, content in rows}
    for n in range(0, 8, 2):
        for i in range(5):
            seqs = [by_content[f"w{n}-{i}-{r}"] for r in range(3)]
            assert seqs == list(range(seqs[0], seqs[0] + 3))


def test_events_written_at_once_by_holders_and_others_are_numbered_gap_free(make):
    # given one job, and writers adding events to it at once: holders of its row (their
    # events numbered from the object, written with the job's UPDATE in one statement),
    # and writers that append one event (advance and insert in one statement) or three
    from agentq.db import lock_row
    from agentq.loop.store import append_events
    h = make()
    job_id = uuid.UUID(h.submit())
    start = threading.Barrier(9)

    def writer(n: int):
        def work():
            start.wait(JOIN_S)
            for i in range(5):
                with UnitOfWork(h.sessions) as unit:
                    if n % 3 == 0:
                        unit.holds(lock_row(unit.session, Job, job_id))
                        for r in range(2):
                            unit.event(job_id, "note", mark=f"w{n}-{i}-{r}")
                    else:
                        rows = 1 if n % 3 == 1 else 3
                        append_events(unit.session, job_id,
                                      [("note", {"mark": f"w{n}-{i}-{r}"}) for r in range(rows)])
        return work
    threads = [_in_thread(writer(n))[0] for n in range(9)]
    for thread in threads:
        thread.join(JOIN_S)
    # then every event has its own number, gap-free, each writer's batch in order, and the
    # job's counter agrees
    with h.sessions() as session:
        rows = session.execute(select(JobEvent.seq, JobEvent.data).where(
            JobEvent.job_id == job_id, JobEvent.type == "note").order_by(JobEvent.seq)).all()
        every = session.execute(select(JobEvent.seq).where(JobEvent.job_id == job_id)
                                .order_by(JobEvent.seq)).scalars().all()
        counter = session.get(Job, job_id).event_seq
    assert every == list(range(1, counter + 1))
    assert len(rows) == 3 * 5 * 2 + 3 * 5 * 1 + 3 * 5 * 3
    by_mark = {data["mark"]: seq for seq, data in rows}
    for n in range(9):
        size = {0: 2, 1: 1, 2: 3}[n % 3]
        for i in range(5):
            seqs = [by_mark[f"w{n}-{i}-{r}"] for r in range(size)]
            assert seqs == list(range(seqs[0], seqs[0] + size))


def test_a_held_job_is_written_with_its_events_in_one_statement(make):
    # given a unit of work that holds its job (a step's claim) and changes it
    h = make()
    job_id = uuid.UUID(h.submit())
    with ExitStack() as capture:  # from the last change to after the unit's end
        with UnitOfWork(h.sessions) as unit:
            job = h.stepper._claim(unit.session, job_id, 0, "worker-a")
            unit.holds(job)
            job.status = "running"
            unit.event(job_id, "job_start")
            unit.event(job_id, "turn_start", turn=1)
            statements = capture.enter_context(sql_sent(h.sessions.kw["bind"]))
    # then its changes and its events went in one statement
    assert len(statements) == 1 and statements[0].startswith("WITH together AS")
    # and they are stored: the status, the events in order, the counter
    with h.sessions() as session:
        stored = session.get(Job, job_id)
        kinds = session.execute(select(JobEvent.seq, JobEvent.type)
                                .where(JobEvent.job_id == job_id)
                                .order_by(JobEvent.seq)).all()
    assert stored.status == "running"
    assert kinds[-2:] == [(stored.event_seq - 1, "job_start"), (stored.event_seq, "turn_start")]


def test_a_charged_call_logs_and_charges_in_one_statement_as_two_would(make):
    # given a job's user, and a model reply
    from sqlalchemy import insert

    from agentq.llm.types import LLMReply
    from agentq.loop.store import record_usage
    from agentq.models import TokenLog, User
    h = make()
    job = h.job(h.submit())
    reply = LLMReply(content="4", tool_calls=(), stop_reason="end_turn", model="m-1",
                     input_tokens=30, output_tokens=12, usage_estimated=True)
    with h.sessions() as session, session.begin():
        user = session.get(User, job.user_id)
        before = user.tokens_used_this_month
        # when the call is recorded charged, with and without the reply kept
        with sql_sent(h.sessions.kw["bind"]) as statements:
            for keep in (False, True):
                record_usage(session, user_id=job.user_id, conversation_id=job.conversation_id,
                             job_id=job.id, iteration=7 + keep, reply=reply, cost=0.25,
                             keep_reply=keep)
        # then the loaded user shows the count the database holds
        assert user.tokens_used_this_month == before + 2 * 42
    assert len(statements) == 2  # one a call
    # and the rows are those the plain INSERT of an uncharged call writes
    with h.sessions() as session, session.begin():
        for keep in (False, True):
            session.execute(insert(TokenLog), {
                "id": uuid.uuid4(), "user_id": job.user_id,
                "conversation_id": job.conversation_id, "job_id": job.id,
                "iteration": 17 + keep, "model": "m-1", "input_tokens": 30,
                "output_tokens": 12, "cost_estimate": 0.25, "usage_estimated": True,
                "reply": reply.to_record() if keep else None,
                "created_at": session.get(Job, job.id).created_at})
    columns = [c for c in TokenLog.__table__.c if c.name not in ("id", "iteration",
                                                                 "created_at")]
    with h.sessions() as session:
        rows = {r.iteration: tuple(getattr(r, c.key) for c in columns)
                for r in session.scalars(select(TokenLog).where(TokenLog.job_id == job.id))}
        nulls = dict(session.execute(
            select(TokenLog.iteration, TokenLog.__table__.c.reply.is_(None))
            .where(TokenLog.job_id == job.id)).all())
    assert rows[7] == rows[17] and rows[8] == rows[18]
    # (a reply not kept is stored as the plain INSERT stores it; a kept one is never NULL)
    assert nulls[7] == nulls[17] and nulls[8] is False and nulls[18] is False


def test_a_steps_claim_reads_its_user_conversation_and_persona_in_the_same_statement(make):
    # given a queued job of a persona

    from agentq.models import Persona
    from agentq.tenants import DEFAULT_TENANT_ID
    from agentq.testing.harness import text
    h = make(text("4"))
    with h.sessions() as session, session.begin():
        persona = Persona(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID,
                          name=f"p-{uuid.uuid4().hex[:8]}",
                          system_prompt="You answer in digits.")
        session.add(persona)
    job_id = h.submit(persona_id=persona.id)
    # when its first step runs
    with sql_sent(h.sessions.kw["bind"]) as statements:
        h.stepper.run(job_id, 0, "start")
    # then its first statement claims the job and reads who, where and as whom with it
    claim = statements[0]
    assert claim.startswith("WITH claimed AS") and "UPDATE jobs" in claim
    assert "JOIN users" in claim and "JOIN personas" in claim
    assert not any(s.lstrip().startswith("SELECT") and "FROM users" in s
                   for s in statements[1:])
    # and the step used what it read: the persona's prompt, the job done
    assert h.router.requests[0]["messages"][0]["content"].startswith("You answer in digits.")
    assert h.job(job_id).status == "completed"


def test_a_persist_logs_and_charges_with_its_compare_and_set_or_writes_nothing(make):
    # given a step whose job another worker takes over while the model thinks
    from sqlalchemy import update

    from agentq.models import TokenLog, User
    from agentq.testing.harness import MODEL, text
    h = make()
    job_id = h.submit()
    user_id = h.job(job_id).user_id
    with h.sessions() as session:
        before = session.get(User, user_id).tokens_used_this_month

    def taken_over():
        with h.sessions() as session, session.begin():
            session.execute(update(Job).values(step_owner="worker-b"))
        return text("late answer", input_tokens=30, output_tokens=12)

    h.router.replies.extend([taken_over, text("4", input_tokens=30, output_tokens=12)])
    # when its reply is persisted
    assert h.stepper.run(job_id, 0, "start") == []
    # then the compare-and-set failed and its statement wrote no log and no charge
    job = h.job(job_id)
    assert (job.iteration, job.step_owner, job.input_tokens) == (0, "worker-b", 0)
    assert h.rows(TokenLog, job_id) == []
    with h.sessions() as session:
        assert session.get(User, user_id).tokens_used_this_month == before
    # and when the step runs again, free, its persist's compare-and-set, token log and
    # charge are one statement
    with h.sessions() as session, session.begin():
        session.execute(update(Job).values(step_owner=None, step_lease_until=None))
    with sql_sent(h.sessions.kw["bind"]) as statements:
        h.stepper.run(job_id, 0, "start")
    (persist,) = [s for s in statements if "INSERT INTO token_logs" in s]
    assert "UPDATE jobs" in persist and "UPDATE users" in persist
    job = h.job(job_id)
    assert (job.status, job.iteration, job.input_tokens, job.output_tokens) == (
        "completed", 1, 30, 12)
    (log,) = h.rows(TokenLog, job_id)
    assert (log.user_id, log.conversation_id, log.iteration, log.model) == (
        user_id, job.conversation_id, 1, MODEL)
    assert (log.input_tokens, log.output_tokens, log.reply["content"]) == (30, 12, "4")
    with h.sessions() as session:
        assert session.get(User, user_id).tokens_used_this_month == before + 42


def test_a_tool_call_starts_in_one_statement_that_leaves_its_job_alone(make):
    # given a job whose turn asked for one tool call

    from agentq.loop.execute import Run, _prepare
    from agentq.models import ToolCall
    from agentq.testing.harness import calls, text
    h = make(calls(("math.evaluate", {"expression": "6*7"})), text("42"))
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    (call,) = h.rows(ToolCall, job_id)
    job = h.job(job_id)
    # when a delivery of it starts it
    with sql_sent(h.sessions.kw["bind"]) as statements:
        with UnitOfWork(h.sessions, durable=False) as unit:
            prepared = _prepare(unit, call.tool_use_id, h.settings, h.registry, h.sessions)
    # then the call is read with its job locked, and started (its lease taken) by an
    # UPDATE of tool_calls, in one statement (756a6ac): the job's row is not written
    # (issue 34; the sweeper reads the call's lease: tests/unit/test_tool_leases_pg.py)
    assert len(statements) == 1 and statements[0].startswith("WITH call AS")
    assert "UPDATE tool_calls " in statements[0] and "UPDATE jobs " not in statements[0]
    assert isinstance(prepared, Run)  # this delivery runs the tool
    lease_until = prepared.lease_until
    (started,) = h.rows(ToolCall, job_id)
    assert (started.attempts, started.lease_until) == (1, lease_until)
    assert started.started_at is not None
    assert (h.job(job_id).redrive_after, h.job(job_id).last_progress_at) == (
        job.redrive_after, job.last_progress_at)


def test_a_first_step_sends_the_history_and_the_question_it_wrote(make):
    # given a conversation with one job answered, and a second job in it
    from agentq.testing.harness import text
    h = make(text("first answer"), text("second answer"))
    thread = f"t-{uuid.uuid4().hex[:8]}"  # a conversation of its own in the module's database
    h.drive(h.submit("first question", thread=thread))
    second = h.submit("second question", thread=thread)
    # when its first step runs (its question written there, not read back)
    with sql_sent(h.sessions.kw["bind"]) as statements:
        h.stepper.run(second, 0, "start")
    # then the model is sent the history, then the question
    messages = h.router.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in messages[1:]] == [
        ("user", "first question"), ("assistant", "first answer"),
        ("user", "second question")]
    # and the history was read by the claim, and only there; the question's write (sent
    # with the transaction's COMMIT) read nothing back
    (read,) = [s for s in statements if "FROM messages" in s]
    assert "turn_messages" in read and "UPDATE jobs" in read
    (wrote,) = [s for s in statements if "INSERT INTO messages" in s and "history" not in s
                and "UPDATE jobs" not in s and "UPDATE conversations" in s
                and "active_job_id" not in s]
    assert "RETURNING" not in wrote


def _hot_updates(session, table: str) -> tuple[int, int]:
    """(rows updated, of which heap-only) by this transaction so far, in `table`."""
    from sqlalchemy import text
    return session.execute(text(
        "SELECT pg_stat_get_xact_tuples_updated(CAST(:t AS regclass)), "
        "pg_stat_get_xact_tuples_hot_updated(CAST(:t AS regclass))"), {"t": table}).one()


def test_a_steps_claim_and_its_events_update_the_job_row_heap_only(make):
    # given a queued job (its row on a page with room, as `jobs` keeps a fifth of each free)
    h = make()
    job_id = uuid.UUID(h.submit())
    with UnitOfWork(h.sessions, durable=False) as step:
        before = _hot_updates(step.session, "jobs")
        # when a step claims it and writes its events with the row (the job's counter and
        # progress: the statements every step runs)
        job = h.stepper._claim(step.session, job_id, 0, "worker-a")
        step.holds(job)
        step.event(job_id, "turn_start", turn=1)
        step.write_events()
        after = _hot_updates(step.session, "jobs")
    # then both updates of the row were heap-only: no index holds a column they change
    # (an index on last_progress_at made every one write all nine indexes anew)
    assert (after[0] - before[0], after[1] - before[1]) == (2, 2)


def test_a_steps_messages_update_the_conversation_row_heap_only(make):
    # given a conversation a job holds
    h = make()
    job_id = uuid.UUID(h.submit())
    conversation_id = h.job(str(job_id)).conversation_id
    with UnitOfWork(h.sessions) as step:
        before = _hot_updates(step.session, "conversations")
        # when the step appends its messages (one, then two: the two statements' forms)
        append_messages(step.session, conversation_id, job_id, [("user", "q", None)])
        append_messages(step.session, conversation_id, job_id,
                        [("assistant", "a", None), ("tool", "r", None)])
        after = _hot_updates(step.session, "conversations")
    # then both updates of its counter were heap-only (last_active_at, which the idle
    # digest's index holds, is not moved by each message: by the job's end)
    assert (after[0] - before[0], after[1] - before[1]) == (2, 2)


def test_a_conversation_is_active_until_its_job_lets_it_go(make):
    # given a conversation whose job has written its question and a reply
    from agentq.testing.harness import text
    h = make(text("4"))
    job_id = h.submit()
    conversation_id = h.job(job_id).conversation_id
    with h.sessions() as session:
        created = session.get(Conversation, conversation_id).last_active_at
    with UnitOfWork(h.sessions) as step:
        append_messages(step.session, conversation_id, uuid.UUID(job_id), [("user", "q", None)])
    with h.sessions() as session:
        # then its messages leave the digest's clock alone (the job holds the conversation)
        assert session.get(Conversation, conversation_id).last_active_at == created
    # when the job runs to its end
    h.stepper.run(job_id, 0, "start")
    assert h.job(job_id).status == "completed"
    with h.sessions() as session:
        conversation = session.get(Conversation, conversation_id)
        last_message = session.execute(select(Message.created_at).where(
            Message.conversation_id == conversation_id).order_by(Message.seq.desc())
            .limit(1)).scalar_one()
    # then it is idle from the moment the job let it go, after its last message
    assert conversation.active_job_id is None
    assert conversation.last_active_at > created and conversation.last_active_at >= last_message
