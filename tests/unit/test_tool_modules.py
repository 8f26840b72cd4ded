"""The math, time and code tool modules: manifests load, and the tools work through their
functions with a ToolContext."""
from __future__ import annotations

import importlib
import time
from datetime import datetime, timedelta

import pytest

from agentq.errors import ToolError
from agentq.tools.manifest import ToolContext, ToolModule
from agentq.tools.safe_math import MathError


def _module(name: str) -> ToolModule:
    return importlib.import_module(f"tool_workers.{name}").MODULE


def _ctx(**overrides) -> ToolContext:
    fields = dict(tool_use_id="tu_1", job_id="job_1", user_id="user_1",
                  conversation_id="conv_1", permission_level="user")
    fields.update(overrides)
    return ToolContext(**fields)


def _tool(module: str, name: str):
    return next(t for t in _module(module).tools if t.name == name)


@pytest.mark.parametrize("module, tool, permission, slow", [
    ("math", "math.evaluate", "guest", False),
    ("time", "time.now", "guest", False),
    ("code", "code.run_python", "user", True),
])
def test_manifests_load(module, tool, permission, slow):
    loaded = _module(module)
    assert isinstance(loaded, ToolModule)
    assert loaded.name == module
    assert loaded.slow is slow
    assert [t.name for t in loaded.tools] == [tool]
    assert loaded.tools[0].permission == permission
    assert loaded.tools[0].time_limit_s > 0


@pytest.mark.parametrize("tool, good, bad", [
    ("math.evaluate", {"expression": "1+1"},
     [{}, {"expression": ""}, {"expression": "1" * 1001}, {"expression": 1},
      {"expression": "1", "extra": 1}]),
    ("time.now", {"timezone": "Europe/Berlin"},
     [{"timezone": ""}, {"timezone": 5}, {"zone": "UTC"}]),
    ("code.run_python", {"code": "print(1)", "timeout_s": 5},
     [{}, {"code": "x" * 20001}, {"code": "1", "timeout_s": 0.5},
      {"code": "1", "timeout_s": 61}, {"code": "1", "timeout_s": "5"}]),
])
def test_parameter_schemas(tool, good, bad):
    validator = _tool(tool.partition(".")[0], tool).validator()
    assert list(validator.iter_errors(good)) == []
    for arguments in bad:
        assert list(validator.iter_errors(arguments)), arguments


def test_math_evaluate():
    fn = _tool("math", "math.evaluate").function
    assert fn({"expression": "2 * (3 + 4)"}, _ctx()) == {"expression": "2 * (3 + 4)",
                                                         "result": 14}
    with pytest.raises(MathError, match="name 'x' is not allowed") as info:
        fn({"expression": "x + 1"}, _ctx())
    assert info.value.retryable is False


def test_time_now_defaults_to_utc():
    before = time.time()
    result = _tool("time", "time.now").function({}, _ctx())
    after = time.time()
    assert result["timezone"] == "UTC"
    stamp = datetime.fromisoformat(result["iso"])
    assert stamp.utcoffset() == timedelta(0)
    assert before <= result["unix"] <= after
    assert abs(stamp.timestamp() - result["unix"]) < 1e-3
    assert result["weekday"] == stamp.strftime("%A")


def test_time_now_in_a_zone():
    result = _tool("time", "time.now").function({"timezone": "Asia/Kolkata"}, _ctx())
    stamp = datetime.fromisoformat(result["iso"])
    assert stamp.utcoffset() == timedelta(hours=5, minutes=30)
    assert result["timezone"] == "Asia/Kolkata"
    assert result["weekday"] in ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
                                 "Saturday", "Sunday")


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "Europe", "../../etc/passwd",
                                  "/etc/localtime", ""])
def test_time_now_with_a_bad_zone(zone):
    with pytest.raises(ToolError) as info:
        _tool("time", "time.now").function({"timezone": zone}, _ctx())
    assert info.value.retryable is False
    assert info.value.code == "unknown_timezone"
    assert repr(zone) in info.value.message


def test_time_package_does_not_shadow_stdlib_time():
    importlib.import_module("tool_workers.time")
    import time as stdlib_time
    assert stdlib_time.__name__ == "time" and callable(stdlib_time.monotonic)


def test_code_run_python_uses_the_scratch_dir(scratch_dir):
    fn = _tool("code", "code.run_python").function
    result = fn({"code": "open('out.txt', 'w').write('42'); print('done')", "timeout_s": 5},
                _ctx(scratch_dir=str(scratch_dir)))
    assert result["stdout"] == "done\n"
    assert result["exit_code"] == 0 and result["timed_out"] is False
    assert (scratch_dir / "out.txt").read_text() == "42"


def test_code_run_python_reports_errors_as_results():
    result = _tool("code", "code.run_python").function({"code": "1 / 0"}, _ctx())
    assert result["exit_code"] == 1
    assert "ZeroDivisionError" in result["stderr"]
