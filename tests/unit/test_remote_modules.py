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
from agentq.tools.remote import (ModuleSpec, RemoteModules, Store, build_module, check_spec,
                                 parse_static)
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
