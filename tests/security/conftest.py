"""Fixtures for the security tests. Those that go through the real stack use the integration
fixtures (tests/integration/conftest.py): when this session already started the integration
stack, its processes are reused (two stacks would share the test Redis database as their
broker and take each other's tasks); otherwise this package starts its own, and stops it
when its tests are done."""
from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import TEST_ENV, client, database_url, script, servers_up  # noqa: F401
from tests.conftest import made_by_integration
from tests.support.scripted_llm import ScriptedLLM
from tests.support.stack import Stack, StackError, flush_redis



def _from_integration(request, name: str) -> Any | None:
    """The integration directory's session fixture `name`, if this session made it."""
    return request.config.stash.get(made_by_integration, {}).get(name)


@pytest.fixture(scope="package")
def llm(request):
    shared = _from_integration(request, "llm")
    if shared is not None:
        yield shared
        return
    server = ScriptedLLM().start()
    yield server
    server.stop()


@pytest.fixture(scope="package")
def stack(request, llm, tmp_path_factory):
    shared = _from_integration(request, "stack")
    if shared is not None:
        yield shared
        return
    url = request.getfixturevalue("database_url")
    flush_redis()
    own = Stack(url, llm.base_url, tmp_path_factory.mktemp("security-stack"), TEST_ENV)
    try:
        own.start()
    except StackError as exc:
        own.stop()
        pytest.fail(str(exc))
    yield own
    own.stop()


@pytest.fixture(scope="package")
def admin_key(request, stack) -> str:
    return _from_integration(request, "admin_key") or stack.create_key("security", admin=True)
