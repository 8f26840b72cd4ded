"""A tool call's result: the one shape every writer of a call's result builds it in.

Stored on the call's row (`tool_calls.result`) and read by the model as
`{"ok", "result", "error": {"code", "message", ...}}`. A tool's failure is data for the
model, not an exception (STYLE.md), so each way a call can end has its constructor here:

    ToolResult.success(value)              the tool answered
    ToolResult.failure(exc)                the tool raised (a ToolError keeps its code)
    ToolResult.failed(code, message, ...)  it did not run to an answer: cancelled, denied,
                                           timed out waiting for a person, lost, crashed

and `to_record()` is what is stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentq.errors import ToolError


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None
    attempts: int = 1

    def to_record(self) -> dict[str, Any]:
        return {"ok": self.ok, "result": self.result, "error": self.error}

    @classmethod
    def success(cls, result: Any, attempts: int = 1) -> ToolResult:
        return cls(ok=True, result=result, attempts=attempts)

    @classmethod
    def failure(cls, exc: BaseException, attempts: int = 1) -> ToolResult:
        if isinstance(exc, ToolError):
            error = {"code": exc.code, "message": exc.message}
        else:
            error = {"code": "tool_error", "message": f"{type(exc).__name__}: {exc}"}
        return cls(ok=False, error=error, attempts=attempts)

    @classmethod
    def failed(cls, code: str, message: str, **details: Any) -> ToolResult:
        """The call ended without the tool's answer, for a reason of ours (`code`); the
        model reads `message` and `details`."""
        return cls(ok=False, error={"code": code, "message": message, **details})
