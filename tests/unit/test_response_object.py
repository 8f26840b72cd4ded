"""A job's `response` lists what each tool call did (API.md 1.2, "Responses say what was
done"): arguments and result whole up to 2 KB, else their first 2 KB as a string and
`truncated: true`; never half a UTF-8 character."""
from __future__ import annotations

import json
from types import SimpleNamespace

from agentq.loop.response import SHOWN_BYTES, response_object


def _call(arguments, result, status="succeeded", ok=True, error=None):
    return SimpleNamespace(name="t.x", tool_use_id="tool_1", status=status,
                           arguments=arguments,
                           result={"ok": ok, "result": result, "error": error})


def test_small_arguments_and_results_are_shown_whole():
    [shown] = response_object("done", None, [_call({"a": 1}, {"b": [1, 2]})])[
        "metadata"]["tool_calls"]
    assert shown == {"name": "t.x", "tool_use_id": "tool_1", "status": "succeeded",
                     "success": True, "arguments": {"a": 1}, "result": {"b": [1, 2]},
                     "error": None, "truncated": False}


def test_what_passes_2_kb_is_cut_to_it_as_a_string_on_a_character():
    big = {"text": "é" * 3000}  # two bytes a character
    text = "ü" * 1500  # 3,000 bytes
    [shown] = response_object("", None, [_call(big, text)])["metadata"]["tool_calls"]
    assert shown["truncated"] is True
    assert isinstance(shown["arguments"], str) and isinstance(shown["result"], str)
    for cut, whole in ((shown["arguments"], json.dumps(big, ensure_ascii=False)),
                       (shown["result"], text)):
        assert len(cut.encode()) <= SHOWN_BYTES and whole.startswith(cut)
        assert len(cut.encode()) >= SHOWN_BYTES - 3


def test_a_failed_call_shows_its_error_and_no_result():
    error = {"code": "tool_error", "message": "boom"}
    [shown] = response_object("", None, [_call({}, None, "failed", False, error)])[
        "metadata"]["tool_calls"]
    assert (shown["status"], shown["success"], shown["result"], shown["error"],
            shown["truncated"]) == ("failed", False, None, error, False)
