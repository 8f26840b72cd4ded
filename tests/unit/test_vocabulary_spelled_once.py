"""The state columns' values are spelled once, in agentq.loop.states: no module of agentq/,
api/, tasks/ or tool_workers/ compares a `status`, `phase`, `waiting_for` or `replay_mode`
with a bare string, nor writes one through `.values(...)` / `filter_by(...)`. A value
spelled out by hand is one a rename or a new member silently misses; the enum's member is
checked by mypy and by the lifecycle's transition table (tests/unit/test_lifecycle.py).

Read from the source (ast), so it holds for code no test reaches."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.support.parsing import parsed, parsed_files

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentq", "api", "tasks", "tool_workers")
STATE_FIELDS = frozenset({"status", "phase", "waiting_for", "replay_mode"})
WRITERS = frozenset({"values", "filter_by"})


def _names_a_state_field(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in STATE_FIELDS
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and node.slice.value in STATE_FIELDS)


def _bare(node: ast.expr) -> bool:
    """A string literal, or a tuple/list/set holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_bare(element) for element in node.elts)
    return False


def bare_state_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, code) of each place `tree` compares or writes a state field as a string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_a_state_field(s) for s in sides) and any(_bare(s) for s in sides):
                found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in WRITERS):
            found.extend((k.value.lineno, ast.unparse(k)) for k in node.keywords
                         if k.arg in STATE_FIELDS and _bare(k.value))
    return found


def test_the_scan_finds_what_it_looks_for():
    source = """
job.status == "queued"
call.status in ("pending", "awaiting")
row["waiting_for"] != "quota"
update(Job).values(status="failed", phase=Phase.LLM)
select(Job).filter_by(replay_mode="live")
job.status == JobStatus.QUEUED
response.status_code == 200
bar.status = "failed"
"""
    [tree] = parsed([source])
    assert [line for line, _ in bare_state_strings(tree)] == [2, 3, 4, 5, 6]


def test_no_module_spells_a_state_value_by_hand():
    trees = parsed_files([path for package in PACKAGES
                          for path in sorted((ROOT / package).rglob("*.py"))])
    found = {str(path.relative_to(ROOT)): hits for path, tree in trees.items()
             if (hits := bare_state_strings(tree))}
    assert found == {}
