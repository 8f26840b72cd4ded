"""External tool modules without the stack: registration checks (SSRF guard, secrets),
AGENTQ_TOOL_MODULES, manifests checked by the in-process rules, the cache shared through
the store (a second process does not fetch), health hiding tools, and calls against the
example module in its own process (signed, errors as tool errors)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from agentq.config import Settings
from agentq.errors import ConfigError, ManifestError, ValidationFailed
from agentq.tools.manifest import ToolContext
from agentq.tools.mcp import tool_name
from agentq.tools.registry import ToolRegistry
from agentq.tools.remote import (
    ModuleSpec,
    RemoteModules,
    Store,
    build_module,
    check_spec,
    one_version_read,
)
from tests.support.stack import ROOT, die_with_parent, free_port

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _settings(**env) -> Settings:
    return Settings.from_env({"AGENTQ_MODULE_SYNC_S": "0", **env})


def _manifest(name="demo", **tool):
    return {"module": name, "tools": [{"name": f"{name}.add", "description": "Add.",
                                       "parameters": {"type": "object"}, **tool}]}


def _never(*_args):
    raise AssertionError("not called")


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/", "http://10.0.0.1/", "http://[::1]/",
                                 "http://169.254.169.254/latest", "http://localhost:80/"])
def test_a_private_module_url_is_refused_unless_allowed(url):
    with pytest.raises(ValidationFailed) as refused:
        check_spec(ModuleSpec("demo", url=url), _settings())
    assert "url" in refused.value.fields
    check_spec(ModuleSpec("demo", url=url), _settings(AGENTQ_MODULE_ALLOW_PRIVATE="1"))


@pytest.mark.parametrize("spec, field", [
    (ModuleSpec("Demo", url="http://8.8.8.8"), "name"),
    (ModuleSpec("math", url="http://8.8.8.8"), "name"),
    (ModuleSpec("demo", kind="ftp", url="http://8.8.8.8"), "kind"),
    (ModuleSpec("demo"), "url"),
    (ModuleSpec("demo", url="ftp://8.8.8.8"), "url"),
    (ModuleSpec("demo", kind="mcp"), "url"),
    (ModuleSpec("demo", url="http://8.8.8.8", secret="whsec_!!not base64"), "secret"),
    (ModuleSpec("demo", url="http://8.8.8.8", secret="plain"), "secret"),
])
def test_a_bad_registration_names_the_field_and_never_echoes_the_secret(spec, field):
    with pytest.raises(ValidationFailed) as refused:
        check_spec(spec, _settings(), taken={"math"})
    assert field in refused.value.fields
    if spec.secret:
        assert spec.secret not in str(refused.value.fields) + refused.value.message
    assert "secret" not in repr(spec) or spec.secret not in repr(spec)


def test_static_modules_from_the_environment():
    settings = _settings(AGENTQ_TOOL_MODULES="weather=http://w:8000, notes=mcp+http://n/mcp",
                         AGENTQ_MODULE_SECRET_WEATHER=SECRET, AGENTQ_SLOW_MODULES="notes")
    weather, notes = settings.tool_modules
    assert (weather.name, weather.kind, weather.url, weather.secret, weather.slow) == (
        "weather", "http", "http://w:8000", SECRET, False)
    assert (notes.kind, notes.url, notes.slow, notes.static) == ("mcp", "http://n/mcp", True,
                                                                 True)
    assert SECRET not in repr(settings.tool_modules)
    with pytest.raises(ConfigError, match="AGENTQ_TOOL_MODULES"):
        _settings(AGENTQ_TOOL_MODULES="Bad Name=http://x")


@pytest.mark.parametrize("manifest, says", [
    ([], "JSON object"),
    (_manifest("other"), "it must be 'demo'"),
    ({"module": "demo", "tools": []}, "non-empty list"),
    (_manifest(parameters={"type": "string"}), "type 'object'"),
    (_manifest(parameters={"type": "object", "properties": 3}), "not a valid JSON Schema"),
    (_manifest(permission="root"), "permission"),
    (_manifest(function="x"), "'function' is not a manifest key"),
    (_manifest(colour="red"), "unknown key"),
    ({"module": "demo", "tools": [{"name": "add", "description": "d",
                                   "parameters": {"type": "object"}}]}, "'demo.<tool>'"),
])
def test_a_bad_manifest_is_refused_saying_what_to_fix(manifest, says):
    with pytest.raises(ManifestError, match=says.replace("(", r"\(")):
        build_module(ModuleSpec("demo", url="http://x"), manifest, lambda *a: _never)


def test_mcp_tool_names_map_into_the_manifest_rules():
    assert tool_name("notes", "add") == "notes.add"
    assert tool_name("notes", "Get-Weather") == "notes.get_weather"
    assert tool_name("notes", "1st") == "notes.t_1st"
    assert len(tool_name("notes", "x" * 80).partition(".")[2]) <= 31


class Fetcher:
    """RemoteModules whose fetch is counted (no network)."""

    def __init__(self, store: Store, spec: ModuleSpec, manifest: dict | None):
        self.count = 0
        self.manifest = manifest
        self.remote = RemoteModules(_settings(), store=store, load_rows=lambda: [spec])
        self.remote.fetch = self.fetch

    def fetch(self, spec):
        self.count += 1
        if self.manifest is None:
            raise ManifestError(spec.name, "GET /manifest failed: ConnectError")
        return self.manifest


def test_the_cache_is_shared_and_an_unhealthy_module_offers_nothing():
    store = Store(None)  # one store, as Redis is for every process
    spec = ModuleSpec("demo", url="http://x")
    first = Fetcher(store, spec, _manifest())
    second = Fetcher(store, spec, _manifest())
    registry = ToolRegistry(_settings(), modules=[], remote=first.remote)
    assert sorted(registry.tools) == ["demo.add"] and first.count == 1
    other = ToolRegistry(_settings(), modules=[], remote=second.remote)
    assert sorted(other.tools) == ["demo.add"] and second.count == 0  # read the cache
    assert registry.queues(slow=False) == ["tools.demo"]

    store.delete("demo:manifest")  # what its hour in Redis ending does
    assert sorted(other.tools) == ["demo.add"] and second.count == 1  # stale: fetched again
    assert sorted(registry.tools) == ["demo.add"] and first.count == 1

    first.remote.mark_unhealthy("demo", "POST /execute: ConnectError")
    assert registry.tools == {} and other.tools == {}
    assert first.remote.known()["demo"].health["status"] == "unhealthy"
    assert registry.all_queues(slow=False) == ["tools.demo"]  # calls already sent still run


def test_a_task_reads_the_module_version_once_and_sees_its_own_changes():
    """Inside one task's run (`one_version_read`) a module another process registers is
    offered from the next task on; a change the task makes itself, at its next look."""
    store = Store(None)
    demo, other = ModuleSpec("demo", url="http://x"), ModuleSpec("other", url="http://y")
    rows = [demo]
    remote = RemoteModules(_settings(AGENTQ_MODULE_SYNC_S="3600"), store=store,
                           load_rows=lambda: list(rows))
    remote.fetch = lambda spec: _manifest(spec.name)
    assert set(remote.known()) == {"demo"}
    with one_version_read():
        assert set(remote.known()) == {"demo"}
        rows.append(other)
        store.incr("version")  # what another process's registration does
        assert set(remote.known()) == {"demo"}
    assert set(remote.known()) == {"demo", "other"}
    with one_version_read():
        assert set(remote.known()) == {"demo", "other"}
        rows.remove(other)
        remote.forget("other")
        assert set(remote.known()) == {"demo"}


def test_a_reading_of_the_modules_table_that_failed_is_tried_again_at_the_next_look():
    """The table could not be read (the pool had no free connection, the database was
    away): the view keeps what it had, and the next look reads the table again rather than
    keep a view without the registered modules until AGENTQ_MODULE_SYNC_S has passed."""
    store = Store(None)
    demo = ModuleSpec("demo", url="http://x")
    answers: list = [TimeoutError("QueuePool limit reached"), [demo]]

    def load_rows():
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    remote = RemoteModules(_settings(AGENTQ_MODULE_SYNC_S="3600"), store=store,
                           load_rows=load_rows)
    remote.fetch = lambda spec: _manifest(spec.name)
    assert remote.known() == {}
    assert set(remote.known()) == {"demo"}
    assert answers == []
    assert set(remote.known()) == {"demo"}  # read: kept until the version or sync says


def test_a_module_that_does_not_answer_is_unhealthy_then_probed_again():
    store = Store(None)
    spec = ModuleSpec("demo", url="http://x")
    fetcher = Fetcher(store, spec, None)
    fetcher.remote.settings = _settings(AGENTQ_MODULE_RETRY_S="0")
    registry = ToolRegistry(fetcher.remote.settings, modules=[], remote=fetcher.remote)
    assert registry.tools == {}
    assert "ConnectError" in fetcher.remote.known()["demo"].health["error"]
    fetcher.manifest = _manifest()
    assert sorted(registry.tools) == ["demo.add"]


def test_a_module_that_is_down_is_probed_by_one_process_once_per_interval():
    """Issue 31: a failed probe deleted the manifest and bumped the version, and a missing
    manifest was fetched at every look, so every process probed a down module again and
    again. Now its failure is cached: the processes read it, and it is probed again once
    AGENTQ_MODULE_RETRY_S has passed, by one of them."""
    store = Store(None)  # one store, as Redis is for every process
    spec = ModuleSpec("demo", url="http://x")
    processes = [Fetcher(store, spec, None) for _ in range(3)]
    for fetcher in processes:
        fetcher.remote.settings = _settings(AGENTQ_MODULE_RETRY_S="3600")
    registries = [ToolRegistry(f.remote.settings, modules=[], remote=f.remote)
                  for f in processes]
    for _ in range(20):  # many looks, each process re-reading (the version moved)
        for registry in registries:
            assert registry.tools == {}
    assert sum(f.count for f in processes) == 1
    assert {f.remote.known()["demo"].health["status"] for f in processes} == {"unhealthy"}

    # the interval has passed: the next look probes, once, whichever process it is
    health = store.get("demo:health")
    store.set("demo:health", {**health, "checked_at": health["checked_at"] - 3600})
    for fetcher in processes:
        fetcher.manifest = _manifest()
    for _ in range(5):
        for registry in registries:
            assert sorted(registry.tools) == ["demo.add"]
    assert sum(f.count for f in processes) == 2


@pytest.fixture(scope="module")
def example_module():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "examples.http_module", "--port", str(port),
                             "--name", "demo", "--secret", SECRET], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    url = proc.stdout.readline().strip()
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


def _ctx() -> ToolContext:
    return ToolContext(tool_use_id="tu_1", job_id="j", user_id="u", conversation_id="c",
                       permission_level="guest", platform="api", tenant_id="t")


def test_calls_to_the_example_module_are_signed_and_errors_are_tool_errors(example_module):
    settings = _settings(AGENTQ_MODULE_ALLOW_PRIVATE="1",
                         AGENTQ_TOOL_MODULES=f"demo={example_module}",
                         AGENTQ_MODULE_SECRET_DEMO=SECRET)
    registry = ToolRegistry(settings, modules=[],
                            remote=RemoteModules(settings, Store(None), lambda: []))
    run = lambda name, args: registry.execute(name, args, _ctx(), ["demo"])  # noqa: E731
    assert run("demo.add", {"a": 1, "b": 2}).result == 3
    echoed = run("demo.echo", {"text": "hi"}).result
    assert echoed["context"]["tool_use_id"] == "tu_1" and echoed["context"]["tenant_id"] == "t"
    assert run("demo.fail", {}).error["code"] == "module_http_error"
    assert run("demo.refuse", {}).error["code"] == "module_error"
    assert run("demo.garble", {}).error["code"] == "module_bad_answer"
    assert run("demo.add", {"a": "x"}).error["code"] == "invalid_arguments"


def test_a_wrong_secret_is_refused_by_the_module(example_module):
    settings = _settings(AGENTQ_MODULE_ALLOW_PRIVATE="1")
    spec = ModuleSpec("demo", url=example_module,
                      secret="whsec_c29tZS1vdGhlci1zZWNyZXQtbm90LXRoZS1tb2R1bGU=")
    with pytest.raises(ManifestError, match="401"):
        RemoteModules(settings, Store(None), lambda: []).fetch(spec)


def test_a_slow_fetch_does_not_hold_up_the_other_threads():
    import threading
    store = Store(None)
    spec = ModuleSpec("demo", url="http://x")
    fetcher = Fetcher(store, spec, _manifest())
    remote = fetcher.remote
    assert set(remote.known()) == {"demo"} and fetcher.count == 1

    entered, release = threading.Event(), threading.Event()

    def slow_fetch(spec):
        entered.set()
        assert release.wait(30)
        return _manifest()
    remote.fetch = slow_fetch
    store.delete("demo:manifest")
    store.bump()
    loader = threading.Thread(target=remote.known)
    loader.start()
    try:
        assert entered.wait(30)
        view = remote.known()  # answered at once, from the last view
        assert view["demo"].module is not None
    finally:
        release.set()
        loader.join(30)
    assert remote.known()["demo"].health["status"] == "ok"


# --- per-module defaults and the MCP server's environment ---------------------------------

@pytest.mark.parametrize("fields, field", [
    ({"permission": "root"}, "permission"),
    ({"requires_approval": "yes"}, "requires_approval"),
    ({"requires_approval": ("Bad Name",)}, "requires_approval"),
    ({"requires_approval": ("other.add",)}, "requires_approval"),
    ({"requires_approval": ()}, "requires_approval"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"timeout_s": True}, "timeout_s"),
    ({"timeout_s": 10 ** 6}, "timeout_s"),
])
def test_bad_module_defaults_name_the_field(fields, field):
    with pytest.raises(ValidationFailed) as refused:
        check_spec(ModuleSpec("demo", url="http://8.8.8.8", **fields), _settings())
    assert list(refused.value.fields) == [field]


def test_defaults_are_an_mcp_tools_own_and_fill_in_an_http_manifest():
    manifest = {"module": "demo", "tools": [
        {"name": "demo.add", "description": "Add.", "parameters": {"type": "object"}},
        {"name": "demo.own", "description": "Own.", "parameters": {"type": "object"},
         "permission": "admin", "requires_approval": False, "time_limit_s": 3}]}
    spec = ModuleSpec("demo", url="http://x", permission="user", requires_approval=True,
                      timeout_s=7)
    add, own = build_module(spec, manifest, lambda *a: _never).tools
    assert (add.permission, add.requires_approval, add.time_limit_s) == ("user", True, 7)
    assert (own.permission, own.requires_approval, own.time_limit_s) == ("admin", False, 3)

    mcp = ModuleSpec("demo", kind="mcp", url="http://x", permission="user",
                     requires_approval=("own",), timeout_s=7)
    add, own = build_module(mcp, manifest, lambda *a: _never).tools
    assert (add.permission, add.requires_approval, add.time_limit_s) == ("user", False, 7)
    assert (own.permission, own.requires_approval, own.time_limit_s) == ("user", True, 7)
    assert mcp.public()["requires_approval"] == ["own"]
    assert mcp.defaults() == {"permission": "user", "requires_approval": ["own"],
                              "timeout_s": 7}


def test_static_module_defaults_from_the_environment():
    settings = _settings(AGENTQ_TOOL_MODULES="notes=mcp+http://n/mcp,w=http://w",
                         AGENTQ_MODULE_PERMISSION_NOTES="admin",
                         AGENTQ_MODULE_APPROVAL_NOTES="add, notes.shout",
                         AGENTQ_MODULE_TIMEOUT_S_NOTES="2.5", AGENTQ_MODULE_APPROVAL_W="all")
    notes, w = settings.tool_modules
    assert (notes.permission, notes.requires_approval, notes.timeout_s) == (
        "admin", ("add", "notes.shout"), 2.5)
    assert (w.permission, w.requires_approval, w.timeout_s) == (None, True, None)
    for var, value in [("PERMISSION", "root"), ("TIMEOUT_S", "soon"), ("TIMEOUT_S", "-1"),
                       ("APPROVAL", "Bad Name")]:
        with pytest.raises(ConfigError, match=f"AGENTQ_MODULE_{var}_NOTES"):
            _settings(AGENTQ_TOOL_MODULES="notes=mcp+http://n/mcp",
                      **{f"AGENTQ_MODULE_{var}_NOTES": value})


def test_a_stdio_mcp_server_gets_an_allow_listed_environment(monkeypatch):
    """The example server reports its own environment: none of agentq's variables nor
    secrets reach it, while PATH and HOME do."""
    from agentq.tools import mcp
    for name, value in [("AGENTQ_DATABASE_URL", "postgresql://u:pw@db/agentq"),
                        ("AGENTQ_WEBHOOK_SECRET", "whsec_" + "A" * 32),
                        ("OPENAI_API_KEY", "sk-not-for-the-server"),
                        ("DATABASE_URL", "postgresql://u:pw@db/x"),
                        ("AGENTQ_MODULE_SECRET_NOTES", SECRET), ("LC_ALL", "C.UTF-8")]:
        monkeypatch.setenv(name, value)
    assert set(mcp.child_env()) <= set(mcp.CHILD_ENV) | {"LC_ALL"}
    settings = _settings()
    spec = ModuleSpec("envtest", kind="mcp", command=(sys.executable, "-m",
                                                      "examples.mcp_server"))
    monkeypatch.chdir(ROOT)
    try:
        names = mcp.call(spec, "environ", {}, 30, settings)["names"]
    finally:
        s = mcp.sessions()
        s.run(s.drop(spec), 5)
    assert "PATH" in names and "LC_ALL" in names
    leaked = [n for n in names if n.startswith(("AGENTQ_", "OPENAI_", "DATABASE"))
              or "SECRET" in n or "KEY" in n or "TOKEN" in n or "PASSWORD" in n]
    assert leaked == []


def test_an_mcp_call_past_its_time_limit_is_a_timeout(monkeypatch):
    from agentq.errors import ToolTimeout
    from agentq.tools import mcp
    monkeypatch.chdir(ROOT)
    spec = ModuleSpec("sleepy", kind="mcp", command=(sys.executable, "-m",
                                                     "examples.mcp_server"))
    try:
        assert mcp.call(spec, "sleep", {"seconds": 0}, 30, _settings()) == {"result": "slept 0 s"}
        with pytest.raises(ToolTimeout):
            mcp.call(spec, "sleep", {"seconds": 60}, 1, _settings())
    finally:
        s = mcp.sessions()
        s.run(s.drop(spec), 5)


def test_a_forked_pool_process_does_not_inherit_a_registry_held_mid_re_read():
    """Seen in the fault suite (Redis killed with a code call in flight): the tools-slow
    worker's parent re-reads the modules in a thread, holding the registry's locks while
    Redis is away; the pool process forked then to replace a cancelled one hung at its
    first tool call until the hard time limit. A child builds its own registry."""
    import os
    import signal
    import threading

    from agentq.tools import registry as registry_module
    settings = Settings.from_env({"AGENTQ_MODULE_SYNC_S": "3600"})
    parent = registry_module.get_registry(settings)
    held, release = threading.Event(), threading.Event()

    def re_reading() -> None:  # a parent thread mid-way, both locks held
        with registry_module._registry_lock, parent.remote._loaded:
            held.set()
            release.wait()

    thread = threading.Thread(target=re_reading, daemon=True)
    thread.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: its first look at the tools must not wait for the parent
        signal.alarm(120)  # a child that hangs dies (SIGALRM) rather than wedge the suite
        try:
            child = registry_module.get_registry(settings)
            ok = child is not parent and "math.evaluate" in child.tools
        finally:
            os._exit(0 if ok else 1)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_database_that_is_away_is_logged_once_naming_its_host_and_port(caplog):
    """A wrong AGENTQ_DATABASE_URL in a served stack: every look at the modules (each
    request, each step) failed to read them and logged it, ~12 lines a second naming
    neither host nor port. Now one line in RemoteModules.UNREAD_LOG_S (30 s), with both."""
    import logging
    port = free_port()  # nothing listens there
    settings = _settings(AGENTQ_DATABASE_URL=f"postgresql://agentq:pw@127.0.0.1:{port}/agentq",
                         AGENTQ_DEFAULT_MODULES="math")
    modules = RemoteModules(settings, Store(None))
    with caplog.at_level(logging.WARNING, logger="agentq.tools.remote"):
        for _ in range(20):
            modules.known()
    lines = [r.getMessage() for r in caplog.records if "tool modules not read" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"127.0.0.1:{port}" in lines[0] and ":pw@" not in lines[0]


def test_a_tenants_module_is_offered_to_and_run_for_its_tenant_only():
    """Modules per tenant (API.md 1.2): another tenant's module is dropped from what a
    persona enables and is `tool_not_found` when called, whatever the persona names; a
    global one is everyone's (the stack's test: tests/security/test_tenant_edges.py)."""
    store = Store(None)
    owned = ModuleSpec("owned", url="http://x", tenant_id="tenant-b")
    shared = ModuleSpec("shared", url="http://y")
    remote = RemoteModules(_settings(), store=store, load_rows=lambda: [owned, shared])
    remote.fetch = lambda spec: _manifest(spec.name)
    registry = ToolRegistry(_settings(), modules=[], remote=remote)
    assert sorted(registry.tools) == ["owned.add", "shared.add"]
    assert registry.allowed_modules(["owned", "shared"], "tenant-a") == ("shared",)
    assert registry.allowed_modules(["owned", "shared"], "tenant-b") == ("owned", "shared")
    assert set(registry.modules_for("tenant-a")) == {"shared"}
    ctx = ToolContext(tool_use_id="tu_1", job_id="j", user_id="u", conversation_id="c",
                      permission_level="guest", platform="api", tenant_id="tenant-a")
    result = registry.execute("owned.add", {"a": 1, "b": 2}, ctx, ["owned", "shared"])
    assert result.error["code"] == "tool_not_found"
    assert ModuleSpec("g", url="http://z").public()["global"] is True
    assert owned.public()["tenant_id"] == "tenant-b" and not owned.visible_to("tenant-a")
