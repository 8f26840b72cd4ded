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
made_by_integration = pytest.StashKey[dict]()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Remember the integration stack's fixtures while they live (see SHARED_STACK_FIXTURES):
    a second stack would share the test Redis database as its broker with the first."""
    value = yield
    if fixturedef.argname in SHARED_STACK_FIXTURES and fixturedef.baseid == "tests/integration":
        request.config.stash.setdefault(made_by_integration, {})[fixturedef.argname] = value
    return value


def pytest_fixture_post_finalizer(fixturedef, request):
    if fixturedef.argname in SHARED_STACK_FIXTURES and fixturedef.baseid == "tests/integration":
        request.config.stash.get(made_by_integration, {}).pop(fixturedef.argname, None)
