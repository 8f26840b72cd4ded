"""The fault suite's lab: the Procfile's processes against a private Redis and a private
Postgres (free ports, scratch directories), so a test may restart or flush them; with
AGENTQ_FAULT_BROKER=amqp a private RabbitMQ node is the broker.

Size: AGENTQ_FAULT_JOBS jobs per scenario (default 100, CI's size) submitted at
AGENTQ_FAULT_RATE per second (default 20); the provider storm lasts AGENTQ_FAULT_STORM_S
(default 20 here, 300 in `python -m benchmarks faults`, which runs the same scenarios at
full size: N = 1,000 at 10/s).

Time: a scenario waits at most AGENTQ_FAULT_DRAIN_TIMEOUT_S (default 240) for its fault to
end and as long again for its jobs to end, then reports what it saw; each fault test's
pytest timeout is set above that (twice the drain timeout + 120 s), so a slow drain fails
with the scenario's figures rather than a bare timeout.
"""
from __future__ import annotations

import os

import pytest

from tests.support.fault_lab import BROKER, TEST_TIMEOUT_S, make_runner, started_lab


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/faults/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def fault_lab(servers_up):
    yield from started_lab(BROKER)


@pytest.fixture
def run_fault(fault_lab):
    """Run one scenario on the shared lab; assert the promise; return the outcome."""
    return make_runner(fault_lab)
