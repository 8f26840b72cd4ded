"""What a submit sends to Postgres (issue 34: round trips per job), and that the rows a
client sees are the same: the job, the conversation it takes or waits for."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from agentq.db import session_scope
from agentq.keys import create_key
from agentq.loop.identity import Incoming
from agentq.loop.submit import Submission, submit
from agentq.loop.uow import UnitOfWork
from agentq.models import Conversation, IdempotencyKey, Job, User, UserPlatformLink
from agentq.tenants import create_tenant, forget_cached_quotas, update_quotas
from tests.support.sql import sql_sent


@pytest.fixture
def make(make_pg):
    """Harnesses on Postgres, whatever AGENTQ_UNIT_DB says: the statements are counted on
    the dialect that folds them."""
    return make_pg


def _tenant_with_running_quota(h, name: str, running_jobs: int):
    """A new tenant whose running-jobs quota is `running_jobs`, this process's cache of
    quotas forgotten."""
    with session_scope(h.settings) as session:
        tenant = create_tenant(session, f"{name}-{uuid.uuid4().hex[:6]}")
        update_quotas(session, tenant, {"running_jobs": running_jobs})
    forget_cached_quotas()
    return tenant


def _submit(h, user: str, channel: str, **fields) -> tuple[Job, list[str]]:
    with sql_sent(h.sessions.kw["bind"]) as statements:
        with UnitOfWork(h.sessions) as uow:
            job = submit(uow, h.settings, Submission(Incoming("test", user, channel),
                                                     "What is 2+2?", **fields)).job
    return job, statements


def _rows(h, job_id: uuid.UUID) -> tuple[Job, Conversation]:
    with h.sessions() as session:
        job = session.get(Job, job_id)
        return job, session.get(Conversation, job.conversation_id)


def test_a_message_to_a_new_place_takes_its_conversation_without_locking_it(make):
    # given a user and a place never seen (the tenant's quotas read already: a process
    # keeps them for a few seconds)
    h = make()
    _submit(h, "u-earlier", f"c-{uuid.uuid4().hex[:8]}")
    # when a message comes in
    job, statements = _submit(h, f"u-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}")
    # then the user, its link and the conversation are made in one statement, and the job
    # is written with the conversation taking it in one statement; the new conversation
    # (nobody else sees it before the commit) is neither read again nor locked
    assert not any("FOR NO KEY UPDATE" in s or "FOR UPDATE" in s for s in statements)
    written = [s for s in statements if "INSERT INTO jobs" in s]
    assert len(written) == 1 and "UPDATE conversations" in written[0]
    made = [s for s in statements if "INSERT INTO users" in s]
    assert len(made) == 1 and "INSERT INTO user_platform_links" in made[0]
    assert "INSERT INTO conversations" in made[0]
    assert len(statements) == 3  # find, link+user+conversation, job+conversation+quota
    # and the rows are as before: the job queued, the conversation its
    stored, conversation = _rows(h, job.id)
    assert stored.status == "queued" and stored.waiting_for is None
    assert conversation.active_job_id == job.id
    with h.sessions() as session:
        user = session.get(User, stored.user_id)
        link = session.execute(select(UserPlatformLink).where(
            UserPlatformLink.user_id == user.id)).scalar_one()
    assert user.permission_level == "guest" and link.platform == "test"


def test_a_message_to_a_free_conversation_locks_it_by_the_owner_it_read(make):
    # given a conversation whose job has ended
    h = make()
    user, channel = f"u-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    first, _ = _submit(h, user, channel)
    with UnitOfWork(h.sessions) as uow:
        uow.session.get(Conversation, first.conversation_id).active_job_id = None
    # when the next message comes in
    job, statements = _submit(h, user, channel)
    # then the owner its lookup read (none) is not read again before the lock
    assert len(statements) == 3  # find, lock, job+conversation+quota
    stored, conversation = _rows(h, job.id)
    assert conversation.id == first.conversation_id and conversation.active_job_id == job.id
    assert stored.status == "queued" and stored.waiting_for is None


def test_a_message_to_a_busy_conversation_waits_for_it(make):
    # given a conversation that runs a job
    h = make()
    user, channel = f"u-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    first, _ = _submit(h, user, channel)
    # when the next message comes in (on_busy: queue)
    job, statements = _submit(h, user, channel)
    # then its owner is locked, then the conversation (the owner read once: the locked
    # job is the one answered), and the job is written alone (the conversation's row does
    # not change)
    assert len(statements) == 4  # find, lock owner, lock conversation, job
    stored, conversation = _rows(h, job.id)
    assert conversation.active_job_id == first.id
    assert stored.waiting_for == "conversation"


def test_a_keyed_message_claims_its_key_for_its_job_in_one_statement(make):
    # given the API in this process, an admin key, and a message with an Idempotency-Key
    from api import create_app
    h = make()
    with session_scope(h.settings) as session:
        _, secret = create_key(session, "keyed", admin=True)
    client = create_app(h.settings).test_client()
    headers = {"Authorization": f"Bearer {secret}", "Idempotency-Key": "k-1"}
    body = {"platform": "api", "platform_user_id": f"u-{uuid.uuid4().hex[:8]}",
            "platform_channel_id": "c-1", "content": "What is 2+2?"}
    # when it is sent
    with sql_sent(h.sessions.kw["bind"]) as statements:
        first = client.post("/v1/messages", headers=headers, json=body)
    # then the key is taken for the new job's id by one INSERT, nothing read or updated
    assert first.status_code == 202, first.get_data(as_text=True)
    keyed = [s for s in statements if "idempotency_keys" in s]
    assert len(keyed) == 1 and keyed[0].startswith("INSERT INTO idempotency_keys")
    job_id = first.get_json()["id"]
    with h.sessions() as session:
        row = session.execute(select(IdempotencyKey).where(IdempotencyKey.key == "k-1")
                              ).scalar_one()
        assert str(row.job_id) == job_id and session.get(Job, row.job_id) is not None
    # and the same request again answers that job, replayed; another body is refused
    again = client.post("/v1/messages", headers=headers, json=body)
    assert again.get_json()["id"] == job_id
    assert again.headers["Idempotent-Replayed"] == "true"
    other = client.post("/v1/messages", headers=headers, json={**body, "content": "2+3?"})
    assert other.status_code == 422
    assert other.get_json()["error"]["code"] == "idempotency_key_reused"


def test_a_message_past_the_running_jobs_quota_waits_for_it(make):
    # given a tenant whose running-jobs quota one job fills
    h = make()
    tenant = _tenant_with_running_quota(h, "busy", 1)
    first, _ = _submit(h, "u-1", f"c-{uuid.uuid4().hex[:8]}", tenant_id=tenant.id)
    # when a message comes in at another place
    second, statements = _submit(h, "u-1", f"c-{uuid.uuid4().hex[:8]}", tenant_id=tenant.id)
    # then the count the job's statement read holds it for the quota (one UPDATE more, on
    # this path only), and the first was let start
    assert [s for s in statements if "count(*)" in s] == [
        s for s in statements if "INSERT INTO jobs" in s]
    assert _rows(h, first.id)[0].waiting_for is None
    stored, conversation = _rows(h, second.id)
    assert stored.waiting_for == "quota" and conversation.active_job_id == second.id


def test_a_submits_running_count_stops_at_the_quota(make):
    # given a tenant with a quota of three running jobs, all three running
    from sqlalchemy import select

    from agentq.tenants import RUNNING_NOW
    h = make()
    tenant = _tenant_with_running_quota(h, "backlog", 3)
    for _ in range(3):
        _submit(h, "u-1", f"c-{uuid.uuid4().hex[:8]}", tenant_id=tenant.id)
    # when the submit's count reads them with a cap below, at and above them
    with h.sessions() as session:
        def count(cap):
            return session.execute(select(RUNNING_NOW), {
                "running_tenant": tenant.id, "running_cap": cap}).scalar_one()
        counted = [count(cap) for cap in (2, 3, 10)]
    # then it stops at the cap (whether the quota is full is all a submit asks)
    assert counted == [2, 3, 3]
    # and the next message, the quota full, waits for it
    held, _ = _submit(h, "u-1", f"c-{uuid.uuid4().hex[:8]}", tenant_id=tenant.id)
    assert _rows(h, held.id)[0].waiting_for == "quota"


def test_two_messages_to_a_new_place_in_one_transaction_queue_as_before(make):
    # given a place never seen
    h = make()
    user, channel = f"u-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    # when two messages to it are submitted in one unit of work (the CLI's, a test's)
    with UnitOfWork(h.sessions) as uow:
        first, second = (submit(uow, h.settings, Submission(Incoming("test", user, channel),
                                                           content)).job
                         for content in ("one", "two"))
    # then the conversation this transaction made is the first's, and the second waits
    _, conversation = _rows(h, first.id)
    assert conversation.active_job_id == first.id
    assert _rows(h, second.id)[0].waiting_for == "conversation"
