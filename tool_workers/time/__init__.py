"""Tool module `time`: the current date and time in a time zone.

This package is `tool_workers.time`; it never imports the standard library's `time` by a
relative name, and uses `datetime` and `zoneinfo` only (absolute imports).
"""
from __future__ import annotations

from datetime import datetime, tzinfo
from datetime import timezone as dt_timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agentq.errors import ToolError
from agentq.tools.manifest import ToolContext, define_module

DEFAULT_TIMEZONE = "UTC"
MAX_TIMEZONE_CHARS = 64
TIME_LIMIT_S = 5
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


class UnknownTimezone(ToolError):
    code = "unknown_timezone"
    retryable = False

    def __init__(self, name: str):
        super().__init__(f"unknown time zone {name!r}; use an IANA name such as "
                         "'UTC', 'Europe/Berlin' or 'America/New_York'", timezone=name)
        self.timezone = name


def _zone(name: str) -> tzinfo:
    if name == "UTC":
        return dt_timezone.utc  # needs no time zone database
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError: not a valid key (absolute path, '..'); OSError: e.g. a directory.
        raise UnknownTimezone(name) from None


def now(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    name = args.get("timezone", DEFAULT_TIMEZONE)
    if not isinstance(name, str) or len(name) > MAX_TIMEZONE_CHARS:
        raise UnknownTimezone(str(name)[:MAX_TIMEZONE_CHARS])
    current = datetime.now(_zone(name))
    return {
        "iso": current.isoformat(),
        "timezone": name,
        "unix": current.timestamp(),
        "weekday": WEEKDAYS[current.weekday()],  # not strftime: locale-independent
    }


MODULE = define_module({
    "module": "time",
    "description": "The current date and time.",
    "local": True,  # reads the clock only: may run in the step (AGENTQ_LOCAL_MODULES)
    "tools": [
        {
            "name": "time.now",
            "description": ("The current date and time in a time zone (default UTC): ISO 8601 "
                            "with offset, Unix seconds and the weekday."),
            "parameters": {
                "type": "object",
                "properties": {
                    "timezone": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_TIMEZONE_CHARS,
                        "description": "An IANA time zone name, e.g. \"Europe/Berlin\". "
                                       "Default \"UTC\".",
                    },
                },
                "additionalProperties": False,
            },
            "permission": "guest",
            "function": now,
            "idempotent": True,  # reads the clock: no side effect
            "time_limit_s": TIME_LIMIT_S,
        },
    ],
})
