"""Structured logs: one JSON object a line, with the record's `extra` fields and the bound
context (task id, job id). Secrets never go in: keys and message texts are not logged."""
from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agentq import tracing

_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "log_context", default=MappingProxyType({}))
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message",
                                                                          "asctime"}


def bind(**fields: Any) -> contextvars.Token:
    """Add fields to every log line of this context (a task run, a request)."""
    return _context.set({**_context.get(), **fields})


def unbind(token: contextvars.Token) -> None:
    _context.reset(token)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""Terminal colour and cursor codes (werkzeug colours its request lines): never in a log."""


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
                               "level": record.levelname, "logger": record.name,
                               "msg": strip_ansi(record.getMessage()), **_context.get(),
                               **tracing.current_ids()}
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class PlainFormatter(logging.Formatter):
    """A log record as a person reads it on a terminal: its message alone, one line; colour
    codes kept only when the stream is a terminal."""

    def __init__(self, stream):
        super().__init__("%(message)s")
        self.stream = stream

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        tty = getattr(self.stream, "isatty", lambda: False)()
        return text if tty else strip_ansi(text)


def configure(level: str = "INFO", *, path: Path | None = None,
              to_stderr: bool = True) -> None:
    """JSON lines on stderr (the Procfile's processes), and/or appended to `path` (the
    commands a person runs: `agentq run`, `agentq dev`, ...; stderr then only with -v).
    Python warnings go the same way. Configured once per process."""
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        _set_levels(level)
        return
    handlers: list[logging.Handler] = []
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, encoding="utf-8"))
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    if not handlers:
        handlers.append(logging.NullHandler())
    for handler in handlers:
        handler.setFormatter(JsonFormatter())
    root.handlers[:] = handlers
    _set_levels(level)
    logging.captureWarnings(True)


def _set_levels(level: str) -> None:
    root = logging.getLogger()
    root.setLevel(level)
    for name in NOISY:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    for name in PER_TASK:
        logging.getLogger(name).setLevel(
            logging.DEBUG if root.level <= logging.DEBUG else max(logging.WARNING, root.level))


NOISY = ("httpx", "httpx2", "openai", "urllib3")
"""Loggers heard only from WARNING up, at any level (at DEBUG the SDK's would write whole
requests)."""
PER_TASK = ("celery.worker.strategy", "celery.app.trace")
"""Celery's line for every task received and every task succeeded, heard only at DEBUG (else
from WARNING up). They carry the arguments' and the return value's repr: six lines per
one-tool job, 4-5% of the orchestrator's and the tool worker's CPU (py-spy, the sixth pass
in docs/benchmarks.md), saying what our own lines say (the step's and the job's, with the
task id bound). A task's failure is still logged (ERROR); a retry, which Celery tells at
INFO, is told by our task base at WARNING (tasks/base.py)."""


def show_on_terminal(logger_name: str, level: int = logging.INFO) -> None:
    """Also print `logger_name`'s records on stderr as plain lines (werkzeug's request lines
    under `agentq dev`), besides the JSON log."""
    logger = logging.getLogger(logger_name)
    if any(isinstance(h.formatter, PlainFormatter) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PlainFormatter(sys.stderr))
    handler.setLevel(level)
    logger.addHandler(handler)
    logger.setLevel(min(level, logger.getEffectiveLevel()))
