"""A job's `response` (API.md 1.2, "Responses say what was done"): its answer, the files its
tools made, and what each tool call did. Pure: `agentq.loop.lifecycle` writes it when a
job ends."""
from __future__ import annotations

import json
from typing import Any, Protocol, Sequence


class ShownCall(Protocol):
    """What the response reads of a tool call: a row of the job's calls (the columns
    `lifecycle` selects) or a `ToolCall`."""
    @property
    def name(self) -> str: ...
    @property
    def tool_use_id(self) -> str: ...
    @property
    def arguments(self) -> Any: ...
    @property
    def result(self) -> dict[str, Any] | None: ...
    @property
    def status(self) -> str: ...


SHOWN_BYTES = 2048
"""A tool call's `arguments` and `result` in a job's response are cut at this many bytes
of their JSON (API.md 1.2, "Responses say what was done"); the events keep them whole."""


def response_object(content: str, error: dict[str, Any] | None,
                    calls: Sequence[ShownCall]) -> dict[str, Any]:
    """A job's `response`: its answer, the files its tools made, and what each call did:
    its name, arguments, result (or error), status and success."""
    ok_results = [(c.result or {}).get("result") for c in calls if tool_succeeded(c)]
    return {"content": content, "files": extract_files(ok_results), "error": error,
            "metadata": {"tool_calls": [_call_shown(c) for c in calls]}}


def _call_shown(call: ShownCall) -> dict[str, Any]:
    """One call as the response lists it: `arguments` and `result` as sent and returned,
    each cut at SHOWN_BYTES of JSON (then a string, and `truncated: true`)."""
    record = call.result or {}
    arguments, cut_arguments = _cut(call.arguments)
    result, cut_result = _cut(record.get("result"))
    return {"name": call.name, "tool_use_id": call.tool_use_id,
            "status": call.status, "success": tool_succeeded(call),
            "arguments": arguments, "result": result, "error": record.get("error"),
            "truncated": cut_arguments or cut_result}


def _cut(value: Any) -> tuple[Any, bool]:
    """`value` whole when it takes at most SHOWN_BYTES (UTF-8; an object or a list: its
    JSON), else its first SHOWN_BYTES as a string (never half a character), and True."""
    if value is None or isinstance(value, (bool, int, float)):
        return value, False
    encoded = (value if isinstance(value, str)
               else json.dumps(value, ensure_ascii=False, default=str)).encode()
    if len(encoded) <= SHOWN_BYTES:
        return value, False
    return encoded[:SHOWN_BYTES].decode("utf-8", "ignore"), True


def tool_succeeded(call: ShownCall) -> bool:
    """A tool result is stored as `{"ok", "result", "error"}` (`ToolResult.to_record`)."""
    return bool(call.result and call.result.get("ok"))


def extract_files(results: list[Any]) -> list[dict[str, str]]:
    """File URLs in tool results (seed 000): a top-level `url`, or a `files` list."""
    files: list[dict[str, str]] = []
    seen: set[str] = set()

    def add(entry: dict[str, Any]) -> None:
        url = entry.get("url")
        if isinstance(url, str) and url and url not in seen:
            seen.add(url)
            files.append({"filename": str(entry.get("filename") or "file"), "url": url})

    for result in results:
        if not isinstance(result, dict):
            continue
        add(result)
        for entry in result.get("files") or []:
            if isinstance(entry, dict):
                add(entry)
    return files
