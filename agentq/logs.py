"""Structured logs: one JSON object a line, with the record's `extra` fields and the bound
context (task id, job id). Secrets never go in: keys and message texts are not logged."""
from __future__ import annotations

import contextvars
import json
import logging
import sys
from typing import Any

_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("log_context",
                                                                           default={})
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message",
                                                                          "asctime"}


def bind(**fields: Any) -> contextvars.Token:
    """Add fields to every log line of this context (a task run, a request)."""
    return _context.set({**_context.get(), **fields})


def unbind(token: contextvars.Token) -> None:
    _context.reset(token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
                               "level": record.levelname, "logger": record.name,
                               "msg": record.getMessage(), **_context.get()}
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "INFO") -> None:
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        root.setLevel(level)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpx2", "openai", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
