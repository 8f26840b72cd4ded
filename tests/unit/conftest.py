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
