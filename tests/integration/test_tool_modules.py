"""HTTP tool modules through the real stack: a module served by a real local process
(examples/http_module.py) is registered through the API, discovered and cached (the workers
read the cache: the module serves its manifest once), called from a job through a chord on
its own queue with parallel calls, every request's signature verified by the module; its
timeout, its 500 and its refusal reach the model as tool errors; removing it or its failure
hides its tools."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest
import requests

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import uid
from tests.support.module_process import OTHER_SECRET, SECRET, ModuleProcess
from tests.support.stack import ROOT, die_with_parent, free_port

pytestmark = pytest.mark.integration

WAIT_S = 30


@pytest.fixture
def modules(client):
    """Start module processes; every one registered is removed and stopped at the end."""
    started: list[ModuleProcess] = []

    def start(*extra: str, secret: str | None = SECRET, name: str | None = None,
              port: int | None = None) -> ModuleProcess:
        module = ModuleProcess(name or uid("m").replace("-", "_"), secret, *extra,
                               port=port).start()
        started.append(module)
        return module
    yield start
    for module in started:
        client.http.delete(client.url(f"/v1/modules/{module.name}"), timeout=30)
        module.stop()


def register(client, module: ModuleProcess, secret: str | None = SECRET, **fields):
    body = {"name": module.name, "url": module.url, "kind": "http", **fields}
    if secret:
        body["secret"] = secret
    return client.post("/v1/modules", json=body)


def persona_for(stack, *modules: str) -> str:
    """A persona of the default tenant offering these modules; returns the
    platform_server_id that selects it."""
    from agentq.models import Persona
    from agentq.tenants import DEFAULT_TENANT_ID
    server = uid("srv")
    with stack.sessions()() as session, session.begin():
        session.add(Persona(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID, name=server,
                            platform="api", platform_server_id=server,
                            allowed_modules=list(modules)))
    return server


def tool_results(request: dict) -> list[dict]:
    return [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]


def offered(request: dict) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or []}


def until(predicate, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


def listed(client, name: str) -> dict:
    response = client.get("/v1/modules")
    assert response.status_code == 200, response.text
    return next(m for m in response.json()["data"] if m["name"] == name)


def test_a_module_is_discovered_cached_and_called_in_parallel_with_signatures(
        client, script, stack, modules):
    module = modules()
    response = register(client, module)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["kind"] == "http" and body["signed"] is True
    assert body["health"]["status"] == "ok"
    assert {t["name"] for t in body["tools"]} == {
        f"{module.name}.{t}" for t in ("add", "echo", "sleep", "fail", "refuse", "garble")}
    assert SECRET not in response.text and SECRET[6:] not in client.get("/v1/modules").text
    assert listed(client, module.name)["health"]["status"] == "ok"
    assert module.stats()["manifest_fetches"] == 1

    name = module.name
    server = persona_for(stack, name)

    def offers_module(request):
        assert f"{name}-add" in offered(request) and f"{name}-echo" in offered(request)

    def sees_results(request):
        results = tool_results(request)
        assert results[:2] == [3, 7], results
        assert results[2]["text"] == "hi"

    marker = script([tool_calls(call(f"{name}.add", {"a": 1, "b": 2}),
                                call(f"{name}.add", {"a": 3, "b": 4}),
                                call(f"{name}.echo", {"text": "hi"}), check=offers_module),
                     text("done", check=sees_results)])
    user = uid("u")
    job = client.wait(client.submit(f"{marker} add", user=user,
                                    platform_server_id=server)["id"])
    assert job["status"] == "completed", job
    assert [c["success"] for c in job["response"]["metadata"]["tool_calls"]] == [True] * 3

    starts = [e for e in client.events(job["id"]) if e["type"] == "tool_execution_start"]
    assert {e["data"]["queue"] for e in starts} == {f"tools.{name}"}

    stats = module.stats()
    assert stats["manifest_fetches"] == 1  # the workers read the cache; none fetched again
    assert stats["executes"] == 3 and stats["bad_signatures"] == 0
    assert stats["verified"] >= 4  # the manifest request and every call were signed
    echo = next(c for c in stats["calls"] if c["tool"] == f"{name}.echo")
    context = echo["context"]
    assert context["platform"] == "api" and context["conversation_id"] == job["conversation_id"]
    assert context["tenant_id"] == "00000000-0000-0000-0000-000000000001"
    assert context["user_id"] and context["tool_use_id"] == echo["tool_use_id"]
    assert echo["tool_use_id"] in {e["data"]["tool_use_id"] for e in starts}

    ready = client.get("/health/ready").json()
    assert ready["modules"][name] == {"kind": "http", "status": "ok", "error": None}


def test_timeout_500_refusal_and_a_bad_answer_become_tool_errors_for_the_model(
        client, script, stack, modules):
    module = modules()
    assert register(client, module).status_code == 201
    name = module.name
    server = persona_for(stack, name)

    def sees_errors(request):
        results = tool_results(request)
        assert [r["error"]["code"] for r in results] == [
            "tool_timeout", "module_http_error", "module_error", "module_bad_answer"], results
        assert "This tool always refuses." in results[2]["error"]["message"]

    marker = script([tool_calls(call(f"{name}.sleep", {"seconds": 30}),
                                call(f"{name}.fail", {}), call(f"{name}.refuse", {}),
                                call(f"{name}.garble", {})),
                     text("they failed", check=sees_errors)])
    job = client.wait(client.submit(f"{marker} fail", platform_server_id=server)["id"],
                      timeout_s=90)
    assert job["status"] == "completed" and job["response"]["content"] == "they failed", job
    assert [c["success"] for c in job["response"]["metadata"]["tool_calls"]] == [False] * 4
    assert listed(client, name)["health"]["status"] == "ok"  # a tool's error is not the module's


def test_a_bad_manifest_a_wrong_signature_and_a_taken_name_are_refused(client, modules):
    bad = modules("--bad-manifest")
    response = register(client, bad)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "parameters" in error["message"] and "type 'object'" in error["message"]
    assert "manifest" in error["details"]["fields"]

    module = modules()
    response = register(client, module, secret=OTHER_SECRET)
    assert response.status_code == 422, response.text
    assert "401" in response.json()["error"]["message"]
    assert OTHER_SECRET[6:] not in response.text
    assert module.stats()["bad_signatures"] == 1

    response = register(client, module, secret="not-a-secret")
    assert response.status_code == 422 and "secret" in response.json()["error"]["details"]["fields"]
    assert "not-a-secret" not in response.text

    assert register(client, module).status_code == 201
    assert register(client, module).status_code == 409
    taken = client.post("/v1/modules", json={"name": "math", "url": module.url})
    assert taken.status_code == 422, taken.text
    assert client.post(f"/v1/modules/{uid('nope').replace('-', '_')}/refresh").status_code == 404
    assert client.http.delete(client.url("/v1/modules/math")).status_code == 409


def test_refresh_fetches_again_and_removal_hides_the_tools(client, script, stack, modules):
    module = modules()
    assert register(client, module).status_code == 201
    name = module.name
    response = client.post(f"/v1/modules/{name}/refresh")
    assert response.status_code == 200 and response.json()["health"]["status"] == "ok"
    assert module.stats()["manifest_fetches"] == 2

    assert client.http.delete(client.url(f"/v1/modules/{name}")).status_code == 204
    assert all(m["name"] != name for m in client.get("/v1/modules").json()["data"])
    server = persona_for(stack, name, "math")

    def not_offered(request):
        names = offered(request)
        assert "math-evaluate" in names and not any(n.startswith(f"{name}-") for n in names)

    def sees_unknown(request):
        assert tool_results(request)[0]["error"]["code"] == "tool_not_found"

    marker = script([tool_calls(call(f"{name}.add", {"a": 1, "b": 1}), check=not_offered),
                     text("gone", check=sees_unknown)])
    job = client.wait(client.submit(f"{marker} add", platform_server_id=server)["id"])
    assert job["status"] == "completed", job
    assert module.stats()["executes"] == 0


def test_a_failed_module_is_unhealthy_and_its_tools_hidden_until_it_answers_again(
        client, script, stack, modules):
    module = modules()
    assert register(client, module).status_code == 201
    name = module.name
    server = persona_for(stack, name, "math")
    module.stop()

    def sees_unavailable(request):
        assert tool_results(request)[0]["error"]["code"] == "module_unavailable"

    marker = script([tool_calls(call(f"{name}.add", {"a": 1, "b": 1})),
                     text("down", check=sees_unavailable)])
    job = client.wait(client.submit(f"{marker} add", platform_server_id=server)["id"])
    assert job["status"] == "completed", job

    until(lambda: listed(client, name)["health"]["status"] == "unhealthy", "unhealthy")
    assert listed(client, name)["health"]["error"]
    assert client.get("/health/ready").json()["modules"][name]["status"] == "unhealthy"

    def not_offered(request):
        names = offered(request)
        assert "math-evaluate" in names and not any(n.startswith(f"{name}-") for n in names)

    marker = script([text("no tools of it", check=not_offered)])
    job = client.wait(client.submit(f"{marker} add", platform_server_id=server)["id"])
    assert job["status"] == "completed", job

    back = modules(name=name, port=module.port)  # the same module answers again
    until(lambda: listed(client, name)["health"]["status"] == "ok", "healthy again")
    assert back.stats()["manifest_fetches"] >= 1


# --- MCP servers ----------------------------------------------------------------------------

MCP_TOOLS = ("add", "shout", "whoami", "fail", "environ", "sleep")

class McpHttpProcess:
    """examples/mcp_server.py over streamable HTTP, in its own process."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.mcp_server", "--http", "--port", str(self.port)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            preexec_fn=die_with_parent)
        assert self.proc.stdout.readline().strip() == self.url

    def wait_listening(self) -> None:
        def answers():
            try:
                requests.get(self.url, timeout=2)
                return True
            except requests.ConnectionError:
                return False
        until(answers, "the MCP server listening")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc.stdout.close()


def mcp_job(client, script, stack, name: str) -> dict:
    """A job calling the module's tools in parallel, one of them failing."""
    server = persona_for(stack, name)

    def offers_schemas(request):
        tools = {t["function"]["name"]: t["function"] for t in request["tools"]}
        assert set(tools) == {f"{name}-{t}" for t in MCP_TOOLS}
        assert tools[f"{name}-add"]["parameters"]["required"] == ["a", "b"]

    def sees_results(request):
        results = tool_results(request)
        assert results[0] == {"result": 5.0} and results[1] == {"result": "HI!"}, results
        assert results[2]["error"]["code"] == "module_error"
        assert "no such thing" in results[2]["error"]["message"]

    marker = script([tool_calls(call(f"{name}.add", {"a": 2, "b": 3}),
                                call(f"{name}.shout", {"text": "hi"}),
                                call(f"{name}.fail", {"message": "no such thing"}),
                                check=offers_schemas),
                     text("mcp done", check=sees_results)])
    job = client.wait(client.submit(f"{marker} mcp", platform_server_id=server)["id"],
                      timeout_s=60)
    assert job["status"] == "completed" and job["response"]["content"] == "mcp done", job
    assert [c["success"] for c in job["response"]["metadata"]["tool_calls"]] == \
        [True, True, False]
    starts = [e for e in client.events(job["id"]) if e["type"] == "tool_execution_start"]
    assert {e["data"]["queue"] for e in starts} == {f"tools.{name}"}
    return job


def whoami(client, script, stack, name: str) -> int:
    """The pid of the MCP server process that answered a job's call: the same in two jobs
    when the tool worker kept its session (one tools worker process in the test stack)."""
    seen = {}

    def record(request):
        seen["pid"] = tool_results(request)[0]["pid"]

    marker = script([tool_calls(call(f"{name}.whoami", {})), text("ok", check=record)])
    job = client.wait(client.submit(f"{marker} who", platform_server_id=persona_for(
        stack, name))["id"], timeout_s=60)
    assert job["status"] == "completed", job
    return seen["pid"]


def environ(client, script, stack, name: str) -> list[str]:
    """The names in the environment of the stdio MCP server a tools worker started (the
    tools worker's own holds AGENTQ_DATABASE_URL, the broker's URL, ...)."""
    seen = {}

    def record(request):
        seen["names"] = tool_results(request)[0]["names"]

    marker = script([tool_calls(call(f"{name}.environ", {})), text("ok", check=record)])
    job = client.wait(client.submit(f"{marker} env", platform_server_id=persona_for(
        stack, name))["id"], timeout_s=60)
    assert job["status"] == "completed", job
    return seen["names"]


def test_an_mcp_server_over_stdio_is_called_from_a_job(client, script, stack):
    name = uid("mcp").replace("-", "_")
    command = f"{sys.executable} -m examples.mcp_server"
    refused = client.post("/v1/modules", json={"name": name, "kind": "mcp",
                                               "command": command.split()})
    assert refused.status_code == 422 and "command" in refused.json()["error"]["details"]["fields"]

    added = stack.agentq("modules", "add", name, "--command", command)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["kind"] == "mcp"
    try:
        listed_module = listed(client, name)
        assert listed_module["health"]["status"] == "ok"
        lines = [json.loads(line) for line in stack.agentq("modules", "list").stdout.split("\n")
                 if line]
        assert {"math", name} <= {m["name"] for m in lines}
        assert next(m for m in lines if m["name"] == name)["kind"] == "mcp"
        assert listed_module["command"] == command.split()
        mcp_job(client, script, stack, name)
        assert whoami(client, script, stack, name) == whoami(client, script, stack, name)
        names = environ(client, script, stack, name)
        assert "PATH" in names
        assert [n for n in names if n.startswith(("AGENTQ_", "OPENAI_", "DATABASE"))
                or any(word in n for word in ("SECRET", "KEY", "TOKEN", "PASSWORD"))] == []
    finally:
        assert stack.agentq("modules", "remove", name).returncode == 0


def test_an_mcp_server_over_streamable_http_is_called_from_a_job(client, script, stack):
    server = McpHttpProcess()
    name = uid("mcp").replace("-", "_")
    try:
        server.wait_listening()
        response = client.post("/v1/modules", json={"name": name, "kind": "mcp",
                                                    "url": server.url})
        assert response.status_code == 201, response.text
        assert {t["name"] for t in response.json()["tools"]} == {
            f"{name}.{t}" for t in MCP_TOOLS}
        mcp_job(client, script, stack, name)
    finally:
        client.http.delete(client.url(f"/v1/modules/{name}"), timeout=30)
        server.stop()


def test_a_slow_module_runs_on_its_slow_queue(client, script, stack, modules):
    module = modules()
    response = register(client, module, slow=True)
    assert response.status_code == 201 and response.json()["slow"] is True
    name = module.name

    def sees_sum(request):
        assert tool_results(request) == [42]

    marker = script([tool_calls(call(f"{name}.add", {"a": 40, "b": 2})),
                     text("slow done", check=sees_sum)])
    job = client.wait(client.submit(f"{marker} add", platform_server_id=persona_for(
        stack, name))["id"], timeout_s=60)
    assert job["status"] == "completed", job
    starts = [e for e in client.events(job["id"]) if e["type"] == "tool_execution_start"]
    assert [e["data"]["queue"] for e in starts] == [f"tools.slow.{name}"]
    assert module.stats()["executes"] == 1


def add_mcp(stack, *options: str) -> str:
    """examples/mcp_server.py over stdio, registered from the CLI with these options."""
    name = uid("mcp").replace("-", "_")
    added = stack.agentq("modules", "add", name, "--command",
                         f"{sys.executable} -m examples.mcp_server", *options)
    assert added.returncode == 0, added.stderr
    return name


def waiting_for_approval(client, job_id: str) -> dict:
    def check():
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["status"] == "waiting" else None
    return until(check, f"job {job_id} waiting", timeout_s=60)


def test_a_module_registered_with_defaults_refuses_bad_ones(client):
    for fields, field in [({"permission": "root"}, "permission"),
                          ({"requires_approval": "yes"}, "requires_approval"),
                          ({"requires_approval": ["Not A Tool"]}, "requires_approval"),
                          ({"timeout_s": 0}, "timeout_s"), ({"timeout_s": "soon"}, "timeout_s")]:
        response = client.post("/v1/modules", json={"name": uid("m").replace("-", "_"),
                                                    "kind": "mcp",
                                                    "url": "http://127.0.0.1:9/mcp", **fields})
        assert response.status_code == 422, (fields, response.text)
        error = response.json()["error"]
        assert error["code"] == "validation_error" and field in error["details"]["fields"]


def test_an_mcp_tool_registered_for_users_is_refused_to_a_guest(client, script, stack):
    name = add_mcp(stack, "--permission", "user")
    try:
        module = listed(client, name)
        assert module["permission"] == "user"
        assert {t["permission"] for t in module["tools"]} == {"user"}
        user = uid("u")
        seen = {}

        def refused(request):
            seen["results"] = tool_results(request)

        marker = script([tool_calls(call(f"{name}.add", {"a": 1, "b": 2}),
                                    check=lambda request: seen.setdefault(
                                        "offered", offered(request))),
                         text("refused", check=refused)])
        server = persona_for(stack, name)
        job = client.wait(client.submit(f"{marker} guest", user=user,
                                        platform_server_id=server)["id"], timeout_s=60)
        assert job["status"] == "completed", job
        assert seen["offered"] == set()  # not offered to a guest
        [result] = seen["results"]
        assert result["error"]["code"] in ("tool_not_permitted", "tool_not_found"), result

        # the same user, made a `user`, is offered it and its call runs
        from agentq.models import User, UserPlatformLink
        with stack.sessions()() as session, session.begin():
            link = session.query(UserPlatformLink).filter_by(platform="api",
                                                             platform_user_id=user).one()
            session.get(User, link.user_id).permission_level = "user"
        marker = script([tool_calls(call(f"{name}.add", {"a": 1, "b": 2}),
                                    check=lambda request: seen.update(
                                        offered=offered(request))),
                         text("ran", check=refused)])
        job = client.wait(client.submit(f"{marker} user", user=user,
                                        platform_server_id=server)["id"], timeout_s=60)
        assert job["status"] == "completed", job
        assert f"{name}-add" in seen["offered"]
        assert seen["results"] == [{"result": 3.0}]
    finally:
        assert stack.agentq("modules", "remove", name).returncode == 0


def test_an_approval_gated_mcp_call_waits_and_a_slow_one_times_out(client, script, stack):
    # a time limit a quick call keeps on a loaded machine (the MCP server starts inside it),
    # and a sleep far past it
    name = add_mcp(stack, "--approval", "add", "--timeout", "15")
    try:
        module = listed(client, name)
        assert (module["requires_approval"], module["timeout_s"]) == (["add"], 15.0)
        seen = {}
        marker = script([tool_calls(call(f"{name}.add", {"a": 2, "b": 2}),
                                    call(f"{name}.sleep", {"seconds": 120})),
                         text("done", check=lambda request: seen.setdefault(
                             "results", tool_results(request)))])
        job = client.submit(f"{marker} gated", platform_server_id=persona_for(stack, name))
        shown = waiting_for_approval(client, job["id"])
        assert shown["waiting_for"] == "approval"
        request = until(lambda: next((e["data"] for e in client.events(job["id"])
                                      if e["type"] == "approval_required"), None),
                        "approval_required")
        assert request["name"] == f"{name}.add" and request["arguments"] == {"a": 2, "b": 2}
        approved = client.post(f"/v1/jobs/{job['id']}/tool_calls/{request['tool_use_id']}"
                               "/approve")
        assert approved.status_code in (200, 202), approved.text
        ended = client.wait(job["id"], timeout_s=90)
        assert ended["status"] == "completed" and ended["response"]["content"] == "done"
        added, slept = seen["results"]
        assert added == {"result": 4.0}
        assert slept["error"]["code"] == "tool_timeout", slept
        assert [c["success"] for c in ended["response"]["metadata"]["tool_calls"]] == \
            [True, False]
        assert listed(client, name)["health"]["status"] == "ok"  # a slow call is not a dead one
    finally:
        assert stack.agentq("modules", "remove", name).returncode == 0
