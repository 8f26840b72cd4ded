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


SHARED_STACK_FIXTURES = ("llm", "stack", "admin_key")
"""The integration stack's session fixtures that tests/security reuses when they exist."""
INTEGRATION_DIR = Path(__file__).parent / "integration"
made_by_integration = pytest.StashKey[dict]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """Remember the integration stack's session fixtures once a test there has them (see
    SHARED_STACK_FIXTURES): a second stack would share the test Redis database as its broker
    with the first, and take its tasks. They live until the session ends."""
    result = yield
    if INTEGRATION_DIR in item.path.parents:
        funcargs = getattr(item, "funcargs", {})
        shared = item.config.stash.setdefault(made_by_integration, {})
        shared.update({name: funcargs[name] for name in SHARED_STACK_FIXTURES
                       if name in funcargs})
    return result
