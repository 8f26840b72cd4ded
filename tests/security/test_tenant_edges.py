"""Issue 30's medium and low items at the API's edge, each attack tried through the real
stack (gunicorn, workers, Postgres, Redis), asserting the refusal and that nothing was
written:

- one webhook secret for every tenant: tenant A could forge what B's receiver accepts;
- tool modules were global: B's module was enabled in A's persona and got A's context;
- `/metrics` took a label for every tool name a model made up;
- a cron that never fires, a file named `отчёт.txt` or holding CR/LF, were 500s; an HTML
  file was served inline from the API's origin without nosniff or CSP; invalid UTF-8 was
  stored as U+FFFD; `/v1/embed` was unmetered; a non-admin key picked any model by replay.

The shared stack runs with the production defaults for everything tried here; it allows
private addresses for webhooks, modules and attachments only so that the receiver, the
module and the attachment server of these tests can live on loopback (none of the attacks
goes through those guards). `/metrics`'s token is tried on a stack of its own with the
production defaults."""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select
from standardwebhooks import Webhook, WebhookVerificationError

from agentq.models import (
    Batch,
    FileRecord,
    Job,
    Persona,
    Schedule,
    Tenant,
    TokenLog,
    ToolModuleRow,
    User,
    UserPlatformLink,
)
from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import TEST_ENV, Client, uid, wait_until
from tests.support.module_process import SECRET as MODULE_SECRET
from tests.support.module_process import ModuleProcess
from tests.support.stack import own_stack
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.integration
SETTING_SECRET = TEST_ENV["AGENTQ_WEBHOOK_SECRET"]
ONE_TURN = {"max_iterations": 1}
"""A job that ends after the model's one reply and its tool calls (no second model call,
which a step re-driven on a loaded machine could ask twice)."""


@pytest.fixture(scope="module")
def edge(stack, admin_key):
    """Tenants A and B, each with a tenant admin key and a plain key; the operator."""
    a, b = stack.create_tenant(uid("edge-a")), stack.create_tenant(uid("edge-b"))
    return {"a_id": a, "b_id": b,
            "a": Client(stack, stack.create_key("a", admin=False, tenant=a)),
            "a_admin": Client(stack, stack.create_key("a-admin", admin=True, tenant=a)),
            "b": Client(stack, stack.create_key("b", admin=False, tenant=b)),
            "b_admin": Client(stack, stack.create_key("b-admin", admin=True, tenant=b)),
            "operator": Client(stack, admin_key)}


def count(stack, model, *where) -> int:
    with stack.sessions()() as session:
        return session.execute(select(func.count()).select_from(model).where(*where)
                               ).scalar_one()


def refused(response, status: int, code: str | None = None) -> dict:
    """A 4xx in the error shape."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


# --- webhooks: each tenant signs with its own secret -------------------------------------

def verifies(secret: str, request: dict) -> bool:
    try:
        Webhook(secret).verify(request["body"], request["headers"])
        return True
    except WebhookVerificationError:
        return False


def delivered(client: Client, script, receiver: Receiver, what: str) -> dict:
    """A job of `client`'s tenant ends with a callback; the request its receiver got."""
    path = f"/{uid(what)}"
    marker = script([text(f"{what} done")])
    job = client.wait(client.submit(f"{marker} {what}", callback_url=receiver.url(path))["id"])
    assert job["status"] == "completed", job
    return receiver.wait_for(path, 1)[0]


def tenant_secrets(stack, tenant_id: str) -> tuple:
    with stack.sessions()() as session:
        tenant = session.get(Tenant, uuid.UUID(tenant_id))
        return (tenant.webhook_secret, tenant.webhook_secret_previous,
                tenant.webhook_secret_previous_until)


def test_a_tenants_webhook_does_not_verify_with_another_tenants_secret(
        stack, edge, script, receiver):
    # a plain key may not rotate its tenant's secret, and rotating changes nothing then
    before = tenant_secrets(stack, edge["a_id"])
    refused(edge["a"].post("/v1/admin/webhook-secret/rotate"), 403, "forbidden")
    assert tenant_secrets(stack, edge["a_id"]) == before

    # each tenant admin gets a secret of its own tenant, shown once
    answer_b = edge["b_admin"].post("/v1/admin/webhook-secret/rotate")
    answer_a = edge["a_admin"].post("/v1/admin/webhook-secret/rotate")
    assert answer_a.status_code == answer_b.status_code == 200, answer_a.text
    secret_a, secret_b = answer_a.json()["secret"], answer_b.json()["secret"]
    assert secret_a.startswith("whsec_") and secret_b.startswith("whsec_")
    assert len({secret_a, secret_b, SETTING_SECRET}) == 3

    # the attack: A's own webhook, signed for A, replayed at B's receiver
    request = delivered(edge["a"], script, receiver, "a-event")
    assert verifies(secret_a, request)
    assert not verifies(secret_b, request)           # B's receiver refuses it
    assert not verifies(SETTING_SECRET, request)     # and the shared setting signs nothing
    # B's own events verify with B's secret only
    request = delivered(edge["b"], script, receiver, "b-event")
    assert verifies(secret_b, request) and not verifies(secret_a, request)


def test_a_tenant_that_never_rotated_is_not_signed_with_the_shared_secret(
        stack, script, receiver):
    tenant = stack.create_tenant(uid("edge-c"))
    client = Client(stack, stack.create_key("c", admin=False, tenant=tenant))
    request = delivered(client, script, receiver, "c-event")
    # a secret of its own was made at its first delivery; the shared one signs nothing
    generated, _previous, _until = tenant_secrets(stack, tenant)
    assert generated and generated != SETTING_SECRET
    assert verifies(generated, request) and not verifies(SETTING_SECRET, request)


def test_after_a_rotation_both_secrets_sign_for_a_day(stack, script, receiver):
    tenant = stack.create_tenant(uid("edge-r"))
    admin = Client(stack, stack.create_key("r-admin", admin=True, tenant=tenant))
    old = admin.post("/v1/admin/webhook-secret/rotate").json()["secret"]
    before = time.time()
    new = admin.post("/v1/admin/webhook-secret/rotate").json()["secret"]
    after = time.time()
    current, previous, until = tenant_secrets(stack, tenant)
    assert (current, previous) == (new, old)
    # the one before keeps signing for 24 h from the rotation (made between before and after)
    assert before + 24 * 3600 <= until.timestamp() <= after + 24 * 3600
    request = delivered(admin, script, receiver, "r-event")
    assert len(request["headers"]["webhook-signature"].split(" ")) == 2
    assert verifies(old, request) and verifies(new, request)
    assert not verifies(SETTING_SECRET, request)


# --- modules per tenant ----------------------------------------------------------------------

@pytest.fixture
def module_b(edge):
    """A module registered by B's tenant admin (stopped and removed by the operator after)."""
    module = ModuleProcess(uid("mb").replace("-", "_"), MODULE_SECRET).start()
    response = edge["b_admin"].post("/v1/modules", json={
        "name": module.name, "url": module.url, "kind": "http", "secret": MODULE_SECRET})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["global"] is False and body["tenant_id"] == edge["b_id"]
    yield module
    edge["operator"].http.delete(edge["operator"].url(f"/v1/modules/{module.name}"),
                                 timeout=30)
    module.stop()


def persona_naming(stack, tenant_id: str, *modules: str) -> str:
    """A persona naming these modules, written as one made before 1.2 could have been;
    returns the platform_server_id that picks it."""
    server = uid("srv")
    with stack.sessions()() as session, session.begin():
        session.add(Persona(id=uuid.uuid4(), tenant_id=uuid.UUID(tenant_id), name=server,
                            platform="api", platform_server_id=server,
                            allowed_modules=list(modules)))
    return server


def offered(request: dict) -> set[str]:
    from agentq.llm.names import from_api_name
    return {from_api_name(t["function"]["name"]) for t in request.get("tools") or []}


def test_another_tenants_module_is_absent_on_every_module_route(stack, edge, module_b):
    a_admin, name = edge["a_admin"], module_b.name
    listing = a_admin.get("/v1/modules")
    assert listing.status_code == 200 and name not in listing.text
    refused(a_admin.post(f"/v1/modules/{name}/refresh"), 404, "not_found")
    refused(a_admin.http.delete(a_admin.url(f"/v1/modules/{name}"), timeout=30), 404,
            "not_found")
    assert count(stack, ToolModuleRow, ToolModuleRow.name == name) == 1
    # a persona of A cannot enable it (422), and nothing of B's is named back
    personas = count(stack, Persona, Persona.tenant_id == uuid.UUID(edge["a_id"]))
    error = refused(a_admin.post("/v1/personas", json={"name": uid("p"),
                                                       "allowed_modules": [name]}),
                    422, "validation_error")
    known = error["details"]["fields"]["allowed_modules"][0].partition("known:")[2]
    assert name not in known
    assert count(stack, Persona, Persona.tenant_id == uuid.UUID(edge["a_id"])) == personas
    # B's own admin sees and may enable it
    assert name in edge["b_admin"].get("/v1/modules").text
    created = edge["b_admin"].post("/v1/personas", json={"name": uid("p"),
                                                         "allowed_modules": [name]})
    assert created.status_code == 201, created.text
    drop_persona(edge["b_admin"], created.json()["id"])


def drop_persona(admin: Client, persona_id: str) -> None:
    """A tenant's first persona is its default: the later tests' jobs must not get it."""
    response = admin.http.delete(admin.url(f"/v1/personas/{persona_id}"), timeout=30)
    assert response.status_code == 200, response.text


def test_a_tenant_admin_cannot_register_a_global_module(stack, edge):
    module = ModuleProcess(uid("mg").replace("-", "_"), None).start()
    try:
        refused(edge["a_admin"].post("/v1/modules", json={
            "name": module.name, "url": module.url, "kind": "http", "global": True}),
            403, "forbidden")
        assert count(stack, ToolModuleRow, ToolModuleRow.name == module.name) == 0
        assert module.stats()["manifest_fetches"] == 0
        # an operator may; then every tenant's persona may enable it
        response = edge["operator"].post("/v1/modules", json={
            "name": module.name, "url": module.url, "kind": "http", "global": True})
        assert response.status_code == 201, response.text
        assert response.json()["global"] is True and response.json()["tenant_id"] is None
        assert module.name in edge["a_admin"].get("/v1/modules").text
        created = edge["a_admin"].post("/v1/personas", json={
            "name": uid("p"), "allowed_modules": [module.name]})
        assert created.status_code == 201, created.text
        drop_persona(edge["a_admin"], created.json()["id"])
    finally:
        edge["operator"].http.delete(edge["operator"].url(f"/v1/modules/{module.name}"),
                                     timeout=30)
        module.stop()


def test_another_tenants_module_is_never_offered_nor_run_for_a_job(
        stack, edge, script, module_b):
    name = module_b.name
    # a persona of A naming B's module (as one made before 1.2 could): the job is not
    # offered its tools, and the model calling one anyway reaches nothing
    server = persona_naming(stack, edge["a_id"], name, "math")

    def not_offered(request):
        tools = offered(request)
        assert "math.evaluate" in tools and not any(t.startswith(f"{name}.") for t in tools)
    marker = script([tool_calls(call(f"{name}.echo", {"text": "A's secret context"}),
                                check=not_offered)])
    job = edge["a"].wait(edge["a"].submit(f"{marker} use it", platform_server_id=server,
                                          limits=ONE_TURN)["id"])
    assert job["finish_reason"] == "max_iterations", job
    results = [e["data"] for e in edge["a"].events(job["id"])
               if e["type"] == "tool_execution_end"]
    assert [r["ok"] for r in results] == [False]
    assert results[0]["error"] == "tool_not_found", results
    stats = module_b.stats()
    assert stats["executes"] == 0 and stats["calls"] == []  # A's context never left
    # B's job under B's persona runs it, with B's context
    server_b = persona_naming(stack, edge["b_id"], name)
    marker = script([tool_calls(call(f"{name}.echo", {"text": "B"}))])
    job = edge["b"].wait(edge["b"].submit(f"{marker} use it", platform_server_id=server_b,
                                          limits=ONE_TURN)["id"])
    assert [e["data"]["ok"] for e in edge["b"].events(job["id"])
            if e["type"] == "tool_execution_end"] == [True], job
    calls = module_b.stats()["calls"]
    assert len(calls) == 1 and calls[0]["context"]["tenant_id"] == edge["b_id"]


# --- /metrics ------------------------------------------------------------------------------

def tool_series(client: Client) -> dict[tuple, float]:
    response = requests.get(client.url("/metrics"), timeout=30)
    assert response.status_code == 200, response.text[:300]
    out = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "agentq_tool_executions_total":
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def made_up_calls(client: Client, script, n: int) -> int:
    """A job whose model calls `n` tool names nobody registered; how many results it got."""
    calls = [call(f"made_up_{uuid.uuid4().hex[:8]}.tool_{i}", {}) for i in range(n)]
    marker = script([tool_calls(*calls)])
    job = client.wait(client.submit(f"{marker} invent", limits=ONE_TURN)["id"])
    assert job["finish_reason"] == "max_iterations", job
    return sum(1 for e in client.events(job["id"]) if e["type"] == "tool_execution_end")


def test_tool_names_a_model_made_up_add_no_series(edge, script):
    client = edge["a"]
    # the `other` series exists once any unknown name was counted
    made_up_calls(client, script, 1)
    other = (("outcome", "error"), ("tool", "other"))
    wait_until(lambda: tool_series(client).get(other, 0) >= 1, 30, what="other counted")
    before = tool_series(client)
    results = made_up_calls(client, script, 50)
    assert results >= 1
    after = wait_until(lambda: (lambda s: s if s.get(other, 0) >= before[other] + results
                                else None)(tool_series(client)), 30,
                       what="the 50 calls counted")
    assert set(after) == set(before)  # no new series
    assert not any("made_up" in value for labels in after for _k, value in labels)


def test_metrics_need_the_token_when_one_is_set(llm, tmp_path):
    token = uuid.uuid4().hex
    with own_stack("metrics_token", llm.base_url, tmp_path,
                   {"AGENTQ_METRICS_TOKEN": token}, workers=()) as stack:
        url = f"{stack.base}/metrics"
        refused(requests.get(url, timeout=30), 401, "unauthorized")
        refused(requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=30),
                401, "unauthorized")
        ok = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert ok.status_code == 200 and "agentq_jobs" in ok.text


# --- low items -------------------------------------------------------------------------------

def test_a_cron_that_never_fires_is_422(stack, edge, script):
    client = edge["a"]
    marker = script([text("ok")])
    job = client.wait(client.submit(f"{marker} hi")["id"])
    schedules = count(stack, Schedule)
    for cron in ("0 0 30 2 *", "0 0 31 4 *"):
        error = refused(client.post("/v1/schedules", json={
            "conversation_id": job["conversation_id"], "content": "x", "cron": cron}),
            422, "validation_error")
        assert "cron" in error["details"]["fields"]
    assert count(stack, Schedule) == schedules


class Files:
    """An attachment server on loopback: GET /<anything> answers that text."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = f"content of {self.path}".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"


FILE_ID = re.compile(r"file_id: ([0-9a-f-]{36})")


def test_any_attachment_name_is_served_and_cannot_split_headers(stack, edge, script):
    files = Files()
    client = edge["a"]
    names = ["отчёт.txt", "a\r\nSet-Cookie: pwned=1\r\nX-Evil: 1.txt", 'q"uote\\.txt',
             "typed.txt"]
    types = {"typed.txt": "text/plain\r\nX-Evil: 1"}  # a media type holding CR/LF too
    # the model reads each attachment (which fetches and stores it) by the file_ids the
    # message lists
    reads = tool_calls(*[call("files.read_document", {"file_id": "?"}, id=f"r{i}")
                         for i in range(len(names))])

    def read_them(request):
        ids = FILE_ID.findall(json.dumps(request["messages"], ensure_ascii=False)
                              .replace("\\n", "\n"))
        for i, entry in enumerate(reads.tool_calls):
            entry["function"]["arguments"] = json.dumps({"file_id": ids[i]})
    reads.check = read_them
    marker = script([reads])
    try:
        job = client.wait(client.submit(f"{marker} files", limits=ONE_TURN, attachments=[
            {"filename": name, "url": files.url(f"/{i}"),
             "mime_type": types.get(name, "text/plain")}
            for i, name in enumerate(names)])["id"])
    finally:
        files.server.shutdown()
        files.server.server_close()
    ended = [e["data"] for e in client.events(job["id"]) if e["type"] == "tool_execution_end"]
    assert [e["ok"] for e in ended] == [True] * len(names), ended
    with stack.sessions()() as session:
        records = {r.filename: str(r.id) for r in session.execute(
            select(FileRecord).where(FileRecord.job_id == uuid.UUID(job["id"]))).scalars()}
    assert set(records) == set(names)
    for name in names:
        response = client.get(f"/v1/files/{records[name]}")
        assert response.status_code == 200, (name, response.text[:300])
        assert response.content.startswith(b"content of /")
        disposition = response.headers["Content-Disposition"]
        # plain text is shown inline; a type that is not one is sent as bytes to save
        assert disposition.startswith("attachment;" if name in types else "inline;")
        assert "\r" not in disposition
        assert "Set-Cookie" not in response.headers and "X-Evil" not in response.headers
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    assert "filename*=UTF-8''%D0%BE%D1%82%D1%87%D1%91%D1%82.txt" in client.get(
        f"/v1/files/{records[names[0]]}").headers["Content-Disposition"]


def test_an_html_file_is_an_attachment_with_nosniff_and_a_csp(stack, edge, script):
    client = edge["a"]
    marker = script([tool_calls(call("files.create_document", {
        "title": "page", "format": "html",
        "content": "<script>fetch('/v1/jobs').then(r => r.text())</script>"}))])
    job = client.wait(client.submit(f"{marker} page", limits=ONE_TURN)["id"])
    with stack.sessions()() as session:
        file_id = session.execute(select(FileRecord.id).where(
            FileRecord.job_id == uuid.UUID(job["id"]))).scalar_one()
    response = client.get(f"/v1/files/{file_id}")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/html")
    assert response.headers["Content-Disposition"].startswith("attachment;")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in response.headers["Content-Security-Policy"]


def test_invalid_utf8_is_400_naming_the_encoding_and_writes_nothing(stack, edge):
    client = edge["a"]
    jobs, batches = count(stack, Job), count(stack, Batch)
    body = json.dumps({"platform": "api", "platform_user_id": uid("u"),
                       "platform_channel_id": uid("c"), "content": "MARK"}).encode()
    response = client.post("/v1/messages", data=body.replace(b"MARK", b"caf\xe9 \xff"),
                           headers={"Content-Type": "application/json"})
    error = refused(response, 400, "bad_encoding")
    assert "UTF-8" in error["message"]
    line = json.dumps({"platform": "api", "platform_user_id": uid("u"),
                       "platform_channel_id": uid("c"), "content": "fine"}).encode()
    jsonl = line + b"\n" + line.replace(b"fine", b"\xc3\x28") + b"\n"
    error = refused(client.post("/v1/batches", data=jsonl,
                                headers={"Content-Type": "application/x-ndjson"}),
                    400, "bad_encoding")
    assert error["details"]["line"] == 2 and "Line 2" in error["message"]
    refused(client.get(f"/v1/jobs/{uuid.uuid4()}?wait=%ff"), 400, "bad_encoding")
    refused(client.get("/v1/schedules?status=%00"), 400, "bad_request")  # NUL: no 500
    assert (count(stack, Job), count(stack, Batch)) == (jobs, batches)


def test_embed_is_paid_from_the_users_budget(stack, edge, llm):
    client, admin = edge["a"], edge["a_admin"]
    who = {"platform": "api", "platform_user_id": uid("embedder")}
    first = client.post("/v1/embed", json={"text": "four tokens of text", **who})
    assert first.status_code == 200, first.text
    with stack.sessions()() as session:
        user = session.execute(select(User).join(
            UserPlatformLink, UserPlatformLink.user_id == User.id).where(
            UserPlatformLink.platform_user_id == who["platform_user_id"])).scalar_one()
        user_id, used = user.id, user.tokens_used_this_month
    assert used >= 1
    patched = admin.http.patch(admin.url(f"/v1/users/{user_id}"),
                               json={"token_budget_monthly": used + 5}, timeout=30)
    assert patched.status_code == 200, patched.text
    calls, logs = llm.embedding_calls, count(stack, TokenLog, TokenLog.user_id == user_id)
    # a text past what is left is refused before the provider is asked; nothing is charged
    response = client.post("/v1/embed", json={"text": "x" * 400, **who})
    refused(response, 429, "budget_exceeded")
    assert int(response.headers["Retry-After"]) > 0
    assert llm.embedding_calls == calls
    assert count(stack, TokenLog, TokenLog.user_id == user_id) == logs
    with stack.sessions()() as session:
        assert session.get(User, user_id).tokens_used_this_month == used
    # what fits is paid
    assert client.post("/v1/embed", json={"text": "tiny", **who}).status_code == 200
    with stack.sessions()() as session:
        assert session.get(User, user_id).tokens_used_this_month > used
    # a body naming no user pays from the key's own
    assert client.post("/v1/embed", json={"text": "the key's own"}).status_code == 200
    assert count(stack, UserPlatformLink, UserPlatformLink.platform == "api_key") >= 1


def test_a_plain_keys_replay_picks_only_a_model_the_persona_allows(stack, edge, script):
    client = edge["a"]
    marker = script([text("first"), text("again", expect_model="fallback-model")])
    job = client.wait(client.submit(f"{marker} q")["id"])
    replays = count(stack, Job, Job.replay_of == uuid.UUID(job["id"]))
    for path, body in ((f"/v1/jobs/{job['id']}/replay", {"mode": "live",
                                                         "model": "any-model-i-like"}),
                       ("/v1/batches/replay", {"mode": "live", "model": "any-model-i-like",
                                               "job_ids": [job["id"]]})):
        error = refused(client.post(path, json=body), 422, "validation_error")
        assert "model" in error["details"]["fields"]
    assert count(stack, Job, Job.replay_of == uuid.UUID(job["id"])) == replays
    # a configured model is allowed
    response = client.post(f"/v1/jobs/{job['id']}/replay",
                           json={"mode": "live", "model": "fallback-model"})
    assert response.status_code == 202, response.text
    assert client.wait(response.json()["id"])["status"] == "completed"
