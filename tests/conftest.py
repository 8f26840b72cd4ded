"""Fixtures shared by every test directory."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def scratch_dir():
    """A scratch directory the sandbox's unprivileged uid can reach (pytest's tmp_path lives
    under a root-only directory when the tests run as root)."""
    path = Path(tempfile.mkdtemp(prefix="agentq-test-scratch-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
