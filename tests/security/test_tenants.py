"""Tenants never mix, through the real stack (gunicorn, workers, Postgres, Redis).

Tenant B works normally; a key of tenant A (non-admin, and an admin key of A) then tries
every route on B's rows and B's places. Each attempt must answer as if B's row were absent
(404, or a fresh row of A's own) and must change nothing of B's."""
from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from agentq.models import ApiKey, Batch, FileRecord, Job, JobInput, Message, WebhookDelivery
from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import Client, uid, wait_until
from tests.support.busy_place import busy_place, count, write_there

pytestmark = pytest.mark.integration
ENDED = ("completed", "failed", "cancelled")



@pytest.fixture(scope="module")
def tenants(stack):
    """Two tenants, each with a non-admin key, and an admin key of A."""
    a, b = stack.create_tenant(uid("tenant-a")), stack.create_tenant(uid("tenant-b"))
    return {"a": Client(stack, stack.create_key("a", admin=False, tenant=a)),
            "a_admin": Client(stack, stack.create_key("a-admin", admin=True, tenant=a)),
            "b": Client(stack, stack.create_key("b", admin=False, tenant=b)),
            "a_id": a, "b_id": b}


def snapshot(stack, job_id: str) -> dict:
    """What must not change in B's job when A tries things on it."""
    ident = uuid.UUID(job_id)
    with stack.sessions()() as session:
        job = session.get(Job, ident)
        return {"status": job.status, "cancel_requested_at": job.cancel_requested_at,
                "inputs": count(stack, JobInput, JobInput.job_id == ident),
                "replays": count(stack, Job, Job.replay_of == ident),
                "deliveries": count(stack, WebhookDelivery, WebhookDelivery.job_id == ident),
                "conversation_jobs": count(stack, Job,
                                           Job.conversation_id == job.conversation_id),
                "messages": count(stack, Message,
                                  Message.conversation_id == job.conversation_id),
                "batches": count(stack, Batch)}


def assert_absent(response, *secrets: str) -> None:
    """404 in the error shape, and none of B's other ids in it."""
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "not_found"
    for secret in secrets:
        assert secret not in response.text


# --- A's message to B's place makes A's own conversation, whatever its on_busy -----------

@pytest.mark.parametrize("on_busy", ["reject", "steer", "interrupt", "queue"])
def test_a_message_to_another_tenants_busy_place_never_reaches_its_job(
        stack, tenants, script, on_busy):
    # given B's job running at a place (busy_place: afterwards it must have run untouched,
    # not cancelled, not steered, its history B's alone)
    with busy_place(stack, tenants["b"], script, "B") as place:
        # when A writes as the same platform user in the same channel, with each policy:
        # then A gets a job of its own in a conversation of its own
        a_job = write_there(tenants["a"], place, script, on_busy, "A")
    # the same platform user under two tenants is two users
    with stack.sessions()() as session:
        users = {session.get(Job, uuid.UUID(j["id"])).user_id for j in (a_job, place.job)}
    assert len(users) == 2


# --- B's rows, by id, from A's keys ------------------------------------------------------

@pytest.fixture(scope="module")
def b_rows(stack, tenants, llm):
    """B's ended job (with a file and webhook deliveries), its batch, its conversation."""
    b = tenants["b"]
    key = uid("s").replace("-", "_")
    marker = llm.script(key, [
        tool_calls(call("files.create_document", {"title": "b-doc", "content": "B only"})),
        text("B done"),
        text("B batch line")])
    job = b.submit(f"{marker} make B's doc", callback_url="http://127.0.0.1:9/hook")
    assert b.wait(job["id"])["status"] == "completed"
    # the callback never answers: wait until its retries are used up (the attempts stop
    # changing), so that any later delivery row is one an intruder made
    wait_until(lambda: count(stack, WebhookDelivery,
                             WebhookDelivery.job_id == uuid.UUID(job["id"]),
                             WebhookDelivery.status == "gave_up") == 1, timeout_s=60)
    response = b.post("/v1/batches", json={"requests": [{
        "platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
        "content": f"{marker} B's batch line"}]})
    assert response.status_code == 202, response.text
    batch = response.json()
    wait_until(lambda: b.get(f"/v1/batches/{batch['id']}").json()["status"] == "completed")
    llm.assert_done(key)
    with stack.sessions()() as session:
        file_id = session.execute(select(FileRecord.id).where(
            FileRecord.job_id == uuid.UUID(job["id"]))).scalar_one()
    return {"job": job["id"], "conversation": job["conversation_id"], "file": str(file_id),
            "batch": batch["id"], "created_at": job["created_at"]}


@pytest.fixture(params=["a", "a_admin"])
def intruder(request, tenants) -> Client:
    """A's non-admin key, and A's admin key: neither reaches across tenants."""
    return tenants[request.param]


def test_b_can_read_its_own_rows(tenants, b_rows):
    b = tenants["b"]
    for path in (f"/v1/jobs/{b_rows['job']}", f"/v1/jobs/{b_rows['job']}/events",
                 f"/v1/jobs/{b_rows['job']}/deliveries", f"/v1/files/{b_rows['file']}",
                 f"/v1/conversations/{b_rows['conversation']}/messages",
                 f"/v1/batches/{b_rows['batch']}", f"/v1/batches/{b_rows['batch']}/results"):
        assert b.get(path).status_code == 200, path


def test_reads_of_another_tenants_rows_are_404(stack, intruder, b_rows):
    job, others = b_rows["job"], (b_rows["conversation"], b_rows["file"], b_rows["batch"])
    before = snapshot(stack, job)
    for path, params, headers in (
            (f"/v1/jobs/{job}", {}, {}), (f"/v1/jobs/{job}", {"wait": 1}, {}),
            (f"/v1/jobs/{job}/events", {}, {}),
            (f"/v1/jobs/{job}/events", {}, {"Accept": "text/event-stream"}),
            (f"/v1/jobs/{job}/deliveries", {}, {}), (f"/v1/jobs/{job}/compare", {}, {})):
        assert_absent(intruder.get(path, params=params, headers=headers), *others)
    assert_absent(intruder.get(f"/v1/files/{b_rows['file']}"), job)
    assert_absent(intruder.get(f"/v1/conversations/{b_rows['conversation']}/messages"), job)
    for path in (f"/v1/batches/{b_rows['batch']}", f"/v1/batches/{b_rows['batch']}/results"):
        assert_absent(intruder.get(path), job)
    assert snapshot(stack, job) == before


def test_writes_on_another_tenants_rows_are_404_and_change_nothing(stack, intruder, b_rows):
    job, conversation = b_rows["job"], b_rows["conversation"]
    before = snapshot(stack, job)
    with stack.sessions()() as session:
        batch_row = session.get(Batch, uuid.UUID(b_rows["batch"]))
        batch_state = (batch_row.status, batch_row.cancel_requested_at)
    assert_absent(intruder.post(f"/v1/jobs/{job}/cancel"))
    assert_absent(intruder.post(f"/v1/jobs/{job}/deliveries/redeliver"))
    assert_absent(intruder.post(f"/v1/jobs/{job}/replay", json={"mode": "recorded"}))
    assert_absent(intruder.post("/v1/batches/replay",
                                json={"job_ids": [job], "mode": "recorded"}))
    assert_absent(intruder.post(f"/v1/batches/{b_rows['batch']}/cancel"))
    assert_absent(intruder.post("/v1/continue", json={"conversation_id": conversation,
                                                      "content": "A writes into B"}))
    # a replay batch by a filter that matches B's job (and no job of A's) matches nothing
    created = datetime.fromisoformat(b_rows["created_at"])
    response = intruder.post("/v1/batches/replay", json={"mode": "recorded", "filter": {
        "since": created.isoformat(),
        "until": (created + timedelta(milliseconds=1)).isoformat()}})
    assert response.status_code == 422 and job not in response.text
    assert snapshot(stack, job) == before
    with stack.sessions()() as session:
        batch_row = session.get(Batch, uuid.UUID(b_rows["batch"]))
        assert (batch_row.status, batch_row.cancel_requested_at) == batch_state


def test_cancel_of_another_tenants_running_job_is_404_and_it_runs_on(stack, tenants, script):
    a, b = tenants["a"], tenants["b"]
    release = threading.Event()   # B's job stays running while A tries
    marker = script([text("still B's", hold=release)])
    job = b.submit(f"{marker} long")
    try:
        wait_until(lambda: b.get(f"/v1/jobs/{job['id']}").json()["status"] == "running")
        for intruder in (a, tenants["a_admin"]):
            assert_absent(intruder.post(f"/v1/jobs/{job['id']}/cancel"))
            assert_absent(intruder.post("/v1/continue", json={
                "conversation_id": job["conversation_id"], "content": "steer?",
                "on_busy": "steer"}))
            assert_absent(intruder.post("/v1/continue", json={
                "conversation_id": job["conversation_id"], "content": "interrupt?",
                "on_busy": "interrupt"}))
        assert b.get(f"/v1/jobs/{job['id']}").json()["status"] == "running"
    finally:
        release.set()
    ended = b.wait(job["id"])
    assert ended["status"] == "completed" and ended["response"]["content"] == "still B's"
    assert count(stack, JobInput, JobInput.job_id == uuid.UUID(job["id"])) == 0


def test_a_batch_line_to_another_tenants_place_makes_a_conversation_of_its_own(
        stack, tenants, script):
    a, b = tenants["a"], tenants["b"]
    user, channel = uid("u"), uid("c")
    # given B's conversation at a place (platform, user, channel)
    b_marker = script([text("B's answer")])
    b_job = b.submit(f"{b_marker} B's secret question", user=user, channel=channel)
    assert b.wait(b_job["id"])["status"] == "completed"
    b_before = snapshot(stack, b_job["id"])

    def never_sees_b(request):
        assert "B's secret" not in str(request["messages"])
    a_marker = script([text("A's line answered", check=never_sees_b)])
    # when A's batch has a line aimed at that place
    response = a.post("/v1/batches", json={"requests": [{
        "platform": "api", "platform_user_id": user, "platform_channel_id": channel,
        "content": f"{a_marker} A's line"}]})
    assert response.status_code == 202, response.text
    batch = response.json()
    assert b_job["id"] not in response.text and b_job["conversation_id"] not in response.text
    wait_until(lambda: a.get(f"/v1/batches/{batch['id']}").json()["status"] == "completed",
               timeout_s=60)
    # then its job is A's, in a conversation of A's own
    with stack.sessions()() as session:
        line = session.execute(select(Job).where(Job.batch_id == uuid.UUID(batch["id"]))
                               ).scalar_one()
        assert str(line.tenant_id) == tenants["a_id"]
        assert str(line.conversation_id) != b_job["conversation_id"]
        assert line.user_id != session.get(Job, uuid.UUID(b_job["id"])).user_id
    results = a.get(f"/v1/batches/{batch['id']}/results")
    assert results.status_code == 200 and b_job["conversation_id"] not in results.text
    # and B's conversation has nothing of A's (A's batch is the one new batch)
    b_after = snapshot(stack, b_job["id"])
    assert b_after.pop("batches") == b_before.pop("batches") + 1
    assert b_after == b_before
    history = b.get(f"/v1/conversations/{b_job['conversation_id']}/messages").json()["data"]
    assert "A's" not in str(history)


def ui_session(stack, intruder: Client):
    """A browser session of the dashboard, signed in with the intruder's key (cookie)."""
    import requests
    http = requests.Session()
    key = intruder.http.headers["Authorization"].removeprefix("Bearer ")
    http.cookies.set("agentq_ui_key", key, path="/ui")
    http.headers["Origin"] = stack.base
    return http


def test_dashboard_pages_of_another_tenants_rows_are_absent(stack, intruder, b_rows):
    job = b_rows["job"]
    http = ui_session(stack, intruder)
    before = snapshot(stack, job)
    assert http.get(stack.base + "/ui/jobs", timeout=30).status_code == 200  # signed in
    for path in (f"/ui/jobs/{job}", f"/ui/jobs/{job}/events", f"/ui/jobs/{job}/compare"):
        response = http.get(stack.base + path, timeout=30)
        assert response.status_code == 404, (path, response.status_code)
        assert b_rows["conversation"] not in response.text and "B only" not in response.text
    for path, form in ((f"/ui/jobs/{job}/cancel", {}),
                       (f"/ui/jobs/{job}/replay", {"mode": "recorded"})):
        response = http.post(stack.base + path, data=form, timeout=30, allow_redirects=False)
        assert response.status_code == 404, (path, response.status_code, response.text[:300])
    for path in ("/ui/jobs", "/ui/batches"):
        response = http.get(stack.base + path, timeout=30)
        assert response.status_code == 200
        for secret in (job, b_rows["batch"], b_rows["conversation"]):
            assert secret not in response.text, (path, secret)
    assert snapshot(stack, job) == before


def test_code_run_python_cannot_open_another_tenants_file(stack, tenants, b_rows, script):
    a = tenants["a"]
    user = uid("u")
    tenant = stack.agentq("users", "set", "api", user, "--level", "user",
                          "--tenant", tenants["a_id"])
    assert tenant.returncode == 0, tenant.stderr
    seen: dict = {}

    def reads_the_refusal(request):
        seen["tool"] = [m for m in request["messages"] if m["role"] == "tool"][-1]["content"]
    marker = script([
        tool_calls(call("code.run_python", {"code": "import os; print(os.listdir('.'))",
                                            "file_ids": [b_rows["file"]]})),
        text("no file", check=reads_the_refusal)])
    job = a.wait(a.submit(f"{marker} read B's file", user=user)["id"], timeout_s=120)
    assert job["status"] == "completed", job
    assert f"no file {b_rows['file']} belongs to this user" in seen["tool"]
    assert "B only" not in seen["tool"] and "b-doc" not in seen["tool"]
    with stack.sessions()() as session:
        from agentq.models import ToolCall
        row = session.execute(select(ToolCall).where(ToolCall.job_id == uuid.UUID(job["id"]))
                              ).scalar_one()
        assert row.result["ok"] is False and "B only" not in json.dumps(row.result)


def test_a_persona_of_another_tenant_cannot_be_named_in_a_replay(stack, tenants, script):
    from agentq.models import Persona
    a = tenants["a"]
    with stack.sessions()() as session, session.begin():
        persona = Persona(id=uuid.uuid4(), tenant_id=uuid.UUID(tenants["b_id"]),
                          name="B's persona", system_prompt="B's secret prompt")
        session.add(persona)
    marker = script([text("A's")])
    job = a.submit(f"{marker} mine")
    a.wait(job["id"])
    response = a.post(f"/v1/jobs/{job['id']}/replay",
                      json={"mode": "live", "persona_id": str(persona.id)})
    assert_absent(response)
    assert count(stack, Job, Job.replay_of == uuid.UUID(job["id"])) == 0


def test_the_tenant_admin_routes_never_reach_another_tenants_rows(stack, tenants, b_rows):
    """/v1/personas, /v1/users, /v1/users/<id>/links, approve/deny (API.md 1.1): A's
    non-admin key gets 403 (admin routes), A's admin key 404 as if absent; nothing of B's
    changes."""
    from agentq.models import Persona, User
    with stack.sessions()() as session, session.begin():
        persona = Persona(id=uuid.uuid4(), tenant_id=uuid.UUID(tenants["b_id"]),
                          name="B's own", system_prompt="B's prompt")
        session.add(persona)
        user_id = session.get(Job, uuid.UUID(b_rows["job"])).user_id
        level = session.get(User, user_id).permission_level
    job, pid, user = b_rows["job"], str(persona.id), str(user_id)
    calls = [("get", f"/v1/personas/{pid}", None),
             ("patch", f"/v1/personas/{pid}", {"name": "A's now"}),
             ("delete", f"/v1/personas/{pid}", None),
             ("get", f"/v1/users/{user}", None),
             ("patch", f"/v1/users/{user}", {"permission_level": "owner"}),
             ("post", f"/v1/users/{user}/links", {"platform": "a", "platform_user_id": "a"})]
    for method, path, body in calls:
        response = tenants["a"].http.request(method.upper(), tenants["a"].url(path),
                                             json=body, timeout=70)
        assert response.status_code == 403, (path, response.text)
        assert_absent(tenants["a_admin"].http.request(
            method.upper(), tenants["a_admin"].url(path), json=body, timeout=70), job)
    for intruder in (tenants["a"], tenants["a_admin"]):
        for decision in ("approve", "deny"):
            assert_absent(intruder.post(f"/v1/jobs/{job}/tool_calls/t_1/{decision}"))
    with stack.sessions()() as session:
        kept = session.get(Persona, persona.id)
        assert kept is not None and kept.name == "B's own"
        assert session.get(User, user_id).permission_level == level
    assert tenants["b"].get(f"/v1/jobs/{job}").status_code == 200


def test_idempotency_keys_are_per_tenant(stack, tenants, script):
    a, b = tenants["a"], tenants["b"]
    marker = script([text("one"), text("two")])
    body = {"platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
            "content": f"{marker} same"}
    first = b.post("/v1/messages", json=body, headers={"Idempotency-Key": "k-1"}).json()
    second = a.post("/v1/messages", json=body, headers={"Idempotency-Key": "k-1"})
    assert second.status_code == 202 and second.json()["id"] != first["id"]
    b.wait(first["id"]), a.wait(second.json()["id"])


# --- admin ------------------------------------------------------------------------------

def test_admin_routes_need_an_admin_key(tenants):
    a = tenants["a"]
    for method, path, body in (("get", "/v1/admin/tenants", None),
                               ("post", "/v1/admin/tenants", {"name": uid("t")}),
                               ("get", "/v1/admin/keys", None),
                               ("post", "/v1/admin/keys", {"name": "x",
                                                           "tenant_id": tenants["b_id"]}),
                               ("post", f"/v1/admin/keys/{uuid.uuid4()}/revoke", None)):
        response = getattr(a, method)(path, json=body) if body else getattr(a, method)(path)
        assert response.status_code == 403, (path, response.text)
        assert response.json()["error"]["code"] == "forbidden"


def test_an_admin_makes_a_tenant_and_a_key_that_works_then_revokes_it(stack, client, script):
    # given the default tenant's admin key (`client`)
    response = client.post("/v1/admin/tenants", json={"name": uid("t")})
    assert response.status_code == 201, response.text
    tenant = response.json()
    assert client.post("/v1/admin/tenants", json={"name": tenant["name"]}).status_code == 409
    assert tenant["id"] in {t["id"] for t in client.get("/v1/admin/tenants").json()["data"]}
    # when it makes a key of that tenant
    response = client.post("/v1/admin/keys", json={"name": "new", "tenant_id": tenant["id"]})
    assert response.status_code == 201, response.text
    made = response.json()
    assert made["tenant_id"] == tenant["id"] and made["admin"] is False
    listed = {k["id"]: k for k in client.get("/v1/admin/keys").json()["data"]}
    assert "key" not in listed[made["id"]] and made["key"] not in str(listed)
    # then the key works, in its tenant
    new = Client(stack, made["key"])
    marker = script([text("hello")])
    job = new.submit(f"{marker} hi")
    with stack.sessions()() as session:
        assert str(session.get(Job, uuid.UUID(job["id"])).tenant_id) == tenant["id"]
    new.wait(job["id"])
    assert client.get(f"/v1/jobs/{job['id']}").status_code == 404  # another tenant's job
    # and once revoked it does not
    assert client.post(f"/v1/admin/keys/{made['id']}/revoke").status_code == 200
    assert new.get(f"/v1/jobs/{job['id']}").status_code == 401
    assert client.post("/v1/admin/keys", json={"name": "x", "tenant_id": str(uuid.uuid4())}
                       ).status_code == 422


def test_keys_made_without_a_tenant_are_the_default_tenants(stack):
    key = stack.create_key("plain", admin=False)
    from agentq.keys import lookup
    from agentq.tenants import DEFAULT_TENANT_ID
    with stack.sessions()() as session:
        assert lookup(session, key).tenant_id == DEFAULT_TENANT_ID
        assert count(stack, ApiKey, ApiKey.tenant_id.is_(None)) == 0


def test_the_cli_lists_tenants_and_refuses_a_key_of_an_unknown_tenant(stack, tenants):
    listed = [json.loads(line) for line in stack.agentq("tenants", "list").stdout.splitlines()]
    names = {t["name"] for t in listed}
    assert "default" in names and {tenants["a_id"], tenants["b_id"]} <= {t["id"] for t in listed}
    refused = stack.agentq("keys", "create", "x", "--tenant", "no-such-tenant")
    assert refused.returncode != 0 and "No tenant" in refused.stderr
    assert refused.stdout.strip() == ""
    taken = stack.agentq("tenants", "create", "default")
    assert taken.returncode != 0 and "exists already" in taken.stderr


# --- the migration ------------------------------------------------------------------------

def test_the_migration_puts_existing_rows_and_keys_in_the_default_tenant(servers_up):
    import os

    from sqlalchemy import create_engine
    from sqlalchemy import text as sql

    from agentq import migrate
    from agentq.config import Settings
    from agentq.db import session_scope
    from agentq.keys import hash_key, lookup
    from agentq.loop.identity import Incoming, resolve_conversation, resolve_user
    from agentq.tenants import DEFAULT_TENANT_ID
    from tests.support.stack import create_empty_database, drop_database
    name = f"agentq_tenants_{os.getpid()}"
    url = create_empty_database(name)
    try:
        settings = Settings.from_env({"AGENTQ_DATABASE_URL": url})
        migrate.upgrade(settings, "0002_clients_batches_replay")
        # given a key, a user and a conversation written before tenants existed
        engine = create_engine(settings.database_url)
        user_id, conversation_id = uuid.uuid4(), uuid.uuid4()
        with engine.begin() as conn:
            conn.execute(sql("INSERT INTO api_keys (id, name, key_hash, prefix, is_admin, "
                             "created_at) VALUES (:id, 'old', :h, 'aq_old', false, now())"),
                         {"id": uuid.uuid4(), "h": hash_key("aq_old-key")})
            conn.execute(sql("INSERT INTO users (id, permission_level, "
                             "tokens_used_this_month, budget_reset_at, created_at) VALUES "
                             "(:id, 'user', 0, now(), now())"), {"id": user_id})
            conn.execute(sql("INSERT INTO user_platform_links (id, user_id, platform, "
                             "platform_user_id, created_at) VALUES (:id, :u, 'api', 'old-u', "
                             "now())"), {"id": uuid.uuid4(), "u": user_id})
            conn.execute(sql("INSERT INTO conversations (id, user_id, platform, "
                             "platform_channel_id, scope_key, message_seq, started_at, "
                             "last_active_at, is_summarized) VALUES (:id, :u, 'api', 'old-c', "
                             "'[\"api\",\"old-c\",null]', 0, now(), now(), false)"),
                         {"id": conversation_id, "u": user_id})
        engine.dispose()
        # when
        migrate.upgrade(settings)
        # then the key works, in the default tenant, and the old place is the same
        # conversation of the same user
        with session_scope(settings) as session:
            assert lookup(session, "aq_old-key").tenant_id == DEFAULT_TENANT_ID
            incoming = Incoming("api", "old-u", "old-c")
            user = resolve_user(session, DEFAULT_TENANT_ID, incoming, settings)
            assert user.id == user_id
            assert resolve_conversation(session, user, incoming, None).id == conversation_id
        migrate.downgrade(settings, "0002_clients_batches_replay")
        from agentq.db import dispose_engines
        dispose_engines()
    finally:
        drop_database(name)
