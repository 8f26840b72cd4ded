"""No import circles: the modules of agentq/, api/, tasks/ and tool_workers/ import one
another in one direction only, counting imports inside functions (which close a circle at
run time as surely as those at the top) and leaving out those under `if TYPE_CHECKING:`.

The graph is grimp's, the library import-linter checks the layers with (setup.cfg's
[importlinter], run by .ci/lint)."""
from __future__ import annotations

import grimp
import pytest

PACKAGES = ("agentq", "api", "tasks", "tool_workers")


def _circles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph.modules):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)


def test_the_checker_finds_a_circle_closed_inside_a_function():
    given = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        given.add_module(module)
    given.add_import(importer="p.a", imported="p.b")
    given.add_import(importer="p.b", imported="p.c")
    given.add_import(importer="p.c", imported="p.a")  # as a function-local import would
    assert _circles(given) == [frozenset({"p.a", "p.b", "p.c"})]


def test_no_import_circle(graph):
    assert _circles(graph) == []


def test_the_job_vocabulary_imports_nothing_of_ours(graph):
    """setup.cfg lets every module of agentq import agentq.loop.states (`agentq.** ->
    agentq.loop.states`, under the layers it sits above): that holds only while it is a
    leaf, the vocabulary alone, importing no module of ours."""
    ours = {m for m in graph.find_modules_directly_imported_by("agentq.loop.states")
            if m.split(".")[0] in PACKAGES}
    assert ours == set()


def test_suites_share_code_through_tests_support_only():
    """A test module imports no other test module or conftest: what the suites and the
    benchmarks share lives in tests.support (the stack, the HTTP client, the fault lab's
    runner, the attack scripts), so a suite can be run, moved or deleted on its own."""
    suites = grimp.build_graph("tests", "benchmarks", exclude_type_checking_imports=True,
                               cache_dir=None)
    shared = ("tests", "tests.support")
    crossing = sorted(
        (importer, imported)
        for importer in suites.modules
        for imported in suites.find_modules_directly_imported_by(importer)
        if imported.startswith("tests.") and imported != importer
        and not imported.startswith("tests.support") and imported not in shared)
    assert crossing == []
