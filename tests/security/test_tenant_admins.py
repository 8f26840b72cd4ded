"""Issue 30's tenant boundary, each attack through the real stack (gunicorn, workers, beat,
Postgres, Redis) with the production defaults: a tenant admin is its tenant's admin only
(operators alone reach across tenants), a non-admin key's conversations and memories are
its own, a revoked key's schedules stop, and a tenant's quotas hold. Each attempt asserts
the refusal and that nothing was written."""
from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select, update

from agentq.config.quotas import Quotas
from agentq.models import ApiKey, Memory, Schedule, ScheduleFiring, Tenant, ToolCall
from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import Client, uid, wait_until
from tests.support.busy_place import busy_place, count, write_there

pytestmark = pytest.mark.integration
FACT = "The user's locker code is 4711."
EMBED = text("(an embedding)")


class Http(Client):
    def call(self, method: str, path: str, body=None):
        return self.http.request(method, self.url(path), json=body, timeout=70)


def refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"} and error["code"] == code, error
    return error


@pytest.fixture(scope="module")
def acme(stack):
    """Tenant acme with an admin key made as the README shows (`agentq keys create acme-ops
    --tenant acme --admin`, the command itself) and two plain keys; tenant globex with an
    admin and a plain key that keeps working."""
    acme_name, globex_name = uid("acme"), uid("globex")
    acme_id, globex_id = stack.create_tenant(acme_name), stack.create_tenant(globex_name)
    made = stack.agentq("keys", "create", "acme-ops", "--tenant", acme_name, "--admin")
    assert made.returncode == 0, made.stderr
    return {"id": acme_id, "name": acme_name, "globex": globex_id,
            "admin": Http(stack, made.stdout.strip()),
            "one": Http(stack, stack.create_key("acme-one", admin=False, tenant=acme_id)),
            "two": Http(stack, stack.create_key("acme-two", admin=False, tenant=acme_id)),
            "globex_admin": Http(stack, stack.create_key("globex-ops", admin=True,
                                                         tenant=globex_id)),
            "globex_plain": Http(stack, stack.create_key("globex-app", admin=False,
                                                         tenant=globex_id))}


def key_id_of(client: Client) -> str:
    from agentq.keys import hash_key
    key = client.http.headers["Authorization"].removeprefix("Bearer ")
    with client.stack.sessions()() as session:
        return str(session.execute(select(ApiKey.id).where(ApiKey.key_hash == hash_key(key))
                                   ).scalar_one())


# --- a tenant admin is its tenant's admin only ---------------------------------------------

def test_the_cli_makes_a_tenant_admin_and_without_tenant_an_operator(stack, acme):
    with stack.sessions()() as session:
        ops = session.get(ApiKey, uuid.UUID(key_id_of(acme["admin"])))
        assert ops.is_admin and not ops.is_operator and str(ops.tenant_id) == acme["id"]
    made = stack.agentq("keys", "create", uid("root-ops"), "--admin")
    assert made.returncode == 0, made.stderr
    operator = Http(stack, made.stdout.strip())
    listed = operator.get("/v1/admin/keys").json()["data"]
    mine = [k for k in listed if k["id"] == key_id_of(operator)]
    assert mine and mine[0]["operator"] is True and mine[0]["admin"] is True


def test_a_tenant_admin_cannot_mint_a_key_in_another_tenant(stack, acme):
    before = count(stack, ApiKey, ApiKey.tenant_id == uuid.UUID(acme["globex"]))
    for admin in (True, False):
        response = acme["admin"].post("/v1/admin/keys", json={
            "name": "sneaky", "tenant_id": acme["globex"], "admin": admin})
        refused(response, 404, "not_found")
        assert "key" not in response.json()
    # a tenant that does not exist answers the same: the other tenant is absent to it
    refused(acme["admin"].post("/v1/admin/keys", json={
        "name": "sneaky", "tenant_id": str(uuid.uuid4()), "admin": True}), 404, "not_found")
    assert count(stack, ApiKey, ApiKey.tenant_id == uuid.UUID(acme["globex"])) == before
    # inside its tenant it makes keys, admin ones too, never an operator
    made = acme["admin"].post("/v1/admin/keys", json={"name": "acme-ops-2",
                                                      "tenant_id": acme["id"], "admin": True})
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["tenant_id"] == acme["id"] and body["admin"] is True
    assert body["operator"] is False
    second = Http(stack, body["key"])
    refused(second.get("/v1/admin/tenants"), 403, "forbidden")


def test_the_operator_routes_answer_a_tenant_admin_403_and_write_nothing(stack, acme):
    admin = acme["admin"]
    tenants_before = count(stack, Tenant)
    for method, path, body in (
            ("GET", "/v1/admin/tenants", None),
            ("POST", "/v1/admin/tenants", {"name": uid("mine")}),
            ("PATCH", f"/v1/admin/tenants/{acme['id']}", {"quotas": {"schedules": 1000}}),
            ("PATCH", f"/v1/admin/tenants/{acme['globex']}", {"quotas": {"schedules": 0}})):
        error = refused(admin.call(method, path, body), 403, "forbidden")
        assert "operator" in error["message"]
    assert count(stack, Tenant) == tenants_before
    with stack.sessions()() as session:
        for ident in (acme["id"], acme["globex"]):
            assert session.get(Tenant, uuid.UUID(ident)).quotas is None
    # its own tenant it may read (its quotas); another's is absent
    own = admin.get(f"/v1/admin/tenants/{acme['id']}")
    assert own.status_code == 200, own.text
    assert own.json()["name"] == acme["name"] and "schedules" in own.json()["quotas"]
    refused(admin.get(f"/v1/admin/tenants/{acme['globex']}"), 404, "not_found")


def test_a_tenant_admin_lists_only_its_tenants_keys(stack, acme, client):
    listed = acme["admin"].get("/v1/admin/keys")
    assert listed.status_code == 200
    assert {k["tenant_id"] for k in listed.json()["data"]} == {acme["id"]}
    assert key_id_of(acme["globex_plain"]) not in listed.text
    # an operator sees every tenant's, each with its tenant
    everything = {k["id"]: k for k in client.get("/v1/admin/keys").json()["data"]}
    assert everything[key_id_of(acme["globex_plain"])]["tenant_id"] == acme["globex"]
    assert everything[key_id_of(acme["one"])]["tenant_id"] == acme["id"]


def test_a_tenant_admin_cannot_revoke_or_rotate_another_tenants_key(stack, acme):
    victim = key_id_of(acme["globex_plain"])
    for path in (f"/v1/admin/keys/{victim}/revoke", f"/v1/admin/keys/{victim}/rotate"):
        response = acme["admin"].post(path)
        refused(response, 404, "not_found")
        assert "key" not in response.json()
    with stack.sessions()() as session:
        assert session.get(ApiKey, uuid.UUID(victim)).revoked_at is None
        assert session.execute(select(func.count()).select_from(ApiKey).where(
            ApiKey.tenant_id == uuid.UUID(acme["globex"]), ApiKey.name == "globex-app")
        ).scalar_one() == 1  # no successor was made
    assert acme["globex_plain"].get("/v1/schedules").status_code == 200  # still works


def test_a_tenant_admin_of_the_default_tenant_cannot_touch_an_operators_key(stack, client):
    """Operators live in the default tenant: its tenant admins are not their admins."""
    made = stack.agentq("keys", "create", uid("default-ops"), "--tenant", "default",
                        "--admin")
    assert made.returncode == 0, made.stderr
    local = Http(stack, made.stdout.strip())
    operator = key_id_of(client)
    for path in (f"/v1/admin/keys/{operator}/revoke", f"/v1/admin/keys/{operator}/rotate"):
        refused(local.post(path), 403, "forbidden")
    with stack.sessions()() as session:
        assert session.get(ApiKey, uuid.UUID(operator)).revoked_at is None
    assert client.get("/v1/admin/tenants").status_code == 200
    refused(local.get("/v1/admin/tenants"), 403, "forbidden")


def test_an_operator_makes_a_tenant_admin_that_stays_in_its_tenant(stack, acme, client):
    made = client.post("/v1/admin/keys", json={"name": "globex-ops-2",
                                               "tenant_id": acme["globex"], "admin": True})
    assert made.status_code == 201, made.text
    assert made.json()["operator"] is False and made.json()["admin"] is True
    globex_admin = Http(stack, made.json()["key"])
    refused(globex_admin.get("/v1/admin/tenants"), 403, "forbidden")
    refused(globex_admin.post(f"/v1/admin/keys/{key_id_of(acme['one'])}/revoke"), 404,
            "not_found")


def test_a_tenant_admin_never_reads_another_tenants_jobs(stack, acme, script):
    marker = script([text("globex's answer")])
    job = acme["globex_plain"].submit(f"{marker} globex's secret")
    acme["globex_plain"].wait(job["id"])
    for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/events",
                 f"/v1/conversations/{job['conversation_id']}/messages"):
        refused(acme["admin"].get(path), 404, "not_found")
    usage = acme["admin"].get("/v1/usage", params={"group_by": "user"})
    assert usage.status_code == 200 and usage.json()["data"] == []


def test_a_tenants_context_layers_are_set_by_its_own_admins_and_reach_only_its_jobs(
        stack, acme, client, script, llm):
    """A tenant's default layers (bootstrap, skills): its admin and an operator set them;
    another tenant's admin gets 404 as if absent, a plain key 403, nothing is written; and
    another tenant's jobs never carry them."""
    own = f"/v1/admin/tenants/{acme['id']}/context_layers"
    theirs = f"/v1/admin/tenants/{acme['globex']}/context_layers"
    secret = {"bootstrap": "ACME-ONLY the office opens at nine."}
    for who, method, path, body, status, code in (
            ("globex_admin", "PATCH", own, {"bootstrap": "GLOBEX-WAS-HERE"}, 404,
             "not_found"),
            ("globex_admin", "GET", own, None, 404, "not_found"),
            ("admin", "PATCH", theirs, {"bootstrap": "ACME-WAS-HERE"}, 404, "not_found"),
            ("admin", "PATCH", f"/v1/admin/tenants/{uuid.uuid4()}/context_layers", secret,
             404, "not_found"),
            ("one", "PATCH", own, {"bootstrap": "PLAIN-WAS-HERE"}, 403, "forbidden"),
            ("one", "GET", own, None, 403, "forbidden")):
        refused(acme[who].call(method, path, body), status, code)
    with stack.sessions()() as session:
        for ident in (acme["id"], acme["globex"]):
            row = session.get(Tenant, uuid.UUID(ident))
            assert (row.bootstrap, row.skills) == (None, None)

    try:
        made = acme["admin"].call("PATCH", own, secret)
        assert made.status_code == 200, made.text
        assert client.get(own).json()["bootstrap"] == secret["bootstrap"]  # an operator
        by_operator = client.http.patch(client.url(theirs), timeout=70, json={
            "skills": [{"name": "globex", "instructions": "GLOBEX-SKILL be terse."}]})
        assert by_operator.status_code == 200, by_operator.text
        assert acme["globex_admin"].get(theirs).json()["skills"][0]["name"] == "globex"

        # each tenant's jobs carry its own layers only
        for who, mine, other in (("one", "ACME-ONLY", "GLOBEX-SKILL"),
                                 ("globex_plain", "GLOBEX-SKILL", "ACME-ONLY")):
            marker = script([text("ok")])
            job = acme[who].wait(acme[who].submit(f"{marker} hello")["id"])
            assert job["status"] == "completed", job
            system = llm.requests(marker.split(":", 1)[1])[-1]["messages"][0]["content"]
            assert mine in system and other not in system, system
    finally:  # the module's other tests see these tenants without layers
        for path in (own, theirs):
            client.http.patch(client.url(path), json={"bootstrap": None, "skills": None},
                              timeout=70)


# --- a non-admin key's conversations are its own -------------------------------------------

@pytest.mark.parametrize("on_busy", ["steer", "interrupt", "queue", "reject"])
def test_a_second_key_of_the_tenant_never_reaches_the_first_keys_conversation(
        stack, acme, script, on_busy):
    one, two = acme["one"], acme["two"]
    # given one's job running at a place (busy_place: afterwards it must have run
    # untouched, not cancelled, not steered, its history one's alone)
    with busy_place(stack, one, script, "one") as place:
        # when two writes as the same user at the same place, with each on_busy: then two
        # gets a job of its own, in a conversation of its own
        two_job = write_there(two, place, script, on_busy, "two")
        # and cannot read, continue, steer or interrupt one's conversation by its id
        conversation_id = place.job["conversation_id"]
        refused(two.get(f"/v1/conversations/{conversation_id}/messages"), 404, "not_found")
        for policy in ("steer", "interrupt", "queue"):
            refused(two.post("/v1/continue", json={
                "conversation_id": conversation_id, "content": "x", "on_busy": policy}),
                404, "not_found")
        refused(two.post(f"/v1/jobs/{place.job['id']}/cancel"), 404, "not_found")
        refused(two.post("/v1/schedules", json={
            "conversation_id": conversation_id, "content": "x", "delay_s": 1}),
            404, "not_found")
    # an admin of the tenant still sees both
    assert acme["admin"].get(f"/v1/jobs/{two_job['id']}").status_code == 200
    assert acme["admin"].get(
        f"/v1/conversations/{conversation_id}/messages").status_code == 200


def test_the_same_key_at_the_same_place_keeps_its_conversation(acme, script):
    one = acme["one"]
    user, channel = uid("u"), uid("c")
    marker = script([text("first"), text("second")])
    first = one.wait(one.submit(f"{marker} a", user=user, channel=channel)["id"])
    second = one.wait(one.submit(f"{marker} b", user=user, channel=channel)["id"])
    assert first["conversation_id"] == second["conversation_id"]


def test_a_second_key_never_recalls_what_the_first_keys_conversations_remembered(
        stack, acme, script):
    one, two = acme["one"], acme["two"]
    user = uid("u")
    marker = script([tool_calls(call("memory.remember", {"content": FACT})),
                     EMBED, text("Remembered.")])
    first = one.wait(one.submit(f"{marker} remember my locker code", user=user)["id"])
    assert first["status"] == "completed", first
    assert count(stack, Memory, Memory.job_id == uuid.UUID(first["id"])) == 1

    def blind(request):
        assert "4711" not in str(request["messages"])
    # when the second key asks as the same user, in context and with the recall tool
    marker = script([EMBED, tool_calls(call("memory.recall", {"query": "locker code"}),
                                       check=blind),
                     text("I do not know.", check=blind)])
    job = two.wait(two.submit(f"{marker} what is my locker code?", user=user)["id"])
    assert job["status"] == "completed", job
    assert "memory_recalled" not in [e["type"] for e in two.events(job["id"])]
    with stack.sessions()() as session:
        result = session.execute(select(ToolCall.result).where(
            ToolCall.job_id == uuid.UUID(job["id"]))).scalar_one()
    assert result["ok"] is True, result
    assert result["result"]["memories"] == []

    # while the first key, in another conversation of its own, recalls it
    def sees(request):
        assert FACT in request["messages"][0]["content"]
    marker = script([EMBED, text("4711.", check=sees)])
    again = one.wait(one.submit(f"{marker} what is my locker code?", user=user,
                                channel=uid("c"))["id"])
    assert again["response"]["content"] == "4711."


# --- a revoked key's schedules stop ----------------------------------------------------------

def _conversation(client: Client, script) -> str:
    marker = script([text("ok")])
    job = client.wait(client.submit(f"{marker} start")["id"])
    assert job["status"] == "completed"
    return job["conversation_id"]


def _firings(stack, schedule_id: str) -> int:
    return count(stack, ScheduleFiring, ScheduleFiring.schedule_id == uuid.UUID(schedule_id))


def _beat_has_run(stack, client: Client, script) -> None:
    """A schedule made now has fired: beat ran after everything made before this call."""
    marker = script([text("ok"), text("sentinel")])
    conversation = client.wait(client.submit(f"{marker} start")["id"])["conversation_id"]
    made = client.post("/v1/schedules", json={"conversation_id": conversation,
                                              "content": f"{marker} tick", "delay_s": 0})
    assert made.status_code == 201, made.text
    wait_until(lambda: _firings(stack, made.json()["id"]) == 1, what="sentinel fired")
    job = client.get(f"/v1/schedules/{made.json()['id']}").json()["last_job_id"]
    client.wait(job)


def test_a_revoked_keys_schedules_stop_firing(stack, acme, client, script, llm):
    tenant_id = acme["id"]
    made = acme["admin"].post("/v1/admin/keys", json={"name": uid("cron-app"),
                                                      "tenant_id": tenant_id})
    app = Http(stack, made.json()["key"])
    ticks = uid("ticks").replace("-", "_")
    # its conversation and every firing answered from a script of its own (however many
    # fire before the revoke: what is left is not asserted)
    marker = llm.script(ticks, [text("ok")] + [text("tick")] * 50)
    first = app.wait(app.submit(f"{marker} start")["id"])
    assert first["status"] == "completed", first
    conversation = first["conversation_id"]
    response = app.post("/v1/schedules", json={"conversation_id": conversation,
                                               "content": f"{marker} every 2 s",
                                               "cron": "* * * * * */2"})
    assert response.status_code == 201, response.text
    sched = response.json()
    wait_until(lambda: _firings(stack, sched["id"]) >= 1, what="first firing")
    # when its key is revoked (by its tenant's admin)
    assert acme["admin"].post(f"/v1/admin/keys/{made.json()['id']}/revoke").status_code == 200
    with stack.sessions()() as session:
        row = session.get(Schedule, uuid.UUID(sched["id"]))
        assert row.status == "cancelled" and row.next_run_at is None
    fired = _firings(stack, sched["id"])
    time.sleep(2.5)  # past the next tick of its cron
    _beat_has_run(stack, client, script)
    assert _firings(stack, sched["id"]) == fired


def test_beat_cancels_instead_of_firing_a_schedule_whose_key_was_revoked(
        stack, acme, client, script):
    made = acme["admin"].post("/v1/admin/keys", json={"name": uid("late-app"),
                                                      "tenant_id": acme["id"]})
    app = Http(stack, made.json()["key"])
    conversation = _conversation(app, script)
    response = app.post("/v1/schedules", json={"conversation_id": conversation,
                                               "content": "never", "delay_s": 1})
    assert response.status_code == 201, response.text
    # given its key revoked behind the API's back (an older release, a hand-made UPDATE)
    with stack.sessions()() as session, session.begin():
        session.execute(update(ApiKey).where(ApiKey.id == uuid.UUID(made.json()["id"]))
                        .values(revoked_at=datetime.now(timezone.utc)))
    time.sleep(1.2)  # due now
    _beat_has_run(stack, client, script)
    with stack.sessions()() as session:
        row = session.get(Schedule, uuid.UUID(response.json()["id"]))
        assert row.status == "cancelled" and row.cancelled_at is not None
    assert _firings(stack, response.json()["id"]) == 0


def test_a_rotated_key_keeps_its_conversation_and_schedules(stack, acme, script):
    made = acme["admin"].post("/v1/admin/keys", json={"name": uid("rot-app"),
                                                      "tenant_id": acme["id"]})
    old = Http(stack, made.json()["key"])
    user, channel = uid("u"), uid("c")
    marker = script([text("before"), text("after")])
    first = old.wait(old.submit(f"{marker} a", user=user, channel=channel)["id"])
    sched = old.post("/v1/schedules", json={"conversation_id": first["conversation_id"],
                                            "content": "later", "delay_s": 3600}).json()
    rotated = acme["admin"].post(f"/v1/admin/keys/{made.json()['id']}/rotate")
    assert rotated.status_code == 201, rotated.text
    new = Http(stack, rotated.json()["key"])
    second = new.wait(new.submit(f"{marker} b", user=user, channel=channel)["id"])
    assert second["conversation_id"] == first["conversation_id"]
    shown = new.get(f"/v1/schedules/{sched['id']}")
    assert shown.status_code == 200 and shown.json()["status"] == "active"


# --- quotas -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def quota_tenant(stack, admin_key):
    """A tenant whose quotas an operator set: 2 active schedules, 2 tool calls a turn."""
    client = Client(stack, admin_key)
    tenant_id = stack.create_tenant(uid("quota"))
    response = client.http.patch(client.url(f"/v1/admin/tenants/{tenant_id}"),
                                 json={"quotas": {"schedules": 2, "tool_calls_per_turn": 2}},
                                 timeout=70)
    assert response.status_code == 200, response.text
    return {"id": tenant_id, "quotas": response.json(),
            "admin": Http(stack, stack.create_key("q-adm", admin=True, tenant=tenant_id)),
            "app": Http(stack, stack.create_key("q-app", admin=False, tenant=tenant_id))}


def test_an_operator_sets_quotas_and_the_tenant_admin_reads_them(stack, client,
                                                                 quota_tenant):
    shown = quota_tenant["quotas"]
    assert shown["quotas"]["schedules"] == 2 and shown["quotas"]["tool_calls_per_turn"] == 2
    assert sorted(shown["quotas_set"]) == ["schedules", "tool_calls_per_turn"]
    assert shown["quotas"]["modules"] == Quotas.modules  # the default
    read = quota_tenant["admin"].get(f"/v1/admin/tenants/{quota_tenant['id']}")
    assert read.status_code == 200 and read.json()["quotas"] == shown["quotas"]
    for body in ({"quotas": {"schedules": -1}}, {"quotas": {"schedules": "ten"}},
                 {"quotas": {"schedules": 1.5}}, {"quotas": {"bananas": 3}},
                 {"quotas": {"schedules": True}}, {"name": "renamed"}, {}):
        response = client.http.patch(client.url(f"/v1/admin/tenants/{quota_tenant['id']}"),
                                     json=body, timeout=70)
        refused(response, 422, "validation_error")
    refused(client.http.patch(client.url(f"/v1/admin/tenants/{uuid.uuid4()}"),
                              json={"quotas": {}}, timeout=70), 404, "not_found")
    with stack.sessions()() as session:
        assert session.get(Tenant, uuid.UUID(quota_tenant["id"])).quotas == {
            "schedules": 2, "tool_calls_per_turn": 2}


def test_active_schedules_past_the_quota_are_422_and_not_made(stack, quota_tenant, script):
    app = quota_tenant["app"]
    conversation = _conversation(app, script)
    made = []
    for _ in range(2):
        response = app.post("/v1/schedules", json={"conversation_id": conversation,
                                                   "content": "later", "delay_s": 3600})
        assert response.status_code == 201, response.text
        made.append(response.json()["id"])
    tenant = uuid.UUID(quota_tenant["id"])
    before = count(stack, Schedule, Schedule.tenant_id == tenant)
    error = refused(app.post("/v1/schedules", json={"conversation_id": conversation,
                                                    "content": "one too many",
                                                    "cron": "0 9 * * *"}),
                    422, "quota_exceeded")
    assert error["details"]["quota"] == "schedules" and error["details"]["limit"] == 2
    assert count(stack, Schedule, Schedule.tenant_id == tenant) == before
    # a cancelled one frees its place
    assert app.http.delete(app.url(f"/v1/schedules/{made[0]}"), timeout=70).status_code == 204
    again = app.post("/v1/schedules", json={"conversation_id": conversation,
                                            "content": "now it fits", "delay_s": 3600})
    assert again.status_code == 201, again.text


def _fill_schedules(app, conversation: str) -> None:
    """The tenant's schedules quota (2 active) full, whichever tests ran before on this
    worker (xdist may run the test that fills it on another, with its own tenant)."""
    for _ in range(3):
        response = app.post("/v1/schedules", json={"conversation_id": conversation,
                                                   "content": "later", "delay_s": 3600})
        if response.status_code == 422:
            assert response.json()["error"]["code"] == "quota_exceeded", response.text
            return
        assert response.status_code == 201, response.text
    pytest.fail("the schedules quota of 2 never filled")


def test_the_scheduler_tool_past_the_quota_gets_a_tool_error(stack, quota_tenant, script):
    _fill_schedules(quota_tenant["app"], _conversation(quota_tenant["app"], script))
    admin = quota_tenant["admin"]
    assert admin.post("/v1/personas", json={"name": "Planner",
                                            "allowed_modules": ["scheduler", "math"]}
                      ).status_code == 201
    user = uid("u")
    made = stack.agentq("users", "set", "api", user, "--level", "user",
                        "--tenant", quota_tenant["id"])
    assert made.returncode == 0, made.stderr
    before = count(stack, Schedule, Schedule.tenant_id == uuid.UUID(quota_tenant["id"]))
    seen = {}

    def reads_the_refusal(request):
        seen["tool"] = [m for m in request["messages"] if m["role"] == "tool"][-1]["content"]
    marker = script([tool_calls(call("scheduler.add_job", {"content": "x", "delay_s": 60})),
                     text("No room.", check=reads_the_refusal)])
    job = admin.wait(admin.submit(f"{marker} remind me", user=user)["id"])
    assert job["status"] == "completed", job
    assert "quota_exceeded" in seen["tool"]
    assert count(stack, Schedule,
                 Schedule.tenant_id == uuid.UUID(quota_tenant["id"])) == before


def test_tool_calls_past_the_per_turn_quota_are_not_run(stack, quota_tenant, script):
    app = quota_tenant["app"]
    calls = [call("math.evaluate", {"expression": f"{i}+1"}) for i in range(5)]
    seen = {}

    def reads_results(request):
        seen["results"] = [m["content"] for m in request["messages"] if m["role"] == "tool"]
    marker = script([tool_calls(*calls), text("done", check=reads_results)])
    job = app.wait(app.submit(f"{marker} add up")["id"])
    assert job["status"] == "completed", job
    with stack.sessions()() as session:
        rows = session.execute(select(ToolCall).where(
            ToolCall.job_id == uuid.UUID(job["id"])).order_by(ToolCall.position)
        ).scalars().all()
    assert [r.result["ok"] for r in rows] == [True, True, False, False, False]
    assert {r.result["error"]["code"] for r in rows[2:]} == {"too_many_tool_calls"}
    assert len(seen["results"]) == 5 and "too_many_tool_calls" in seen["results"][-1]
    tool_events = [e for e in app.events(job["id"]) if e["type"] == "tool_execution_start"]
    assert len(tool_events) == 2  # only the first two ran


def test_the_default_quotas_apply_without_a_setting(stack, client):
    tenant_id = stack.create_tenant(uid("plain"))
    shown = client.get(f"/v1/admin/tenants/{tenant_id}").json()
    from agentq.config import Settings
    assert shown["quotas_set"] == []
    # the stack's settings (its environment sets a few, e.g. the request rate)
    assert shown["quotas"] == dataclasses.asdict(Settings.from_env(stack.env).quotas)


def test_modules_past_the_tenants_quota_are_422_and_never_fetched(stack, client):
    from agentq.models import ToolModuleRow
    from tests.support.module_process import SECRET, ModuleProcess
    tenant_id = stack.create_tenant(uid("mods"))
    assert client.http.patch(client.url(f"/v1/admin/tenants/{tenant_id}"),
                             json={"quotas": {"modules": 1}}, timeout=70).status_code == 200
    admin = Http(stack, stack.create_key("mods-adm", admin=True, tenant=tenant_id))
    first = ModuleProcess(uid("qa").replace("-", "_")).start()
    second = ModuleProcess(uid("qb").replace("-", "_")).start()
    try:
        made = admin.post("/v1/modules", json={"name": first.name, "url": first.url,
                                               "kind": "http", "secret": SECRET})
        assert made.status_code == 201, made.text
        error = refused(admin.post("/v1/modules", json={
            "name": second.name, "url": second.url, "kind": "http", "secret": SECRET}),
            422, "quota_exceeded")
        assert error["details"] == {"quota": "modules", "limit": 1, "used": 1}
        assert second.stats()["manifest_fetches"] == 0  # refused before any request
        assert count(stack, ToolModuleRow, ToolModuleRow.tenant_id == uuid.UUID(tenant_id)) == 1
        # removing one frees its place
        assert admin.http.delete(admin.url(f"/v1/modules/{first.name}"),
                                 timeout=70).status_code == 204
        again = admin.post("/v1/modules", json={"name": second.name, "url": second.url,
                                                "kind": "http", "secret": SECRET})
        assert again.status_code == 201, again.text
        admin.http.delete(admin.url(f"/v1/modules/{second.name}"), timeout=70)
    finally:
        first.stop()
        second.stop()


def test_jobs_past_the_running_jobs_quota_wait_and_start_when_one_ends(stack, client, script,
                                                                      llm):
    tenant_id = stack.create_tenant(uid("busy"))
    assert client.http.patch(client.url(f"/v1/admin/tenants/{tenant_id}"),
                             json={"quotas": {"running_jobs": 1}}, timeout=70
                             ).status_code == 200
    app = Http(stack, stack.create_key("busy-app", admin=False, tenant=tenant_id))
    other = Http(stack, stack.create_key("calm-app", admin=False,
                                         tenant=stack.create_tenant(uid("calm"))))
    release = threading.Event()
    marker = script([text("first", hold=release), text("second")])
    elsewhere = uid("calm").replace("-", "_")
    other_marker = llm.script(elsewhere, [text("other tenant's")])
    first = app.submit(f"{marker} one")
    try:
        wait_until(lambda: app.get(f"/v1/jobs/{first['id']}").json()["status"] == "running",
                   what="the first job running")
        # when a second job of the tenant comes, in another conversation
        second = app.submit(f"{marker} two")
        # then it waits for the quota
        shown = app.get(f"/v1/jobs/{second['id']}").json()
        assert shown["status"] == "queued" and shown["waiting_for"] == "quota", shown
        # while another tenant's job is not held by it: it runs to its end (the workers
        # took every step sent before its own)
        done = other.wait(other.submit(f"{other_marker} elsewhere")["id"])
        assert done["response"]["content"] == "other tenant's"
        llm.assert_done(elsewhere)
        # and the second took no step meanwhile
        shown = app.get(f"/v1/jobs/{second['id']}").json()
        assert shown["status"] == "queued" and shown["waiting_for"] == "quota", shown
        assert shown["started_at"] is None and shown["iterations"] == 0
    finally:
        release.set()
    ended = app.wait(first["id"])
    assert ended["status"] == "completed"
    after = app.wait(second["id"])
    assert after["status"] == "completed" and after["response"]["content"] == "second"
    assert after["waiting_for"] is None
    assert datetime.fromisoformat(after["started_at"]) >= datetime.fromisoformat(
        ended["finished_at"])


# --- the two quota attacks, with the production defaults ---------------------------

def _post_paced(client: Client, path: str, body: dict):
    """POST, sending it again after a 429's Retry-After (the per-key request rate)."""
    while True:
        response = client.post(path, json=body)
        if response.status_code != 429:
            return response
        time.sleep(float(response.headers.get("Retry-After", "1")))


def test_one_key_cannot_make_600_schedules_by_default(stack, script):
    """The issue: 600 schedules from one key. AGENTQ_QUOTA_SCHEDULES (100) stops it."""
    tenant_id = stack.create_tenant(uid("many"))
    app = Http(stack, stack.create_key("many-app", admin=False, tenant=tenant_id))
    conversation = _conversation(app, script)
    made, refused_at = 0, None
    for i in range(600):
        response = _post_paced(app, "/v1/schedules", {"conversation_id": conversation,
                                                      "content": f"n{i}", "delay_s": 3600})
        if response.status_code == 422:
            refused_at = response.json()["error"]
            break
        assert response.status_code == 201, response.text
        made += 1
    assert made == Quotas.schedules
    assert refused_at["code"] == "quota_exceeded"
    assert count(stack, Schedule, Schedule.tenant_id == uuid.UUID(tenant_id)) == made


def test_tool_calls_past_the_default_cap_of_one_turn_are_not_run(stack, script):
    """The issue: 300 tool calls in one turn. AGENTQ_QUOTA_TOOL_CALLS_PER_TURN (32) runs
    the first 32; the rest are answered with too_many_tool_calls, never run (40 here: 300
    results overflow the test stack's context budget into a compaction call)."""
    cap = Quotas.tool_calls_per_turn
    tenant_id = stack.create_tenant(uid("calls"))
    app = Http(stack, stack.create_key("calls-app", admin=False, tenant=tenant_id))
    total = cap + 8
    calls = [call("math.evaluate", {"expression": f"{i}*2"}) for i in range(total)]
    marker = script([tool_calls(*calls), text("done")])
    job = app.wait(app.submit(f"{marker} compute")["id"], timeout_s=200)
    assert job["status"] == "completed", job
    with stack.sessions()() as session:
        rows = session.execute(select(ToolCall).where(
            ToolCall.job_id == uuid.UUID(job["id"])).order_by(ToolCall.position)
        ).scalars().all()
    assert len(rows) == total
    assert all(r.result["ok"] for r in rows[:cap])
    assert {r.result["error"]["code"] for r in rows[cap:]} == {"too_many_tool_calls"}
    started = [e for e in app.events(job["id"]) if e["type"] == "tool_execution_start"]
    assert len(started) == cap
