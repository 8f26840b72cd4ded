"""The admin surface through HTTP against the real stack, at API.md 1.1's paths: personas
(/v1/personas), users (/v1/users, /v1/users/<id>/links), usage (/v1/usage) and key rotation,
each in the admin key's tenant (another tenant's rows are 404); bad input in the error
shape; a non-admin key gets 403 on every route."""
from __future__ import annotations

import pytest

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import Client, uid

pytestmark = pytest.mark.integration

ADMIN_ROUTES = [
    ("POST", "/v1/personas", {"name": "x"}),
    ("GET", "/v1/personas", None),
    ("GET", "/v1/personas/00000000-0000-0000-0000-000000000000", None),
    ("PATCH", "/v1/personas/00000000-0000-0000-0000-000000000000", {"name": "y"}),
    ("DELETE", "/v1/personas/00000000-0000-0000-0000-000000000000", None),
    ("GET", "/v1/users", None),
    ("GET", "/v1/users/00000000-0000-0000-0000-000000000000", None),
    ("PATCH", "/v1/users/00000000-0000-0000-0000-000000000000",
     {"permission_level": "user"}),
    ("POST", "/v1/users/00000000-0000-0000-0000-000000000000/links",
     {"platform": "p", "platform_user_id": "u"}),
    ("GET", "/v1/usage", None),
    ("POST", "/v1/admin/keys/00000000-0000-0000-0000-000000000000/rotate", None),
]


class Http(Client):
    def patch(self, path: str, **kw):
        return self.http.patch(self.url(path), timeout=70, **kw)

    def delete(self, path: str, **kw):
        return self.http.delete(self.url(path), timeout=70, **kw)

    def call(self, method: str, path: str, body=None):
        return self.http.request(method, self.url(path), json=body, timeout=70)


@pytest.fixture(scope="module")
def tenant(stack):
    """A fresh tenant with an admin key and a plain key, and another tenant's admin."""
    tenant_id = stack.create_tenant(uid("admin-t"))
    other = stack.create_tenant(uid("admin-o"))
    return {"id": tenant_id,
            "admin": Http(stack, stack.create_key("adm", admin=True, tenant=tenant_id)),
            "plain": Http(stack, stack.create_key("plain", admin=False, tenant=tenant_id)),
            "other": Http(stack, stack.create_key("other", admin=True, tenant=other))}


def error_of(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    if code:
        assert error["code"] == code, error
    return error


@pytest.mark.parametrize("method,path,body", ADMIN_ROUTES)
def test_a_non_admin_key_gets_403_on_every_admin_route(tenant, method, path, body):
    error = error_of(tenant["plain"].call(method, path, body), 403, "forbidden")
    assert "admin" in error["message"]


def test_personas_crud_and_exactly_one_default(tenant):
    admin = tenant["admin"]
    first = admin.post("/v1/personas", json={"name": "Helper", "system_prompt": "Be kind.",
                                                    "allowed_modules": ["math", "time"]})
    assert first.status_code == 201, first.text
    first = first.json()
    assert first["is_default"] is True  # a tenant's first persona is its default
    second = admin.post("/v1/personas", json={"name": "Coder", "platform": "discord"})
    assert second.status_code == 201 and second.json()["is_default"] is False
    second = second.json()

    listed = admin.get("/v1/personas").json()["data"]
    assert [p["id"] for p in listed] == [first["id"], second["id"]]
    shown = admin.get(f"/v1/personas/{first['id']}").json()
    assert shown["allowed_modules"] == ["math", "time"] and shown["system_prompt"] == "Be kind."

    moved = admin.patch(f"/v1/personas/{second['id']}",
                        json={"is_default": True, "default_model": "primary-model"})
    assert moved.status_code == 200, moved.text
    defaults = [p["id"] for p in admin.get("/v1/personas").json()["data"]
                if p["is_default"]]
    assert defaults == [second["id"]]
    error_of(admin.patch(f"/v1/personas/{second['id']}", json={"is_default": False}),
             409, "conflict")

    deleted = admin.delete(f"/v1/personas/{second['id']}")
    assert deleted.status_code == 200 and deleted.json() == {"id": second["id"],
                                                              "deleted": True}
    error_of(admin.get(f"/v1/personas/{second['id']}"), 404, "not_found")
    remaining = admin.get("/v1/personas").json()["data"]
    assert [(p["id"], p["is_default"]) for p in remaining] == [(first["id"], True)]

    # another tenant's admin sees none of it
    error_of(tenant["other"].get(f"/v1/personas/{first['id']}"), 404)
    assert first["id"] not in [p["id"] for p in
                               tenant["other"].get("/v1/personas").json()["data"]]


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/admin/personas"), ("GET", "/v1/admin/users"), ("GET", "/v1/admin/usage"),
    ("POST", "/v1/admin/users/00000000-0000-0000-0000-000000000000/identities"),
])
def test_the_old_admin_paths_are_gone(tenant, method, path):
    """API.md 1.1 has the tenant's admin at /v1/personas, /v1/users, /v1/usage."""
    error_of(tenant["admin"].call(method, path, {}), 404)


def test_another_tenants_persona_cannot_be_changed_or_deleted(tenant):
    admin, other = tenant["admin"], tenant["other"]
    mine = admin.post("/v1/personas", json={"name": "Mine", "is_default": False}).json()
    error_of(other.patch(f"/v1/personas/{mine['id']}", json={"name": "Theirs"}), 404,
             "not_found")
    error_of(other.delete(f"/v1/personas/{mine['id']}"), 404, "not_found")
    assert admin.get(f"/v1/personas/{mine['id']}").json()["name"] == "Mine"


def test_persona_limits_and_requires_approval(tenant):
    admin = tenant["admin"]
    made = admin.post("/v1/personas", json={
        "name": "Limited", "is_default": False, "requires_approval": ["flaky.echo"],
        "limits": {"max_iterations": 3, "max_tokens": 5000}})
    assert made.status_code == 201, made.text
    made = made.json()
    assert made["requires_approval"] == ["flaky.echo"] and "approval_tools" not in made
    assert made["limits"] == {"max_iterations": 3, "max_tokens": 5000}
    changed = admin.patch(f"/v1/personas/{made['id']}", json={
        "limits": {"max_seconds": 30}, "requires_approval": None})
    assert changed.status_code == 200, changed.text
    assert changed.json()["limits"] == {"max_seconds": 30}
    assert changed.json()["requires_approval"] is None
    cleared = admin.patch(f"/v1/personas/{made['id']}", json={"limits": None}).json()
    assert cleared["limits"] is None
    error_of(admin.patch(f"/v1/personas/{made['id']}",
                         json={"limits": {"max_iterations": -1}}), 422, "validation_error")
    assert admin.get(f"/v1/personas/{made['id']}").json()["limits"] is None


def test_a_personas_limits_apply_to_its_jobs(tenant, script):
    admin = tenant["admin"]
    persona = admin.post("/v1/personas", json={
        "name": "Short leash", "is_default": False, "limits": {"max_iterations": 2}}).json()
    marker = script([tool_calls(call("math.evaluate", {"expression": "1+1"}))
                     for _ in range(2)])
    job = admin.submit(f"{marker} loop", persona_id=persona["id"])
    ended = admin.wait(job["id"])
    assert (ended["status"], ended["finish_reason"], ended["iterations"]) == (
        "completed", "max_iterations", 2), ended


@pytest.mark.parametrize("body,field", [
    ({}, "name"), ({"name": "  "}, "name"), ({"name": "x", "allowed_modules": ["nope"]},
                                             "allowed_modules"),
    ({"name": "x", "allowed_modules": "math"}, "allowed_modules"),
    ({"name": "x", "max_tokens_per_request": 0}, "max_tokens_per_request"),
    ({"name": "x", "surprise": 1}, "surprise"),
    ({"name": "x", "requires_approval": ["no.such_tool"]}, "requires_approval"),
    ({"name": "x", "stream": "sometimes"}, "stream"),
    ({"name": "x", "limits": {"max_iterations": 0}}, "limits"),
    ({"name": "x", "limits": {"max_tokens": -5}}, "limits"),
    ({"name": "x", "limits": {"max_iterations": "many"}}, "limits"),
    ({"name": "x", "limits": {"max_seconds": 0}}, "limits"),
    ({"name": "x", "limits": {"max_turns": 3}}, "limits"),
    ({"name": "x", "limits": 5}, "limits"),
    ({"name": "x", "approval_tools": ["flaky.echo"]}, "approval_tools"),
])
def test_bad_persona_bodies_are_422_naming_the_field(tenant, body, field):
    error = error_of(tenant["admin"].post("/v1/personas", json=body), 422,
                     "validation_error")
    assert field in error["details"]["fields"]


def test_persona_routes_bad_ids_and_bodies(tenant):
    admin = tenant["admin"]
    error_of(admin.get("/v1/personas/not-a-uuid"), 404)
    error_of(admin.delete("/v1/personas/00000000-0000-0000-0000-000000000000"), 404)
    error_of(admin.post("/v1/personas", data="name=x"), 415)
    error_of(admin.post("/v1/personas", data="{", headers={"Content-Type":
                                                                 "application/json"}), 400)
    made = admin.post("/v1/personas", json={"name": "Tmp"}).json()
    error_of(admin.patch(f"/v1/personas/{made['id']}", json={"name": ""}), 422)


def test_a_request_may_name_a_persona_of_its_tenant(tenant, script, llm):
    admin = tenant["admin"]
    persona = admin.post("/v1/personas", json={
        "name": "Pirate", "system_prompt": "Talk like a pirate.", "is_default": False}).json()
    seen = {}

    def check(request):
        seen["system"] = request["messages"][0]["content"]

    marker = script([text("arr", check=check)])
    job = admin.submit(f"{marker} hello", persona_id=persona["id"])
    assert admin.wait(job["id"])["status"] == "completed"
    assert "Talk like a pirate." in seen["system"]

    # another tenant's persona is absent; a malformed id is a validation error
    error_of(tenant["other"].post("/v1/messages", json={
        "platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
        "content": "hi", "persona_id": persona["id"]}), 404, "not_found")
    error_of(admin.post("/v1/messages", json={
        "platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
        "content": "hi", "persona_id": "nope"}), 422, "validation_error")


def test_users_show_usage_set_level_and_budget_and_link_identities(tenant, script):
    admin = tenant["admin"]
    user_ref = uid("u")
    marker = script([text("one", input_tokens=100, output_tokens=7)])
    job = admin.submit(f"{marker} hi", user=user_ref)
    assert admin.wait(job["id"])["status"] == "completed"

    users = admin.get("/v1/users").json()["data"]
    mine = [u for u in users if {"platform": "api", "platform_user_id": user_ref,
                                 "platform_username": user_ref} in u["identities"]]
    assert len(mine) == 1
    user = mine[0]
    assert user["permission_level"] == "guest"

    shown = admin.get(f"/v1/users/{user['id']}").json()
    assert shown["usage"]["input_tokens"] == 100 and shown["usage"]["output_tokens"] == 7
    assert shown["usage"]["calls"] == 1
    assert [t["job_id"] for t in shown["token_logs"]] == [job["id"]]

    changed = admin.patch(f"/v1/users/{user['id']}",
                          json={"permission_level": "user", "token_budget_monthly": 12345})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["permission_level"], changed.json()["token_budget_monthly"]) == (
        "user", 12345)
    unlimited = admin.patch(f"/v1/users/{user['id']}",
                            json={"token_budget_monthly": None}).json()
    assert unlimited["token_budget_monthly"] is None

    # a second platform identity: its messages are this user's
    linked = admin.post(f"/v1/users/{user['id']}/links",
                        json={"platform": "telegram", "platform_user_id": "tg-" + user_ref})
    assert linked.status_code == 201, linked.text
    assert {i["platform"] for i in linked.json()["identities"]} == {"api", "telegram"}
    again = admin.post(f"/v1/users/{user['id']}/links",
                       json={"platform": "telegram", "platform_user_id": "tg-" + user_ref})
    assert again.status_code == 200
    marker = script([text("two", input_tokens=1, output_tokens=1)])
    body = {"platform": "telegram", "platform_user_id": "tg-" + user_ref,
            "platform_channel_id": uid("c"), "content": f"{marker} from telegram"}
    other_job = admin.post("/v1/messages", json=body).json()
    admin.wait(other_job["id"])
    logs = admin.get(f"/v1/users/{user['id']}").json()["token_logs"]
    assert other_job["id"] in [t["job_id"] for t in logs]

    # an identity that is another user's: 409
    someone = uid("u")
    marker = script([text("three")])
    admin.wait(admin.submit(f"{marker} hi", user=someone)["id"])
    error = error_of(admin.post(f"/v1/users/{user['id']}/links",
                                json={"platform": "api", "platform_user_id": someone}),
                     409, "conflict")
    assert error["details"]["platform_user_id"] == someone

    # another tenant cannot see the user, nor change or link it
    other = tenant["other"]
    error_of(other.get(f"/v1/users/{user['id']}"), 404, "not_found")
    error_of(other.patch(f"/v1/users/{user['id']}", json={"permission_level": "owner"}),
             404, "not_found")
    error_of(other.post(f"/v1/users/{user['id']}/links",
                        json={"platform": "irc", "platform_user_id": uid("irc")}),
             404, "not_found")
    assert user["id"] not in [u["id"] for u in other.get("/v1/users").json()["data"]]
    after = admin.get(f"/v1/users/{user['id']}").json()
    assert after["permission_level"] == "user"
    assert {i["platform"] for i in after["identities"]} == {"api", "telegram"}


@pytest.mark.parametrize("body,field", [
    ({"permission_level": "god"}, "permission_level"),
    ({"token_budget_monthly": -1}, "token_budget_monthly"),
    ({"token_budget_monthly": "lots"}, "token_budget_monthly"),
    ({"token_budget_monthly": 1.5}, "token_budget_monthly"),
    ({"nickname": "x"}, "nickname"),
])
def test_bad_user_updates_are_422(tenant, script, body, field):
    admin = tenant["admin"]
    users = admin.get("/v1/users").json()["data"]
    if not users:
        marker = script([text("hi")])
        admin.wait(admin.submit(f"{marker} hi")["id"])
        users = admin.get("/v1/users").json()["data"]
    else:
        script([])
    error = error_of(admin.patch(f"/v1/users/{users[0]['id']}", json=body), 422)
    assert field in error["details"]["fields"]


def test_user_routes_bad_input(tenant):
    admin = tenant["admin"]
    error_of(admin.get("/v1/users/not-a-uuid"), 404)
    error_of(admin.get("/v1/users", params={"limit": 0}), 422)
    error_of(admin.get("/v1/users", params={"page": 2}), 400)
    error_of(admin.post("/v1/users/00000000-0000-0000-0000-000000000000/links",
                        json={"platform": "p", "platform_user_id": "u"}), 404)
    error_of(admin.post("/v1/users/00000000-0000-0000-0000-000000000000/links",
                        json={"platform": ""}), 422)


def test_usage_report_per_user_persona_and_model(tenant, script):
    admin = tenant["admin"]
    persona = admin.post("/v1/personas", json={"name": "Counted",
                                                     "is_default": False}).json()
    marker = script([text("a", input_tokens=40, output_tokens=2),
                     text("b", input_tokens=60, output_tokens=3)])
    user_ref = uid("u")
    first = admin.submit(f"{marker} one", user=user_ref, persona_id=persona["id"])
    admin.wait(first["id"])
    second = admin.submit(f"{marker} two", user=user_ref, persona_id=persona["id"])
    admin.wait(second["id"])

    by_persona = admin.get("/v1/usage", params={"group_by": "persona"}).json()
    row = next(r for r in by_persona["data"] if r["key"] == persona["id"])
    assert (row["input_tokens"], row["output_tokens"], row["calls"]) == (100, 5, 2)
    assert row["total_tokens"] == 105 and row["cost_estimate"] >= 0
    by_model = admin.get("/v1/usage", params={"group_by": "model"}).json()
    assert "primary-model" in [r["key"] for r in by_model["data"]]
    by_user = admin.get("/v1/usage").json()
    assert by_user["group_by"] == "user"
    assert sum(r["calls"] for r in by_user["data"]) >= 2

    empty = admin.get("/v1/usage", params={"since": "2001-01-01T00:00:00Z",
                                                 "until": "2001-01-02T00:00:00Z"}).json()
    assert empty["data"] == []
    # the other tenant's report holds none of these
    others = tenant["other"].get("/v1/usage", params={"group_by": "persona"}).json()
    assert persona["id"] not in [r["key"] for r in others["data"]]

    error_of(admin.get("/v1/usage", params={"group_by": "planet"}), 422)
    error_of(admin.get("/v1/usage", params={"since": "yesterday"}), 422)
    error_of(admin.get("/v1/usage", params={"since": "2030-01-02T00:00:00Z",
                                                  "until": "2030-01-01T00:00:00Z"}), 422)


def test_keys_rotate_revokes_the_old_key_and_the_new_one_works(stack, tenant):
    admin = tenant["admin"]
    made = admin.post("/v1/admin/keys", json={"name": "to-rotate", "tenant_id": tenant["id"]})
    assert made.status_code == 201
    made = made.json()
    old = Http(stack, made["key"])
    assert old.get("/v1/usage").status_code == 403  # works, but not admin

    rotated = admin.post(f"/v1/admin/keys/{made['id']}/rotate")
    assert rotated.status_code == 201, rotated.text
    rotated = rotated.json()
    assert rotated["key"] != made["key"] and rotated["id"] != made["id"]
    assert (rotated["name"], rotated["tenant_id"], rotated["admin"]) == (
        "to-rotate", tenant["id"], False)
    error_of(old.get("/v1/schedules"), 401)
    assert Http(stack, rotated["key"]).get("/v1/schedules").status_code == 200

    listed = {k["id"]: k for k in admin.get("/v1/admin/keys").json()["data"]}
    assert listed[made["id"]]["revoked_at"] is not None
    assert listed[rotated["id"]]["revoked_at"] is None
    error_of(admin.post(f"/v1/admin/keys/{made['id']}/rotate"), 409, "conflict")
    error_of(admin.post("/v1/admin/keys/00000000-0000-0000-0000-000000000000/rotate"), 404)
    revoked = admin.post(f"/v1/admin/keys/{rotated['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
