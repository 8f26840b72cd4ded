"""The served OpenAPI document, through HTTP against the real stack: it is valid OpenAPI 3,
it documents every route the app serves, and schemathesis, generating requests from it,
finds no server error and no response that breaks it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import requests
from openapi_spec_validator import validate
from sqlalchemy import func, select, update

from agentq.keys import lookup
from agentq.models import Job, Schedule
from agentq.testing.scripted_llm import SCRIPT_KEY_RE, text
from tests.support.api import uid
from tests.support.stack import ROOT

pytestmark = pytest.mark.integration

# 30 examples per operation in CI (half the cases of 60, found the same); AGENTQ_ST_MAX_EXAMPLES=200
# for a deeper run
SCHEMATHESIS_MAX_EXAMPLES = int(os.environ.get("AGENTQ_ST_MAX_EXAMPLES", "30"))
SCHEMATHESIS_SEED = os.environ.get("AGENTQ_ST_SEED", "1")
SCHEMATHESIS_TIMEOUT_S = 1800
"""Hang protection only (the run takes about a minute on a quiet 2-core machine, several on a
saturated one): the test's own pytest timeout is set above it."""
# Checks that judge the API's answers. Left out: `negative_data_rejection` and
# `positive_data_acceptance` (the API validates rules a schema cannot say: Last-Event-ID
# overrides `after`; a `recorded` replay takes no `model`), `unsupported_method` and
# `allow_header_conformance` (GET /v1/batches/replay is GET /v1/batches/<batch_id> with the id
# "replay": a 404, not a 405; API.md's paths).
SCHEMATHESIS_CHECKS = ("not_a_server_error", "status_code_conformance",
                       "content_type_conformance", "response_headers_conformance",
                       "response_schema_conformance", "missing_required_header",
                       "ignored_auth", "use_after_free", "ensure_resource_availability")

ROUTES_SCRIPT = """
import json
from flask import Flask
from api import create_app
from api.openapi import UndocumentedRoute, app_routes, build_spec
app = create_app()
routes = app_routes(app)
build_spec(app)
extra = Flask("extra")
extra.add_url_rule("/v1/undocumented/<thing_id>", "undocumented", lambda thing_id: "")
try:
    build_spec(extra)
    raised = None
except UndocumentedRoute as exc:
    raised = str(exc)
print(json.dumps({"routes": routes, "raised": raised}))
"""


@pytest.fixture(scope="module")
def spec(stack) -> dict:
    response = requests.get(f"{stack.base}/openapi.json", timeout=10)  # no key needed
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    return response.json()


def test_the_served_spec_is_valid_openapi_3(spec):
    validate(spec)  # raises with the first problem
    assert spec["openapi"].startswith("3.")
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["bearerAuth"]["description"]}


def test_every_route_the_app_serves_is_in_the_spec_and_an_undocumented_one_raises(stack, spec):
    result = subprocess.run([sys.executable, "-c", ROUTES_SCRIPT], cwd=ROOT, env=stack.env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    routes = found["routes"]
    assert any(rule.startswith("/v1/") for _m, rule in routes)
    missing = []
    for method, rule in routes:
        path = rule.replace("<", "{").replace(">", "}")
        if method.lower() not in spec["paths"].get(path, {}):
            missing.append(f"{method} {rule}")
    assert not missing, f"routes missing from /openapi.json: {missing}"
    assert found["raised"] and "GET /v1/undocumented/<thing_id>" in found["raised"]


def test_the_spec_says_what_api_md_says(spec):
    paths = spec["paths"]
    submit = paths["/v1/messages"]["post"]
    assert set(submit["responses"]) >= {"202", "200", "401", "409", "415", "422"}
    assert submit["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MessageRequest"}
    names = {p["$ref"].rsplit("/", 1)[-1] for p in submit["parameters"]}
    assert names == {"wait", "idempotency_key"}
    assert spec["components"]["parameters"]["idempotency_key"]["name"] == "Idempotency-Key"
    assert set(paths["/v1/jobs/{job_id}/cancel"]["post"]["responses"]) >= {"202", "409"}
    events = paths["/v1/jobs/{job_id}/events"]["get"]
    assert set(events["responses"]["200"]["content"]) == {"application/json",
                                                          "text/event-stream"}
    assert {"after", "Last-Event-ID"} <= {
        spec["components"]["parameters"][p["$ref"].rsplit("/", 1)[-1]]["name"]
        for p in events["parameters"] if "$ref" in p}
    messages = paths["/v1/conversations/{conversation_id}/messages"]["get"]
    assert {"after", "limit"} <= {
        spec["components"]["parameters"][p["$ref"].rsplit("/", 1)[-1]]["name"]
        for p in messages["parameters"] if "$ref" in p}
    assert "application/octet-stream" in \
        paths["/v1/files/{file_id}"]["get"]["responses"]["200"]["content"]
    error = spec["components"]["schemas"]["ErrorBody"]
    assert set(error["properties"]) == {"code", "message", "details"}
    for status in ("401", "403", "404", "409", "415", "422"):
        assert spec["components"]["responses"][
            {"401": "Unauthorized", "403": "Forbidden", "404": "NotFound",
             "409": "Conflict", "415": "UnsupportedMediaType",
             "422": "ValidationError"}[status]]["content"]["application/json"]["schema"] \
            == {"$ref": "#/components/schemas/Error"}
    assert "503" in paths["/health/ready"]["get"]["responses"]
    assert paths["/health"]["get"]["security"] == []
    assert spec["security"] == [{"bearerAuth": []}]
    for path, method, status in (("/v1/admin/tenants", "post", "201"),
                                 ("/v1/admin/tenants", "get", "200"),
                                 ("/v1/admin/keys", "post", "201"),
                                 ("/v1/admin/keys", "get", "200"),
                                 ("/v1/admin/keys/{key_id}/revoke", "post", "200")):
        assert {status, "403"} <= set(paths[path][method]["responses"]), path
    assert "413" in submit["responses"] and "400" in submit["responses"]
    assert "key" in spec["components"]["schemas"]["NewApiKey"]["required"]
    assert "key" not in spec["components"]["schemas"]["ApiKey"]["properties"]
    job = spec["components"]["schemas"]["Job"]
    assert set(job["required"]) == {
        "id", "status", "finish_reason", "conversation_id", "created_at",
        "started_at",
        "finished_at", "iterations", "usage", "response", "replay_of", "batch_id",
        "follow_up_job_id", "limits", "metadata",  # follow-ups, limits: docs/api-events.md
        "limits_applied",  # the limits that apply, beside those asked for (issue 31)
        "parent_job_id", "children",  # sub-agents: API.md 1.2, docs/sub-agents.md
        "waiting_for"}  # waiting_for: API.md 1.1, with status `waiting`
    assert "waiting" in job["properties"]["status"]["enum"]
    assert set(job["properties"]["waiting_for"]["enum"]) >= {"provider", "approval",
                                                             "conversation", "batch"}


def _unscripted_ok(request: dict):
    """Answers the model calls of schemathesis' jobs (no script:<key> marker); anything
    carrying a marker falls through to the scripted server's own bookkeeping."""
    for message in request.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if SCRIPT_KEY_RE.search(json.dumps(content)):
            return None
    return text("ok")


def _live_jobs(stack, api_key_id) -> int:
    with stack.sessions()() as session:
        return session.execute(select(func.count()).select_from(Job).where(
            Job.api_key_id == api_key_id, Job.status.in_(("queued", "running")))).scalar_one()


def _server_errors(stack, since_line: int) -> str:
    log = Path(stack.logs["web"]).read_text(errors="replace").splitlines()[since_line:]
    return "\n".join(line[-4000:] for line in log if '"ERROR"' in line)[-12000:]


@pytest.mark.timeout(SCHEMATHESIS_TIMEOUT_S + 300)
def test_schemathesis_finds_no_server_error_and_no_response_off_the_spec(
        stack, llm, tmp_path, capsys):
    # a tenant of its own: the admin routes it calls (personas, users, schedules) change
    # only that tenant, never the default one that other tests submit to
    key = stack.create_key("schemathesis", admin=True,
                           tenant=stack.create_tenant(uid("schemathesis")))
    with stack.sessions()() as session:
        api_key_id = lookup(session, key).id
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {key}"
    previous, llm.responder = llm.responder, _unscripted_ok
    log_start = len(Path(stack.logs["web"]).read_text(errors="replace").splitlines())
    try:
        # One ended job, so that a replay batch's filter (pinned by the hooks to its
        # creation instant) replays exactly it.
        seed = http.post(f"{stack.base}/v1/messages", params={"wait": 30}, timeout=40, json={
            "platform": "api", "platform_user_id": uid("st"), "platform_channel_id": uid("c"),
            "content": "seed"}).json()
        assert seed["status"] == "completed", seed
        created = datetime.fromisoformat(seed["created_at"])
        window = f"{created.isoformat()},{(created + timedelta(milliseconds=1)).isoformat()}"

        config = tmp_path / "schemathesis.toml"
        config.write_text('[auth.openapi.bearerAuth]\nbearer = "${AGENTQ_ST_KEY}"\n')
        report = tmp_path / "report.json"
        env = {**os.environ, "AGENTQ_ST_KEY": key, "AGENTQ_ST_REPLAY_WINDOW": window,
               "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks",
               "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
        command = [str(Path(sys.executable).with_name("schemathesis")),
                   "--config-file", str(config), "run", f"{stack.base}/openapi.json",
                   "--checks", ",".join(SCHEMATHESIS_CHECKS),
                   "--max-examples", str(SCHEMATHESIS_MAX_EXAMPLES),
                   "--seed", SCHEMATHESIS_SEED, "--workers", "1",
                   "--request-timeout", "70", "--generation-database", "none",
                   "--no-color", "--report", "json", "--report-json-path", str(report)]
        started = time.monotonic()
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=SCHEMATHESIS_TIMEOUT_S)
        elapsed = time.monotonic() - started

        with stack.sessions()() as session, session.begin():  # no schedule of it fires on
            session.execute(update(Schedule).where(Schedule.api_key_id == api_key_id)
                            .values(status="cancelled", next_run_at=None))
        # its jobs end (every one is answered at once by the scripted model); a job that
        # never ends leaves this loop to the test's timeout
        while _live_jobs(stack, api_key_id):
            time.sleep(0.2)
        live = _live_jobs(stack, api_key_id)
    finally:
        llm.responder = previous

    summary = json.loads(report.read_text()) if report.exists() else {}
    cases = summary.get("test_cases", {})
    with capsys.disabled():
        print(f"\nschemathesis: {cases.get('generated')} cases on "
              f"{summary.get('operations', {}).get('tested')} operations in {elapsed:.0f} s, "
              f"{cases.get('with_failures')} with failures")
    assert run.returncode == 0 and not summary.get("failures") and not summary.get("errors"), (
        f"schemathesis failed (exit {run.returncode}):\n{run.stdout[-20000:]}\n"
        f"{run.stderr[-5000:]}\nserver errors in web.log:\n{_server_errors(stack, log_start)}")
    assert cases.get("generated", 0) > 100
    assert http.get(f"{stack.base}/v1/jobs/{seed['id']}", timeout=10).status_code == 200, \
        "the run revoked its own key"
    assert live == 0
