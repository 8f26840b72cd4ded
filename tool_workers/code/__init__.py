"""Tool module `code`: run Python in the sandbox (agentq.tools.sandbox) on the slow workers.

The code runs in bubblewrap as an unprivileged uid, without network, with CPU, memory,
file-size and process limits, seeing only /usr (read-only), a private /tmp and its scratch
directory (see the sandbox module).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

from agentq import attachments
from agentq.errors import ToolError
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
MAX_FILES = 10
_UNSAFE = re.compile(r"[^A-Za-z0-9._ -]+")
TOOL_TIME_LIMIT_S = MAX_TIMEOUT_S + WALL_GRACE_S + 5
"""Above the longest sandbox wall clock (62 s) plus clean-up, so that a timeout reaches the
model as the normal `timed_out` result rather than as the registry's ToolTimeout."""


def run_python(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    timeout_s = float(args.get("timeout_s", DEFAULT_TIMEOUT_S))
    timeout_s = min(max(timeout_s, MIN_TIMEOUT_S), MAX_TIMEOUT_S)
    file_ids = args.get("file_ids") or []
    if not file_ids:
        return sandbox.run_python(
            args["code"], cpu_s=timeout_s, wall_s=timeout_s + WALL_GRACE_S,
            memory_mb=MEMORY_MB, max_output_chars=MAX_OUTPUT_CHARS, scratch_dir=ctx.scratch_dir)
    if ctx.session_factory is None:
        raise ToolError("file_ids need a database session")
    settings = ctx.extra.get("settings")
    if settings is None:
        from agentq.config import Settings
        settings = Settings.from_env()
    records = [attachments.load(ctx.session_factory, settings, f, ctx.user_id)
               for f in file_ids]
    own = ctx.scratch_dir is None
    workdir = ctx.scratch_dir or tempfile.mkdtemp(prefix="agentq-sandbox-")
    try:
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        names = _place(records, workdir)
        result = sandbox.run_python(
            args["code"], cpu_s=timeout_s, wall_s=timeout_s + WALL_GRACE_S,
            memory_mb=MEMORY_MB, max_output_chars=MAX_OUTPUT_CHARS, scratch_dir=workdir)
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    return {**result, "files": names}


def _place(records, workdir: str) -> dict[str, str]:
    """Each file into the scratch under its own (safe, unique) name: {file_id: name}."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for record in records:
        base = _UNSAFE.sub("_", os.path.basename(record.filename or "")).strip(" ._") or "file"
        name, n = base[:120], 1
        while name in taken:
            stem, dot, ext = base.rpartition(".")
            name = f"{stem}-{n}.{ext}" if dot else f"{base}-{n}"
            n += 1
        taken.add(name)
        path = os.path.join(workdir, name)
        with open(path, "wb") as out:
            out.write(record.content)
        os.chmod(path, 0o644)
        names[str(record.id)] = name
    return names


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
                    "file_ids": {
                        "type": "array", "maxItems": MAX_FILES,
                        "items": {"type": "string"},
                        "description": "Stored or attached files (file_id) to put in the "
                                       "current directory under their filenames; the "
                                       "result's `files` maps each id to its name.",
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
            "idempotent": False,  # a fresh sandbox each run, but its output may differ
            "time_limit_s": TOOL_TIME_LIMIT_S,
        },
    ],
})
