"""Webhook deliveries without servers: a SQLite database, jobs ended by `end_job`, and a
fake sender in place of HTTP. The retry schedule is zero so each retry is due at once."""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from sqlalchemy import select, update
from standardwebhooks import Webhook

from agentq.config import Settings
from agentq.db import dispose_engines, session_factory, session_scope, utcnow
from agentq.errors import Conflict
from agentq.loop.effects import JobEnded, SendWebhooks
from agentq.loop.identity import Incoming
from agentq.loop.lifecycle import end_job
from agentq.loop.submit import Submission, create_job
from agentq.loop.sweeper import sweep_deliveries
from agentq.loop.uow import UnitOfWork
from agentq.models import Job, WebhookDelivery
from agentq.views import batch_counts, batch_object, job_object
from agentq.webhooks.delivery import (
    RETRY_AFTER_MAX_S,
    Answer,
    attempt_delivery,
    parse_retry_after,
    redeliver_job_event,
    retry_delay_s,
)
from tests.support import unit_db

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
URL = "https://93.184.216.34/hooks/agentq"  # public literal: checked, never connected to


@pytest.fixture(autouse=True)
def _engines():
    yield
    dispose_engines()


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path),
                                 "AGENTQ_WEBHOOK_SECRET": SECRET,
                                 "AGENTQ_WEBHOOK_RETRY_SCHEDULE_S": "0,0,0"})
    return settings


class Receiver:
    """A fake sender: answers from a list (the last answer repeats), records each request."""

    def __init__(self, *answers):
        self.answers = list(answers) or [Answer(200)]
        self.requests: list[dict] = []

    def __call__(self, target, body, headers, timeout_s):
        self.requests.append({"url": target.url, "body": body, "headers": dict(headers)})
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ended_job(settings, status="completed", callback_url=URL) -> str:
    with UnitOfWork(session_factory(settings)) as uow:
        job = create_job(uow, settings, Submission(
            Incoming("test", f"u-{uuid.uuid4().hex[:6]}", "chan"), "hello",
            callback_url=callback_url))
        end_job(uow, job, "end_turn" if status == "completed" else "error", "done", None)
        return str(job.id)


def rows(settings, job_id) -> list[WebhookDelivery]:
    with session_factory(settings)() as session:
        return list(session.execute(
            select(WebhookDelivery).where(WebhookDelivery.job_id == uuid.UUID(job_id))
            .order_by(WebhookDelivery.created_at, WebhookDelivery.attempt)).scalars())


def run_until_done(settings, delivery_id, send) -> list[str]:
    statuses = []
    while delivery_id:
        outcome = attempt_delivery(delivery_id, settings=settings, send=send)
        statuses.append(outcome.status)
        delivery_id = outcome.retry_id
    return statuses


# --- the first row ------------------------------------------------------------------------

def test_ending_a_job_with_a_callback_writes_its_first_delivery(settings, effects):
    job_id = ended_job(settings, "failed")
    [row] = rows(settings, job_id)
    assert (row.status, row.attempt, row.event_type, row.url) == ("pending", 1, "job.failed",
                                                                   URL)
    assert row.event_id.startswith("msg_") and row.next_attempt_at is not None
    # sent after the commit: the job's end, then its delivery's first attempt
    assert effects.sent[-2:] == [JobEnded(job_id, "failed", "error"),
                                 SendWebhooks((str(row.id),))]


def test_a_job_without_callback_writes_none(settings):
    assert rows(settings, ended_job(settings, callback_url=None)) == []


# --- attempts -----------------------------------------------------------------------------

def test_a_good_delivery_is_signed_and_carries_the_job_object(settings):
    job_id = ended_job(settings)
    receiver = Receiver(Answer(204))
    assert run_until_done(settings, str(rows(settings, job_id)[0].id), receiver) == \
        ["succeeded"]
    [request] = receiver.requests
    payload = Webhook(SECRET).verify(request["body"], request["headers"])
    with session_factory(settings)() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert payload == {"type": "job.completed", "timestamp": job.finished_at.isoformat(),
                           "data": json.loads(json.dumps(job_object(job)))}
    assert request["headers"]["Content-Type"] == "application/json"
    [row] = rows(settings, job_id)
    assert (row.status, row.status_code, row.error, row.next_attempt_at) == \
        ("succeeded", 204, None, None)
    assert row.latency_ms is not None and row.latency_ms >= 0


def test_failures_retry_with_the_same_id_and_body(settings):
    job_id = ended_job(settings)
    receiver = Receiver(Answer(500), Answer(302), Answer(200))
    statuses = run_until_done(settings, str(rows(settings, job_id)[0].id), receiver)
    assert statuses == ["failed", "failed", "succeeded"]
    found = rows(settings, job_id)
    assert [(r.attempt, r.status, r.status_code) for r in found] == \
        [(1, "failed", 500), (2, "failed", 302), (3, "succeeded", 200)]
    assert "Redirect" in found[1].error
    assert len({r.event_id for r in found}) == 1
    assert len({q["headers"]["webhook-id"] for q in receiver.requests}) == 1
    assert len({q["body"] for q in receiver.requests}) == 1


def test_410_gives_up_at_once(settings):
    job_id = ended_job(settings)
    receiver = Receiver(Answer(410))
    assert run_until_done(settings, str(rows(settings, job_id)[0].id), receiver) == \
        ["gave_up"]
    assert [r.status for r in rows(settings, job_id)] == ["gave_up"]


def test_the_schedule_running_out_gives_up(settings):
    job_id = ended_job(settings)
    receiver = Receiver(httpx.ConnectError("connection refused"))
    statuses = run_until_done(settings, str(rows(settings, job_id)[0].id), receiver)
    assert statuses == ["failed", "failed", "failed", "gave_up"]  # 1 try + 3 retries
    last = rows(settings, job_id)[-1]
    assert last.attempt == 4 and "ConnectError" in last.error and last.status_code is None


def test_a_timeout_is_a_failure_naming_the_limit(settings):
    job_id = ended_job(settings)
    receiver = Receiver(httpx.ReadTimeout("slow"), Answer(200))
    assert run_until_done(settings, str(rows(settings, job_id)[0].id), receiver) == \
        ["failed", "succeeded"]
    assert "No answer within" in rows(settings, job_id)[0].error


def test_a_private_target_at_send_time_fails_without_sending(settings):
    job_id = ended_job(settings, callback_url="http://10.0.0.8/hook")
    receiver = Receiver()
    outcome = attempt_delivery(str(rows(settings, job_id)[0].id), settings=settings,
                               send=receiver)
    assert outcome.status == "failed" and receiver.requests == []
    assert "private" in rows(settings, job_id)[0].error


def test_a_second_message_for_the_same_row_does_nothing(settings):
    job_id = ended_job(settings)
    delivery_id = str(rows(settings, job_id)[0].id)
    receiver = Receiver()
    assert attempt_delivery(delivery_id, settings=settings, send=receiver).status == \
        "succeeded"
    assert attempt_delivery(delivery_id, settings=settings, send=receiver).status == \
        "skipped"
    assert len(receiver.requests) == 1


def test_a_row_not_yet_due_is_not_sent(settings):
    job_id = ended_job(settings)
    delivery_id = rows(settings, job_id)[0].id
    with session_scope(settings) as session:
        session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id)
                        .values(next_attempt_at=utcnow() + timedelta(minutes=5)))
    receiver = Receiver()
    assert attempt_delivery(str(delivery_id), settings=settings, send=receiver).status == \
        "skipped"
    assert receiver.requests == []


# --- retry delays -------------------------------------------------------------------------

def test_retry_delays_follow_the_schedule_and_honour_retry_after():
    schedule = (5.0, 30.0)
    assert retry_delay_s(schedule, 1) == 5.0
    assert retry_delay_s(schedule, 2) == 30.0
    assert retry_delay_s(schedule, 3) is None
    assert retry_delay_s(schedule, 1, retry_after_s=120) == 120
    assert retry_delay_s(schedule, 2, retry_after_s=1) == 30.0
    assert retry_delay_s(schedule, 1, retry_after_s=10 ** 9) == RETRY_AFTER_MAX_S


def test_retry_after_in_seconds_or_as_a_date():
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_retry_after("120", now) == 120
    assert parse_retry_after("Wed, 01 May 2024 12:01:00 GMT", now) == 60
    assert parse_retry_after("Wed, 01 May 2024 11:00:00 GMT", now) == 0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


def test_a_retry_waits_for_retry_after(settings):
    job_id = ended_job(settings)
    outcome = attempt_delivery(str(rows(settings, job_id)[0].id), settings=settings,
                               send=Receiver(Answer(503, retry_after="90")))
    assert outcome.status == "failed" and outcome.retry_in_s == 90
    retry = rows(settings, job_id)[1]
    assert retry.status == "pending" and retry.attempt == 2
    assert retry.next_attempt_at > utcnow() + timedelta(seconds=80)


# --- redelivery and the sweeper -----------------------------------------------------------

def test_redelivery_is_a_new_attempt_of_the_same_event(settings):
    job_id = ended_job(settings)
    first = rows(settings, job_id)[0]
    run_until_done(settings, str(first.id), Receiver())
    with session_scope(settings) as session:
        again = redeliver_job_event(session, session.get(Job, uuid.UUID(job_id)))
        again_id = str(again.id)
    # a second redelivery while this one is pending is refused
    with session_scope(settings) as session, pytest.raises(Conflict):
        redeliver_job_event(session, session.get(Job, uuid.UUID(job_id)))
    receiver = Receiver()
    assert run_until_done(settings, again_id, receiver) == ["succeeded"]
    found = rows(settings, job_id)
    assert [(r.attempt, r.event_id) for r in found] == [(1, first.event_id),
                                                       (2, first.event_id)]
    assert receiver.requests[0]["headers"]["webhook-id"] == first.event_id


def test_redelivery_needs_an_ended_job_with_a_callback(settings):
    job_id = ended_job(settings, callback_url=None)
    with session_scope(settings) as session, pytest.raises(Conflict):
        redeliver_job_event(session, session.get(Job, uuid.UUID(job_id)))
    with UnitOfWork(session_factory(settings)) as uow:
        job = create_job(uow, settings, Submission(Incoming("test", "u-r", "c"), "hi",
                                                   callback_url=URL))
        with pytest.raises(Conflict):
            redeliver_job_event(uow.session, job)


def test_the_sweeper_picks_up_overdue_deliveries_once(settings):
    job_id = ended_job(settings)
    delivery_id = rows(settings, job_id)[0].id
    sessions = session_factory(settings)
    assert sweep_deliveries(settings, sessions) == []  # due now, not overdue
    with session_scope(settings) as session:
        session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id)
                        .values(next_attempt_at=utcnow() - timedelta(
                            seconds=settings.webhook_overdue_s + 5)))
    assert sweep_deliveries(settings, sessions) == [str(delivery_id)]
    assert sweep_deliveries(settings, sessions) == []  # marked due now: not again at once
    assert attempt_delivery(str(delivery_id), settings=settings,
                            send=Receiver()).status == "succeeded"


def test_a_batch_event_carries_the_batch_object(settings):
    # given an ended batch with a callback (its event row written as agentq.batches does)
    from agentq.models import Batch
    from agentq.tenants import DEFAULT_TENANT_ID
    from agentq.webhooks.delivery import enqueue_event
    with session_scope(settings) as session:
        batch = Batch(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID, status="completed",
                      total=0, callback_url=URL, meta={"k": "v"}, created_at=utcnow(),
                      finished_at=utcnow())
        session.add(batch)
        delivery = enqueue_event(session, tenant_id=batch.tenant_id,
                                 event_type="batch.completed", url=URL,
                                 batch_id=batch.id, due=batch.finished_at)
        delivery_id, batch_id = str(delivery.id), batch.id
    receiver = Receiver()
    assert attempt_delivery(delivery_id, settings=settings, send=receiver).status == \
        "succeeded"
    payload = Webhook(SECRET).verify(receiver.requests[0]["body"],
                                     receiver.requests[0]["headers"])
    with session_factory(settings)() as session:
        batch = session.get(Batch, batch_id)
        expected = batch_object(batch, batch_counts(session, batch_id))
    assert payload == {"type": "batch.completed", "timestamp": batch.finished_at.isoformat(),
                       "data": expected}


def test_an_attempt_whose_record_could_not_reach_the_database_is_recorded_when_it_answers(
        settings):
    from sqlalchemy.exc import OperationalError
    # given a pending delivery, and a database that goes away while the receiver answers:
    # the attempt's record fails twice
    job_id = ended_job(settings)
    receiver = Receiver(Answer(204))
    sessions = session_factory(settings)
    failures = [OperationalError("BEGIN", {}, Exception("gone"))] * 2

    def flaky_sessions():
        if receiver.requests and failures:
            raise failures.pop()
        return sessions()
    # when its attempt runs
    outcome = attempt_delivery(str(rows(settings, job_id)[0].id), settings=settings,
                               sessions=flaky_sessions, send=receiver)
    # then the answer was recorded once the database answered: sent once, not again
    assert not failures
    assert outcome.status == "succeeded" and len(receiver.requests) == 1
    [row] = rows(settings, job_id)
    assert (row.status, row.status_code) == ("succeeded", 204)


def test_an_attempt_whose_job_read_a_migration_made_stale_is_made_at_once(tmp_path, effects):
    # given a pool of one connection on which the read of an event's job is prepared
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), "AGENTQ_WEBHOOK_SECRET": SECRET,
                                 "AGENTQ_WEBHOOK_RETRY_SCHEDULE_S": "0,0,0",
                                 "AGENTQ_DB_POOL_SIZE": "1",
                                 "AGENTQ_DB_PREPARE_THRESHOLD": "1"}, backend="postgres")
    job_id = ended_job(settings)
    [row] = rows(settings, job_id)
    first = attempt_delivery(str(row.id), settings=settings, send=Receiver(Answer(500)))
    assert first.status == "failed" and first.retry_id
    # when a migration changes the type of a column that read answers (agentq.prepared:
    # the prepared read fails once as StalePlan, an error to run again)
    other = create_engine(settings.database_url, poolclass=NullPool)
    with other.begin() as conn:
        conn.execute(text("ALTER TABLE jobs ALTER COLUMN custom_id TYPE text"))
    other.dispose()
    # then the next attempt is claimed and sent all the same, not left to the sweeper
    receiver = Receiver()
    assert attempt_delivery(first.retry_id, settings=settings, send=receiver).status == \
        "succeeded"
    assert len(receiver.requests) == 1
