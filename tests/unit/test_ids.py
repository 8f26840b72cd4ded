"""Row ids are time-ordered (UUIDv7), and a job's events are keyed by (job, seq) with no id
of their own (agentq/ids.py; migration 0024)."""
from __future__ import annotations

import time
import uuid

from sqlalchemy import inspect, select

from agentq.ids import new_id
from agentq.models import Conversation, Job, JobEvent, Message, TokenLog, ToolCall
from agentq.testing.harness import calls, text


def _millis(ident: uuid.UUID) -> int:
    return ident.int >> 80


def test_a_new_id_is_a_plain_uuid7_stamped_no_earlier_than_it_was_made():
    before = time.time_ns() // 1_000_000
    ident = new_id()
    assert type(ident) is uuid.UUID  # nothing of the library's leaks into rows or JSON
    assert (ident.version, ident.variant) == (7, uuid.RFC_4122)
    # (not after either, but for ids made faster than one per millisecond's counter: the
    # library then steps its clock ahead to keep them in order)
    assert before <= _millis(ident)


def test_ids_made_one_after_another_sort_in_the_order_they_were_made():
    made = [new_id() for _ in range(5000)]  # many within one millisecond: the counter orders them
    assert sorted(made) == made
    assert len(set(made)) == len(made)


def test_a_job_and_the_rows_it_makes_have_time_ordered_ids(make):
    h = make(calls(("math.evaluate", {"expression": "2+2"})), text("4"))
    job_id = h.submit("What is 2+2?")
    h.drive(job_id)
    assert h.job(job_id).status == "completed"
    job = h.job(job_id)
    rows = [job, h.user_of(job_id), *h.rows(Message, job_id), *h.rows(TokenLog, job_id),
            *h.rows(ToolCall, job_id)]
    with h.sessions() as session:
        rows.append(session.get(Conversation, job.conversation_id))
    assert {type(r).__name__ for r in rows} >= {"Job", "User", "Message", "TokenLog",
                                                "ToolCall", "Conversation"}
    assert {r.id.version for r in rows} == {7}


def test_a_jobs_events_are_named_by_the_job_and_their_number(make):
    h = make(calls(("math.evaluate", {"expression": "2+2"})), text("4"))
    job_id = h.submit("What is 2+2?")
    h.drive(job_id)
    key = [c.name for c in inspect(JobEvent).primary_key]
    assert key == ["job_id", "seq"] and not hasattr(JobEvent, "id")
    with h.sessions() as session:
        seqs = session.execute(select(JobEvent.seq).where(
            JobEvent.job_id == uuid.UUID(job_id)).order_by(JobEvent.seq)).scalars().all()
        counted = session.get(Job, uuid.UUID(job_id)).event_seq
    assert seqs == list(range(1, counted + 1))  # every event written, numbered without a gap



def test_the_dashboard_tells_apart_ids_made_in_the_same_minute():
    from api.views import short_id
    made = [new_id() for _ in range(1000)]
    assert len({str(i)[:8] for i in made}) <= 2  # a v7's head is its time (a new one each 65 s)
    shown = {short_id(i) for i in made}
    assert len(shown) == len(made) and all(str(i).endswith(short_id(i)) for i in made)
