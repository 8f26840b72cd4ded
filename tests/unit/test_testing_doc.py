"""docs/testing.md's example is a test module that this suite runs: each `python` block of
the page, joined in order, is compiled as a module and each of its `test_*` functions is
called with a directory of its own, so the page cannot drift from the kit it shows."""
from __future__ import annotations

import pytest

from tests.support.stack import ROOT

PAGE = ROOT / "docs" / "testing.md"


def _example() -> dict:
    """The page's python blocks as one module, each line at its line number in the page (a
    failure points at the page's own line); everything else on the page blank."""
    lines = PAGE.read_text().splitlines()
    source, inside = [], False
    for line in lines:
        if line.strip() == "```python":
            inside = True
            source.append("")
        elif inside and line.strip() == "```":
            inside = False
            source.append("")
        else:
            source.append(line if inside else "")
    assert any(source), f"{PAGE} has no python block"
    namespace: dict = {"__name__": "testing_doc_example"}
    exec(compile("\n".join(source), str(PAGE), "exec"), namespace)  # noqa: S102 - our own doc
    return namespace


EXAMPLE = _example()
TESTS = sorted(name for name in EXAMPLE if name.startswith("test_"))


def test_the_page_has_examples():
    assert len(TESTS) >= 2


@pytest.mark.parametrize("name", TESTS)
def test_the_pages_example_passes(name, tmp_path):
    EXAMPLE[name](tmp_path)
