"""Tool module `code`: run Python in the sandbox (agentq.tools.sandbox) on the slow workers.

The code runs in bubblewrap as an unprivileged uid, without network, with CPU, memory,
file-size and process limits, seeing only /usr (read-only), a private /tmp and its scratch
directory, both size-bounded tmpfs (see the sandbox module).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Any

from agentq import attachments
from agentq.errors import ToolError
from agentq.tools import sandbox, sandbox_bwrap
from agentq.tools.manifest import ToolContext, define_module

DEFAULT_TIMEOUT_S = 10
MIN_TIMEOUT_S = 1
MAX_TIMEOUT_S = 60
WALL_GRACE_S = 2
"""Wall clock beyond the CPU limit, for start-up and for code that waits on I/O."""
MEMORY_MB = 256
MIN_OUTPUT_CHARS = 200
"""The least room stdout and stderr get together, whatever the tool-result budget."""
_WIDEST_RESULT = {"stdout": "", "stderr": "", "exit_code": -2147483648,
                  "exit_signal": "SIG" + "X" * 13, "timed_out": False, "cpu_limited": False,
                  "memory_limited": False, "duration_s": -123456789.123456,
                  "truncated": False}
"""The sandbox's result with empty streams and every other value at its widest as JSON."""
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
    settings = ctx.extra.get("settings")
    if settings is None:
        from agentq.config import Settings
        settings = Settings.from_env()
    if not file_ids:
        room = output_room(settings.tool_result_max_chars, None)
        return sandbox.run_python(
            args["code"], cpu_s=timeout_s, wall_s=timeout_s + WALL_GRACE_S,
            memory_mb=MEMORY_MB, max_output_chars=room, max_output_total_chars=room,
            scratch_dir=ctx.scratch_dir)
    if ctx.session_factory is None:
        raise ToolError("file_ids need a database session")
    records = [attachments.load(ctx.session_factory, settings, f, ctx.user_id)
               for f in file_ids]
    # the files go into a directory of their own, bound read-only into the run's bounded
    # scratch (or into the caller's scratch directory when it gave one)
    own = ctx.scratch_dir is None
    workdir = ctx.scratch_dir or tempfile.mkdtemp(prefix="agentq-sandbox-files-")
    try:
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        names = _place(records, workdir)
        room = output_room(settings.tool_result_max_chars, names)
        result = sandbox.run_python(
            args["code"], cpu_s=timeout_s, wall_s=timeout_s + WALL_GRACE_S,
            memory_mb=MEMORY_MB, max_output_chars=room, max_output_total_chars=room,
            **({"input_dir": workdir} if own else {"scratch_dir": workdir}))
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    return {**result, "files": names}


def output_room(max_result_chars: int, files: dict[str, str] | None) -> int:
    """How many JSON characters stdout and stderr may take together so that the whole
    result, as the model reads it (JSON, AGENTQ_TOOL_RESULT_MAX_CHARS), fits: the sandbox
    cuts them to this, and nothing cuts the result again."""
    widest = dict(_WIDEST_RESULT, **({"files": files} if files is not None else {}))
    rest = len(json.dumps(widest, ensure_ascii=False))
    return max(max_result_chars - rest, MIN_OUTPUT_CHARS)


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
                "network; only the current directory "
                f"({sandbox_bwrap.SCRATCH_SIZE_BYTES // 2 ** 20} MB) and /tmp "
                f"({sandbox_bwrap.TMP_SIZE_BYTES // 2 ** 20} MB) are writable, and only for this "
                f"run; memory is limited to {MEMORY_MB} MB; long stdout/stderr is cut "
                "(`truncated` says so). "
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
