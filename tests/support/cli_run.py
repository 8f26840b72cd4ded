"""The `agentq` command run as a person runs it, for the CLI's integration tests: the
README's own `agentq run` line in embedded mode against the scripted model (`agentq_run`,
`finish`), and any command against a stack (`agentq`)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from tests.support.stack import ROOT

RUN_TIMEOUT_S = 180


def readme_run_command() -> list[str]:
    """The `agentq run …` part of the README's first command (after the last `&&`)."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```\n(.*?)\n```", readme, re.S)
    first = next(b for b in blocks if "agentq run" in b)
    command = first.split("&&")[-1].strip()
    argv = shlex.split(command)
    assert Path(argv[0]).name == "agentq" and argv[1] == "run", argv
    return argv[1:]


def agentq_run(home: Path, marker: str, llm, *extra: str, options: tuple[str, ...] = (),
               **env: str) -> subprocess.Popen:
    """`agentq [options] run <the README's question> [extra]`."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("AGENTQ_", "OPENAI_", "PROMETHEUS_"))}
    clean.update({"AGENTQ_HOME": str(home), "OPENAI_BASE_URL": llm.base_url,
                  "OPENAI_API_KEY": "sk-test", "AGENTQ_LLM_RETRIES": "0",
                  "AGENTQ_SYSTEM_PROMPT": f"You are a test. {marker}", **env})
    agentq = str(Path(os.sys.executable).with_name("agentq"))
    return subprocess.Popen([agentq, *options, *readme_run_command(), *extra], cwd=ROOT,
                            env=clean,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    return process.returncode, out, err


def agentq(stack, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENTQ_")}
    return subprocess.run([stack.agentq_bin(), *args], cwd=ROOT, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=90)
