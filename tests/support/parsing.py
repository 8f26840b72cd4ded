"""Python sources parsed in a process of their own, for the tests that read the product's
code (tests/unit/test_vocabulary_spelled_once.py, test_module_sizes.py).

Not in the test process: CPython 3.11's ast conversion keeps its recursion depth in state
shared by the process's threads, so an `ast.parse` here racing one in another thread
(3.11's traceback printing parses a line to place its carets: a leftover event-listener
thread logging a lost Redis, say) fails with "SystemError: AST constructor recursion depth
mismatch" (CPython gh-106905, fixed in later releases). Seen once in a fresh-clone CI run."""
from __future__ import annotations

import ast
import multiprocessing
from pathlib import Path


def parsed(sources: list[str]) -> list[ast.Module]:
    """Each source's tree, parsed in a fresh interpreter (the trees come back pickled)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.map(ast.parse, sources)


def parsed_files(paths: list[Path]) -> dict[Path, ast.Module]:
    return dict(zip(paths, parsed([p.read_text() for p in paths]), strict=True))
