"""The docs stand alone: nothing in README.md or docs/ points at a file outside the
repository (the steering notes beside it, ../shared/, are not shipped to a user)."""
from __future__ import annotations

import re

from tests.support.stack import ROOT


def test_no_doc_points_outside_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    outside = [f"{page.relative_to(ROOT)}: {line.strip()}" for page in pages
               for line in page.read_text().splitlines()
               if re.search(r"\.\./shared/|\]\(\.\./\.\./", line)]
    assert not outside, "\n".join(outside)
