"""Tool module `code`: run Python in the sandbox (agentq.tools.sandbox) on the slow workers.

The code runs in bubblewrap as an unprivileged uid, without network, with CPU, memory,
file-size and process limits, seeing only /usr (read-only), a private /tmp and its scratch
directory (see the sandbox module).
"""
from __future__ import annotations

from typing import Any

from agentq.tools import sandbox
from agentq.tools.manifest import ToolContext, define_module

DEFAULT_TIMEOUT_S = 10
MIN_TIMEOUT_S = 1
MAX_TIMEOUT_S = 60
WALL_GRACE_S = 2
"""Wall clock beyond the CPU limit, for start-up and for code that waits on I/O."""
MEMORY_MB = 256
MAX_OUTPUT_CHARS = 3000
"""Each of stdout and stderr: both, with the rest of the result, fit the default
AGENTQ_TOOL_RESULT_MAX_CHARS (8000), so the model reads output cut once, here."""
MAX_CODE_CHARS = 20_000
TOOL_TIME_LIMIT_S = MAX_TIMEOUT_S + WALL_GRACE_S + 5
"""Above the longest sandbox wall clock (62 s) plus clean-up, so that a timeout reaches the
model as the normal `timed_out` result rather than as the registry's ToolTimeout."""


def run_python(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    timeout_s = float(args.get("timeout_s", DEFAULT_TIMEOUT_S))
    timeout_s = min(max(timeout_s, MIN_TIMEOUT_S), MAX_TIMEOUT_S)
    return sandbox.run_python(
        args["code"], cpu_s=timeout_s, wall_s=timeout_s + WALL_GRACE_S, memory_mb=MEMORY_MB,
        max_output_chars=MAX_OUTPUT_CHARS, scratch_dir=ctx.scratch_dir)


MODULE = define_module({
    "module": "code",
    "description": "Run Python code in an isolated sandbox.",
    "slow": True,
    "tools": [
        {
            "name": "code.run_python",
            "description": (
                "Run a Python 3.11 program (standard library only) in a sandbox and return "
                "its stdout, stderr and exit code. Print what you want to see. There is no "
                "network; only the current directory is writable; memory is limited to "
                f"{MEMORY_MB} MB and each of stdout/stderr to {MAX_OUTPUT_CHARS} characters. "
                "timed_out, cpu_limited or memory_limited in the result mean the program was "
                "stopped (exit_signal names the signal)."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_CODE_CHARS,
                        "description": "The Python source to run as a script.",
                    },
                    "timeout_s": {
                        "type": "number",
                        "minimum": MIN_TIMEOUT_S,
                        "maximum": MAX_TIMEOUT_S,
                        "default": DEFAULT_TIMEOUT_S,
                        "description": "CPU-time limit in seconds (default "
                                       f"{DEFAULT_TIMEOUT_S}); the wall-clock limit is "
                                       f"{WALL_GRACE_S} s more.",
                    },
                },
                "required": ["code"],
                "additionalProperties": False,
            },
            "permission": "user",
            "function": run_python,
            "time_limit_s": TOOL_TIME_LIMIT_S,
        },
    ],
})
