"""Unit tests run without a broker: every unit of work hands its effects to an in-process
runner (`agentq.runner`). By default it only records them; a test that drives a job
installs one with a stepper."""
from __future__ import annotations

import pytest

from agentq.runner import InProcessRunner


@pytest.fixture(autouse=True)
def effects():
    """The effects this test's units of work committed (`effects.sent`)."""
    with InProcessRunner().installed() as runner:
        yield runner


@pytest.fixture(autouse=True)
def _quotas_read_afresh():
    """Each test reads its tenants' quotas from its own database: the per-process cache
    (agentq.tenants.cached_quotas, 5 s) is keyed by tenant id, and the default tenant has
    the same id in every test's database."""
    from agentq.tenants import forget_cached_quotas
    forget_cached_quotas()
    yield
    forget_cached_quotas()
