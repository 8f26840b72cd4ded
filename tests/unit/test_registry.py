"""The tool registry and the manifests it reads: discovery, permissions, validation and
execution with a timeout and one retry."""
from __future__ import annotations

import threading

import pytest

from agentq.config import Settings
from agentq.errors import (
    ManifestError,
    ToolArgumentsInvalid,
    ToolError,
    ToolNotFound,
    ToolNotPermitted,
)
from agentq.tools.manifest import ToolContext, define_module
from agentq.tools.registry import ToolRegistry, discover

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}},
          "required": ["n"], "additionalProperties": False}


@pytest.fixture
def settings(tmp_path):
    return Settings.from_env({"AGENTQ_HOME": str(tmp_path)})


@pytest.fixture(scope="module")
def shipped():
    return discover()


def _ctx(level: str = "user") -> ToolContext:
    return ToolContext(tool_use_id="tool_1", job_id="job_1", user_id="user_1",
                       conversation_id="conv_1", permission_level=level)


def _module(function, *, name: str = "probe", time_limit_s: float | None = None,
            slow: bool = False):
    tool = {"name": f"{name}.run", "description": "A test tool.", "parameters": SCHEMA,
            "function": function}
    if time_limit_s is not None:
        tool["time_limit_s"] = time_limit_s
    return define_module({"module": name, "description": "test", "tools": [tool],
                          "slow": slow})


def _tool(name="demo.run", **overrides):
    spec = {"name": name, "description": "d", "parameters": {"type": "object"},
            "function": lambda args, ctx: None}
    spec.update(overrides)
    return spec


# --- discovery and where tools run ------------------------------------------------------

def test_discover_loads_the_shipped_modules(shipped):
    # given / when
    names = {m.name for m in shipped}
    # then
    assert {"math", "time", "files", "code"} <= names
    registry_tools = {t.name for m in shipped for t in m.tools}
    assert {"math.evaluate", "time.now", "files.create_document", "files.read_document",
            "code.run_python"} <= registry_tools


def test_slow_modules_run_on_their_own_queues(settings, shipped):
    # given the default settings (slow_modules = code)
    registry = ToolRegistry(settings, shipped)
    # when / then
    assert settings.slow_modules == ("code",)
    assert registry.queue_for("math.evaluate") == "tools.math"
    assert registry.queue_for("files.create_document") == "tools.files"
    assert registry.queue_for("code.run_python") == "tools.slow.code"
    assert registry.time_limit_for("math.evaluate") == 5


def test_slow_modules_come_from_the_settings(tmp_path, shipped):
    # given settings that make math slow
    settings = Settings.from_env({"AGENTQ_HOME": str(tmp_path), "AGENTQ_SLOW_MODULES": "math"})
    registry = ToolRegistry(settings, [*shipped, _module(lambda a, c: 1)])
    # when / then
    assert registry.queue_for("math.evaluate") == "tools.slow.math"
    assert registry.queue_for("probe.run") == "tools.probe"
    assert registry.time_limit_for("probe.run") == settings.tool_time_limit_s


def test_a_module_declared_slow_uses_the_slow_queue_and_limit(settings):
    # given
    registry = ToolRegistry(settings, [_module(lambda a, c: 1, name="heavy", slow=True)])
    # when / then
    assert registry.queue_for("heavy.run") == "tools.slow.heavy"
    assert registry.time_limit_for("heavy.run") == settings.slow_tool_time_limit_s


# --- who is offered what -----------------------------------------------------------------

def test_a_guest_is_not_offered_code_but_a_user_is(settings, shipped):
    # given every module allowed
    registry = ToolRegistry(settings, shipped)
    allowed = registry.allowed_modules(None)
    # when
    guest = [t.name for t in registry.offered("guest", allowed)]
    user = [t.name for t in registry.offered("user", allowed)]
    # then
    assert "code.run_python" not in guest
    assert "math.evaluate" in guest
    assert "code.run_python" in user
    assert guest == sorted(guest)


def test_an_unknown_level_is_offered_nothing_above_guest(settings, shipped):
    # given / when
    offered = ToolRegistry(settings, shipped).offered("stranger", ("math", "code"))
    # then
    assert offered == []


def test_persona_modules_intersect_with_the_permission(settings, shipped):
    # given a persona allowing math and code
    registry = ToolRegistry(settings, shipped)
    allowed = registry.allowed_modules(["math", "code"])
    # when
    guest = {t.name for t in registry.offered("guest", allowed)}
    admin = {t.name for t in registry.offered("admin", allowed)}
    # then
    assert guest == {"math.evaluate"}
    assert admin == {"math.evaluate", "code.run_python"}
    assert registry.offered("owner", registry.allowed_modules([])) == []


def test_specs_describe_the_offered_tools(settings, shipped):
    # given
    registry = ToolRegistry(settings, shipped)
    # when
    (spec,) = registry.specs(registry.offered("guest", ["math"]))
    # then
    assert spec.name == "math.evaluate"
    assert spec.parameters["required"] == ["expression"]


def test_check_names_unknown_and_forbidden_tools(settings, shipped):
    # given
    registry = ToolRegistry(settings, shipped)
    # when / then
    with pytest.raises(ToolNotFound, match="web.search"):
        registry.check("web.search", "owner", ["math"])
    with pytest.raises(ToolNotPermitted, match="'user'"):
        registry.check("code.run_python", "guest", ["code"])
    with pytest.raises(ToolNotPermitted, match="module math"):
        registry.check("math.evaluate", "owner", ["time"])
    assert registry.check("code.run_python", "user", ["code"]).name == "code.run_python"


@pytest.mark.parametrize("arguments, field", [
    ({"expression": 1}, "expression"),
    ({}, "expression"),
    ({"expression": "1", "extra": True}, "extra"),
])
def test_validate_names_the_bad_field(settings, shipped, arguments, field):
    # given
    registry = ToolRegistry(settings, shipped)
    tool = registry.tools["math.evaluate"]
    # when
    with pytest.raises(ToolArgumentsInvalid) as info:
        registry.validate(tool, arguments)
    # then
    assert field in info.value.message
    assert info.value.code == "invalid_arguments"


def test_validate_rejects_arguments_that_are_not_an_object(settings, shipped):
    # given / when / then
    registry = ToolRegistry(settings, shipped)
    with pytest.raises(ToolArgumentsInvalid, match="JSON object"):
        registry.validate(registry.tools["math.evaluate"], ["1+1"])


# --- execute ------------------------------------------------------------------------------

def test_execute_returns_the_value_of_a_working_tool(settings, shipped):
    # given / when
    result = ToolRegistry(settings, shipped).execute(
        "math.evaluate", {"expression": "6*7"}, _ctx("guest"), ["math"])
    # then
    assert result.ok is True
    assert result.result == {"expression": "6*7", "result": 42}
    assert result.attempts == 1


def test_execute_retries_a_failing_tool_once(settings):
    # given a tool that always fails with an ordinary exception
    invocations = []

    def flaky(args, ctx):
        invocations.append(args["n"])
        raise RuntimeError("backend down")

    registry = ToolRegistry(settings, [_module(flaky)])
    # when
    result = registry.execute("probe.run", {"n": 1}, _ctx(), ["probe"])
    # then
    assert invocations == [1, 1]
    assert result.ok is False
    assert result.attempts == 2
    assert result.error == {"code": "tool_error", "message": "RuntimeError: backend down"}


def test_execute_succeeds_when_the_retry_does(settings):
    # given a tool that fails the first time only
    invocations = []

    def once_flaky(args, ctx):
        invocations.append(1)
        if len(invocations) == 1:
            raise ConnectionError("blip")
        return {"n": args["n"]}

    registry = ToolRegistry(settings, [_module(once_flaky)])
    # when
    result = registry.execute("probe.run", {"n": 3}, _ctx(), ["probe"])
    # then
    assert len(invocations) == 2
    assert (result.ok, result.result, result.attempts) == (True, {"n": 3}, 2)


def test_execute_does_not_retry_a_non_retryable_tool_error(settings):
    # given a tool that raises a non-retryable ToolError
    class Refused(ToolError):
        code = "refused"
        retryable = False

    invocations = []

    def refuses(args, ctx):
        invocations.append(1)
        raise Refused("will not do that")

    registry = ToolRegistry(settings, [_module(refuses)])
    # when
    result = registry.execute("probe.run", {"n": 1}, _ctx(), ["probe"])
    # then
    assert len(invocations) == 1
    assert result.error == {"code": "refused", "message": "will not do that"}
    assert result.attempts == 1


def test_execute_answers_bad_arguments_without_running_the_tool(settings):
    # given
    invocations = []
    registry = ToolRegistry(settings, [_module(lambda a, c: invocations.append(1))])
    # when
    result = registry.execute("probe.run", {"n": "three"}, _ctx(), ["probe"])
    # then
    assert invocations == []
    assert result.error["code"] == "invalid_arguments"
    assert "n" in result.error["message"]


def test_execute_answers_a_forbidden_tool_without_running_it(settings, shipped):
    # given / when
    result = ToolRegistry(settings, shipped).execute(
        "code.run_python", {"code": "print(1)"}, _ctx("guest"), ["code"])
    # then
    assert result.ok is False
    assert result.error["code"] == "tool_not_permitted"


def test_execute_turns_a_timeout_into_a_tool_timeout_result(settings):
    # given a tool that blocks well past its tiny time limit
    release = threading.Event()
    started = []

    def stuck(args, ctx):
        started.append(1)
        release.wait(5)
        return {"late": True}

    registry = ToolRegistry(settings, [_module(stuck, time_limit_s=0.05)])
    try:
        # when
        result = registry.execute("probe.run", {"n": 1}, _ctx(), ["probe"])
    finally:
        release.set()
    # then
    assert result.ok is False
    assert result.error["code"] == "tool_timeout"
    assert "0.05" in result.error["message"]
    assert len(started) == 2  # a timeout is retried once


def test_execute_rejects_a_value_that_is_not_json(settings):
    # given a tool returning an object JSON cannot hold
    registry = ToolRegistry(settings, [_module(lambda a, c: {"when": object()})])
    # when
    result = registry.execute("probe.run", {"n": 1}, _ctx(), ["probe"])
    # then
    assert result.ok is False
    assert "not JSON" in result.error["message"]


# --- define_module ------------------------------------------------------------------------

def test_define_module_builds_a_module():
    # given / when
    module = define_module({"module": "demo", "description": " Demo ",
                            "tools": [_tool(time_limit_s=3)]})
    # then
    assert module.name == "demo"
    (tool,) = module.tools
    assert (tool.name, tool.module, tool.permission, tool.time_limit_s) == (
        "demo.run", "demo", "guest", 3.0)


@pytest.mark.parametrize("manifest, problem", [
    ({"module": "demo", "tools": [_tool()], "colour": "red"}, "unknown key(s) ['colour']"),
    ({"module": "demo", "tools": [_tool(colour="red")]}, "tools[0]: unknown key(s) ['colour']"),
    ({"module": "demo", "tools": [_tool(), _tool()]}, "duplicate tool name 'demo.run'"),
    ({"module": "demo", "tools": [_tool("other.run")]}, "name 'other.run' must be 'demo.<tool>'"),
    ({"module": "demo", "tools": [_tool("demo.Run")]}, "name 'demo.Run' must be"),
    ({"module": "demo", "tools": [_tool("demo")]}, "name 'demo' must be"),
    ({"module": "Demo", "tools": [_tool("Demo.run")]}, "'module' must match"),
    ({"module": "demo", "tools": [_tool(parameters={"type": "object",
                                                    "properties": {"x": {"type": "nope"}}})]},
     "demo.run: parameters is not a valid JSON Schema"),
    ({"module": "demo", "tools": [_tool(parameters={"type": "string"})]},
     "parameters must be a JSON Schema with type 'object'"),
    ({"module": "demo", "tools": [_tool(permission="superuser")]},
     "permission 'superuser' is not one of"),
    ({"module": "demo", "tools": []}, "'tools' must be a non-empty list"),
    ({"module": "demo", "tools": [_tool(function="not callable")]}, "function must be callable"),
    ({"module": "demo", "tools": [_tool(time_limit_s=0)]}, "time_limit_s must be a positive"),
    ({"module": "demo", "tools": [{"name": "demo.run"}]}, "missing ['description',"),
])
def test_define_module_rejects_a_bad_manifest_naming_the_problem(manifest, problem):
    # given a manifest with one mistake / when
    with pytest.raises(ManifestError) as info:
        define_module(manifest)
    # then
    assert problem in str(info.value)


@pytest.mark.parametrize("module, name", [("demo", "demo.run\n"), ("demo\n", "demo\n.run")])
def test_define_module_rejects_a_name_with_a_trailing_newline(module, name):
    # given / when / then
    with pytest.raises(ManifestError):
        define_module({"module": module, "tools": [_tool(name)]})
