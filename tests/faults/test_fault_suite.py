"""The fault suite (issue 11): one fault per scenario while jobs flow, on the lab's own
Postgres and Redis. After each: every job `completed`, no duplicate message, tool result,
event or token log, no API 500, every process alive (a killed one is restarted, as the
process manager does). The Redis restart is in test_broker_restart.py, the orchestrator
outage in test_orchestrator_outage.py, the Postgres stop in test_database_outage.py."""
from __future__ import annotations

import pytest

from benchmarks.faults import SCENARIOS

FAULTS = ["orchestrator_kill9", "tools_kill9", "tools_slow_kill9", "webhooks_kill9",
          "web_kill9", "beat_kill9", "redis_flushall", "postgres_restart"]


@pytest.mark.parametrize("name", FAULTS)
def test_fault(run_fault, name):
    outcome = run_fault(name, SCENARIOS[name])
    assert outcome.statuses == {"completed": outcome.jobs}
