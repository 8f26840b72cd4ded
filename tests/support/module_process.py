"""examples/http_module.py in a process of its own, for the tests of HTTP tool modules
(tests/integration/test_tool_modules.py, tests/security/)."""
from __future__ import annotations

import subprocess
import sys

import requests

from tests.support.stack import ROOT, die_with_parent, free_port

SECRET = "whsec_bW9kdWxlLXNlY3JldC1mb3ItdGVzdHMtMTIzNDU2Nzg="
OTHER_SECRET = "whsec_c29tZS1vdGhlci1zZWNyZXQtbm90LXRoZS1tb2R1bGU="


class ModuleProcess:
    """examples/http_module.py in its own process."""

    def __init__(self, name: str, secret: str | None = SECRET, *extra: str,
                 port: int | None = None):
        self.name, self.secret, self.extra = name, secret, extra
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ModuleProcess":
        command = [sys.executable, "-m", "examples.http_module", "--port", str(self.port),
                   "--name", self.name, *(["--secret", self.secret] if self.secret else []),
                   *self.extra]
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=die_with_parent)
        line = self.proc.stdout.readline()
        assert line.strip() == self.url, line
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc.stdout.close()

    def stats(self) -> dict:
        return requests.get(f"{self.url}/stats", timeout=10).json()
