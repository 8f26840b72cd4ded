"""What the router gives the loop and takes from it: plain values, no SDK types."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

StopReason = Literal["end_turn", "tool_use", "max_tokens"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as offered to the model, under our name (`math.evaluate`)."""
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCallRequest:
    """One tool call the model asked for, mapped back to our tool name.

    `arguments` is None when the model sent arguments that are not a JSON object; then
    `arguments_error` says why, and the call goes back to the model as a tool error.
    """
    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str = ""
    arguments_error: str | None = None


@dataclass(frozen=True)
class LLMReply:
    content: str
    tool_calls: tuple[ToolCallRequest, ...]
    stop_reason: StopReason
    model: str
    input_tokens: int
    output_tokens: int
    usage_estimated: bool = False
    attempts: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """Failed attempts before this reply: [{"model", "error", "status"}]."""

    def to_record(self) -> dict[str, Any]:
        """A JSON-able copy, stored so a recorded replay can answer from it."""
        return {
            "content": self.content,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments,
                 "raw_arguments": c.raw_arguments, "arguments_error": c.arguments_error}
                for c in self.tool_calls
            ],
            "stop_reason": self.stop_reason,
            "model": self.model,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "usage_estimated": self.usage_estimated,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "LLMReply":
        return cls(
            content=record.get("content") or "",
            tool_calls=tuple(ToolCallRequest(**c) for c in record.get("tool_calls") or ()),
            stop_reason=record.get("stop_reason") or "end_turn",
            model=record.get("model") or "",
            input_tokens=int(record.get("input_tokens") or 0),
            output_tokens=int(record.get("output_tokens") or 0),
            usage_estimated=bool(record.get("usage_estimated")),
        )
