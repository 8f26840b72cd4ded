"""The product stays in pieces a reader can hold: no module of agentq/, api/, tasks/ or
tool_workers/ over 600 lines, no class over 300 (issue 33's bounds; a class's lines from
its `class` line to its last, docstrings included). Past a bound, cut along what the code
does, as agentq.config (environment, urls, quotas, front) and agentq.loop.step (claim,
turn_context) were."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.support.parsing import parsed_files

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentq", "api", "tasks", "tool_workers")
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300


def _sources() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_class_is_over_300_lines():
    long = {f"{p.relative_to(ROOT)}:{node.name}": size
            for p, tree in parsed_files(_sources()).items() for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and (size := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES}
    assert long == {}
