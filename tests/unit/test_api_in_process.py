"""Branching and the admin routes (API.md 1.2) in one process on SQLite, as `agentq dev`
serves them (tests/integration/test_branches.py and tests/security/test_tenant_admins.py show
them on Postgres with real workers)."""
from __future__ import annotations

from agentq.db import session_scope
from agentq.keys import create_key
from agentq.testing.harness import text


def _client(h, operator: bool = False):
    """The app in this process, and the headers of a new admin key (an operator's with
    `operator`, as only the server makes one)."""
    from api import create_app
    with session_scope(h.settings) as session:
        _, key = create_key(session, "ops" if operator else "branches", admin=True,
                            operator=operator)
    client = create_app(h.settings).test_client()
    return client, {"Authorization": f"Bearer {key}"}


def test_a_branch_holds_the_history_before_its_point_and_runs_the_new_content(make):
    # given a conversation of two answered questions
    h = make(text("four"), text("five"), text("six"))
    job_one = h.submit("2+2?")
    h.drive(job_one)
    job_two = h.submit("2+3?")
    h.drive(job_two)
    client, auth = _client(h)
    conversation = client.get(f"/v1/jobs/{job_one}", headers=auth).get_json()["conversation_id"]
    # when it is branched at the second job with new content
    answer = client.post(f"/v1/conversations/{conversation}/branch", headers=auth,
                         json={"at_job_id": job_two, "content": "2+4?"})
    assert answer.status_code == 202, answer.get_data(as_text=True)
    branch_job = answer.get_json()
    h.stepper.run(branch_job["id"], 0, "start")  # its step, as the orchestrator runs it
    h.runner.run_until_idle(limit=80)
    # then the branch's conversation says where it came from
    shown = client.get(f"/v1/conversations/{branch_job['conversation_id']}", headers=auth)
    assert shown.status_code == 200
    body = shown.get_json()
    assert body["branched_from"]["conversation_id"] == conversation
    # and its model call carried the first exchange and the new question, not the second
    ended = client.get(f"/v1/jobs/{branch_job['id']}", headers=auth).get_json()
    assert ended["status"] == "completed" and ended["response"]["content"] == "six"
    history = client.get(f"/v1/conversations/{branch_job['conversation_id']}/messages",
                         headers=auth)
    assert history.status_code == 200, history.get_data(as_text=True)
    contents = [m.get("content") for m in history.get_json()["data"]]
    assert "2+2?" in contents and "2+4?" in contents and "2+3?" not in contents


def test_a_branch_at_a_message_of_another_conversation_is_404(make):
    h = make(text("four"))
    job = h.submit("2+2?")
    h.drive(job)
    client, auth = _client(h)
    conversation = client.get(f"/v1/jobs/{job}", headers=auth).get_json()["conversation_id"]
    answer = client.post(f"/v1/conversations/{conversation}/branch", headers=auth,
                         json={"at_message_id": "00000000-0000-0000-0000-00000000abcd",
                               "content": "again"})
    assert answer.status_code == 404
    assert answer.get_json()["error"]["code"] == "not_found"
    missing = client.get("/v1/conversations/00000000-0000-0000-0000-00000000abcd",
                         headers=auth)
    assert missing.status_code == 404


def test_an_operator_and_a_tenant_admin_in_one_process(make):
    # given an operator key (made on the server) and the app in one process on SQLite
    client, ops = _client(make(), operator=True)
    # when it makes a tenant, sets its quotas and makes the tenant's admin
    tenant = client.post("/v1/admin/tenants", headers=ops, json={"name": "acme"})
    assert tenant.status_code == 201, tenant.get_data(as_text=True)
    tenant_id = tenant.get_json()["id"]
    patched = client.patch(f"/v1/admin/tenants/{tenant_id}", headers=ops,
                           json={"quotas": {"schedules": 3}})
    assert patched.status_code == 200, patched.get_data(as_text=True)
    assert patched.get_json()["quotas"]["schedules"] == 3
    made = client.post("/v1/admin/keys", headers=ops,
                       json={"name": "acme-ops", "tenant_id": tenant_id, "admin": True})
    assert made.status_code == 201
    admin = {"Authorization": f"Bearer {made.get_json()['key']}"}
    # then the tenant admin reads its own tenant and keys, and no other tenant's
    assert client.get(f"/v1/admin/tenants/{tenant_id}", headers=admin).status_code == 200
    assert client.get("/v1/admin/tenants", headers=admin).status_code == 403
    assert client.patch(f"/v1/admin/tenants/{tenant_id}", headers=admin,
                        json={"quotas": {"schedules": 9}}).status_code == 403
    keys = client.get("/v1/admin/keys", headers=admin).get_json()["data"]
    assert {k["name"] for k in keys} == {"acme-ops"}
    other = client.post("/v1/admin/keys", headers=admin,
                        json={"name": "x", "tenant_id": "00000000-0000-0000-0000-000000000001",
                              "admin": True})
    assert other.status_code == 404
    # and the operator sees both tenants
    names = {t["name"] for t in client.get("/v1/admin/tenants", headers=ops).get_json()["data"]}
    assert {"default", "acme"} <= names


def test_a_cursor_past_any_seq_is_a_422_not_a_500(make):
    # a seq is a BIGINT: a larger cursor overflowed the query (SQLite's binding, Postgres's
    # bigint) and answered 500 internal_error
    h = make(text("four"))
    job = h.submit("2+2?")
    h.drive(job)
    client, auth = _client(h)
    conversation = client.get(f"/v1/jobs/{job}", headers=auth).get_json()["conversation_id"]
    for path, headers in ((f"/v1/jobs/{job}/events?after={2**63}", {}),
                          (f"/v1/jobs/{job}/events?after={10**30}", {}),
                          (f"/v1/jobs/{job}/events", {"Last-Event-ID": str(10**30)}),
                          (f"/v1/conversations/{conversation}/messages?after={2**63}", {})):
        answer = client.get(path, headers={**auth, **headers})
        assert answer.status_code == 422, (path, answer.get_data(as_text=True))
        assert answer.get_json()["error"]["details"]["fields"]["after"], path
    # the largest allowed cursor is a page with nothing after it
    answer = client.get(f"/v1/jobs/{job}/events?after={2**62}", headers=auth)
    assert answer.status_code == 200 and answer.get_json()["data"] == []
