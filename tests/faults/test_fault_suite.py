"""The fault suite (issue 11): one fault per scenario while jobs flow, on the lab's own
Postgres and Redis. After each: every job `completed`, no duplicate message, tool result,
event, token log or webhook event, every job's end event received by its webhook receiver
under one id, no API 500, every process alive (a killed one is restarted, as the process
manager does). The Redis restart is in test_broker_restart.py, the orchestrator
outage in test_orchestrator_outage.py, the Postgres stop in test_database_outage.py."""
from __future__ import annotations

import pytest

from benchmarks.faults import SCENARIOS, provider_storm
from tests.support.fault_lab import STORM_S

FAULTS = ["orchestrator_kill9", "tools_kill9", "tools_slow_kill9", "webhooks_kill9",
          "web_kill9", "beat_kill9", "redis_flushall", "postgres_restart",
          "migration_mid_run"]


@pytest.mark.parametrize("name", FAULTS)
def test_fault(run_fault, name):
    outcome = run_fault(name, SCENARIOS[name])
    assert outcome.statuses == {"completed": outcome.jobs}
    # the mix ran: documents were made (one per call: run_fault asserts it) and the slow
    # code ran on tools-slow
    assert outcome.files_made > 0, outcome.as_dict()
    assert outcome.tool_calls["files.create_document"].get("succeeded"), outcome.as_dict()
    assert outcome.tool_calls["code.run_python"].get("succeeded"), outcome.as_dict()


def test_a_provider_storm_parks_jobs_and_every_job_completes(run_fault, fault_lab):
    # given the model provider failing 80% of the calls for a while (30 s at CI size): 429
    # with and without Retry-After, 500, hangs past the call timeout
    outcome = run_fault(f"provider_storm_{int(STORM_S)}s", provider_storm(STORM_S))
    # then jobs waited for their provider rather than failing, and every one completed
    # (run_fault asserts it, and that no side effect was repeated)
    assert outcome.provider_waits > 0, outcome.as_dict()
    assert outcome.statuses == {"completed": outcome.jobs}
    served = fault_lab.server.stats()["storm"]
    assert set(served) == {"429_retry_after", "429", "500", "hang"}, served


def test_a_receiver_down_is_retried_until_every_event_arrives_once(run_fault):
    # given every job's webhook receiver refusing connections for a while (20 s at CI size)
    outcome = run_fault("webhook_receiver_down", SCENARIOS["webhook_receiver_down"])
    # then the refused deliveries were retried, and every job's end event arrived under one
    # webhook-id (run_fault asserts it of every scenario)
    assert outcome.webhooks["retried_attempts"] > 0, outcome.as_dict()
    assert outcome.webhooks["jobs_not_delivered"] == 0
    assert outcome.webhooks["jobs_with_two_ids"] == 0
