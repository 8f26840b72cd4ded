"""Layers drawn once: the module-level imports of agentq/, api/ and tasks/ form no cycle
(an import inside a function, or under TYPE_CHECKING, is not a module's dependency)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentq", "api", "tasks")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """What `name` imports when it is imported: top-level statements, class bodies,
    if/try blocks, not functions and not `if TYPE_CHECKING:`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(body) -> None:
        for node in body:
            match node:
                case ast.FunctionDef() | ast.AsyncFunctionDef():
                    continue
                case ast.ClassDef():
                    visit(node.body)
                case ast.If(test=ast.Name(id="TYPE_CHECKING")):
                    continue
                case ast.If() | ast.Try():
                    visit(node.body)
                    visit(getattr(node, "orelse", []))
                case ast.Import():
                    out.update(alias.name for alias in node.names)
                case ast.ImportFrom():
                    base = node.module or ""
                    if node.level:
                        parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                        base = ".".join(parent + ([base] if base else []))
                    out.add(base)
                    out.update(f"{base}.{alias.name}" for alias in node.names)

    visit(ast.parse(path.read_text()).body)
    return {m for m in out if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_level_import_cycles():
    known = _modules()
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    assert _cycles(graph) == []
