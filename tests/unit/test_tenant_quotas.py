"""Tenant quotas (agentq.tenants): the defaults, an operator's overrides and their checks,
the tool-call cap of one reply, the schedules quota, the running-jobs gate, and a scope key
of a non-admin key's own conversation."""
from __future__ import annotations

import dataclasses
import uuid

import pytest

from agentq.config.quotas import QUOTA_NAMES, Quotas
from agentq.db import session_scope
from agentq.errors import QuotaExceeded, ValidationFailed
from agentq.llm.types import LLMReply, ToolCallRequest
from agentq.loop.decision import RunTools, decide
from agentq.loop.identity import Incoming, resolve_conversation, resolve_user, scope_key
from agentq.loop.lifecycle import may_start
from agentq.models import Job, Tenant
from agentq.schedules import create_schedule, timing
from agentq.tenants import (
    DEFAULT_TENANT_ID,
    create_tenant,
    quotas_for,
    running_count,
    update_quotas,
)
from agentq.testing.harness import text
from tests.support import unit_db


@pytest.fixture()
def settings(tmp_path):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), "AGENTQ_QUOTA_SCHEDULES": "7"})
    return settings


def test_the_defaults_come_from_the_settings(settings):
    quotas = settings.quotas
    assert quotas.schedules == 7 and quotas.modules == Quotas.modules
    assert set(dataclasses.asdict(quotas)) == set(QUOTA_NAMES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        quotas.schedules = 1  # type: ignore[misc]


def test_an_operators_quotas_override_the_defaults_and_null_resets_one(settings):
    with session_scope(settings) as session:
        tenant = create_tenant(session, "acme")
        update_quotas(session, tenant, {"schedules": 2, "tool_calls_per_turn": 0})
        quotas = quotas_for(session, tenant.id, settings)
        assert (quotas.schedules, quotas.tool_calls_per_turn) == (2, 0)
        assert quotas.modules == Quotas.modules
        update_quotas(session, tenant, {"schedules": None})
        assert quotas_for(session, tenant.id, settings).schedules == 7
        assert session.get(Tenant, tenant.id).quotas == {"tool_calls_per_turn": 0}
        # an unknown tenant has the defaults
        assert quotas_for(session, uuid.uuid4(), settings) == settings.quotas


@pytest.mark.parametrize("changes", [{"schedules": -1}, {"schedules": 1.5},
                                     {"schedules": "3"}, {"schedules": True},
                                     {"bananas": 1}, {"modules": 1_000_001}])
def test_bad_quotas_are_refused_and_change_nothing(settings, changes):
    with session_scope(settings) as session:
        tenant = create_tenant(session, f"t-{uuid.uuid4().hex[:6]}")
        with pytest.raises(ValidationFailed):
            update_quotas(session, tenant, changes)
        assert tenant.quotas is None


def _reply(n: int) -> LLMReply:
    calls = tuple(ToolCallRequest(f"c{i}", "math.evaluate", {"expression": f"{i}+1"})
                  for i in range(n))
    return LLMReply(content="", tool_calls=calls, stop_reason="tool_use", input_tokens=1,
                    output_tokens=1, model="m")


def test_calls_past_the_per_turn_cap_are_answered_and_not_run():
    decision = decide(_reply(5), ["math.evaluate"], max_calls=2)
    assert isinstance(decision, RunTools)
    assert [c.error for c in decision.calls[:2]] == [None, None]
    assert {c.error["code"] for c in decision.calls[2:]} == {"too_many_tool_calls"}
    # no cap (0) and a cap not reached change nothing
    for cap in (0, 5):
        assert all(c.error is None for c in decide(_reply(5), ["math.evaluate"],
                                                   max_calls=cap).calls)


def _conversation(session, settings, tenant_id=DEFAULT_TENANT_ID, channel="c1"):
    incoming = Incoming("cli", "u1", channel)
    user = resolve_user(session, tenant_id, incoming, settings)
    return resolve_conversation(session, user, incoming, None)


def test_active_schedules_past_the_quota_are_refused(settings):
    with session_scope(settings) as session:
        tenant = create_tenant(session, "sched")
        update_quotas(session, tenant, {"schedules": 1})
        conversation = _conversation(session, settings, tenant.id)
        create_schedule(session, conversation, "one", timing(delay_s=60), None,
                        settings=settings)
        with pytest.raises(QuotaExceeded) as caught:
            create_schedule(session, conversation, "two", timing(delay_s=60), None,
                            settings=settings)
        assert caught.value.details == {"quota": "schedules", "limit": 1, "used": 1}


def test_a_job_past_the_running_jobs_quota_waits_for_it(settings):
    with session_scope(settings) as session:
        tenant = create_tenant(session, "busy")
        update_quotas(session, tenant, {"running_jobs": 1})
        conversation = _conversation(session, settings, tenant.id)

        def job(status="queued", waiting_for=None):
            row = Job(id=uuid.uuid4(), tenant_id=tenant.id, conversation_id=conversation.id,
                      user_id=conversation.user_id, content="x", status=status,
                      waiting_for=waiting_for)
            session.add(row)
            session.flush()
            return row
        first = job()
        assert may_start(session, first, settings) and first.waiting_for is None
        job(waiting_for="conversation")  # queued behind a conversation: not counted
        assert running_count(session, tenant.id) == 1
        second = job()
        assert not may_start(session, second, settings)
        assert second.waiting_for == "quota"
        first.status = "completed"
        session.flush()
        third = job()
        assert may_start(session, third, settings)


def test_a_job_ending_hands_its_place_on_at_once(make):
    """Its end, not a sweeper pass, starts who waits: the conversation's next job takes the
    ended job's place, and a job waiting for the quota starts when that one ends (a step's
    unit of work writes its changes at the commit: the count sees them before)."""
    # given a quota of one running job: one running, one behind it in its conversation,
    # one in another conversation waiting for the quota
    h = make(text("one"), text("two"), text("three"), AGENTQ_QUOTA_RUNNING_JOBS="1")
    first, behind = h.submit("a?", thread="t1"), h.submit("b?", thread="t1")
    other = h.submit("c?", thread="t2")
    assert (h.job(behind).waiting_for, h.job(other).waiting_for) == ("conversation", "quota")
    # when the first ends, the runner running every step sent meanwhile
    h.drive(first)
    # then each started when the one before it ended, and all three answered in turn
    jobs = [h.job(j) for j in (first, behind, other)]
    assert [j.status for j in jobs] == ["completed"] * 3
    assert [j.response["content"] for j in jobs] == ["one", "two", "three"]
    assert jobs[0].finished_at <= jobs[1].started_at <= jobs[1].finished_at <= jobs[2].started_at


def test_a_non_admin_keys_place_is_its_own():
    key, other = uuid.uuid4(), uuid.uuid4()
    tenant = DEFAULT_TENANT_ID
    assert scope_key(tenant, "api", "c", None, key) != scope_key(tenant, "api", "c", None, other)
    assert scope_key(tenant, "api", "c", None, key) != scope_key(tenant, "api", "c", None)
    assert scope_key(tenant, "api", "c", None, key).endswith(f',"{key}"]')


def test_quotas_is_the_one_shape_other_code_reads():
    assert [f.name for f in dataclasses.fields(Quotas)] == [
        "requests_per_second", "streams_per_key", "running_jobs", "schedules", "modules",
        "tool_calls_per_turn"]
