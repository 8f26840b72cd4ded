"""agentq.schedules on the embedded database (SQLite): timing rules, cron ticks in a zone,
the catch-up policy, and fire_due making one firing and one job per tick however often it
runs. (tests/integration/test_schedules.py does the same through beat on Postgres.)"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from agentq.db import session_factory, session_scope
from agentq.errors import ValidationFailed
from agentq.loop.identity import Incoming, resolve_conversation, resolve_user
from agentq.models import Job, Schedule, ScheduleFiring
from agentq.schedules import (
    cancel_schedule,
    create_schedule,
    fire_due,
    latest_due,
    next_tick,
    timing,
)
from agentq.tenants import DEFAULT_TENANT_ID
from tests.support import unit_db

T0 = datetime(2030, 3, 30, 23, 59, 58, tzinfo=timezone.utc)


@pytest.mark.parametrize("kw,field", [
    ({}, "run_at"),
    ({"delay_s": 1, "cron": "* * * * *"}, "cron"),
    ({"cron": "every minute"}, "cron"),
    ({"cron": "* * * *"}, "cron"),
    ({"cron": "* * * * *", "tz": "Nowhere/Land"}, "timezone"),
    ({"delay_s": 1, "tz": "UTC"}, "timezone"),
    ({"delay_s": -5}, "delay_s"),
    ({"run_at": datetime(2030, 1, 1)}, "run_at"),
    ({"run_at": T0 + timedelta(days=400)}, "run_at"),
])
def test_timing_refuses_what_it_cannot_schedule(kw, field):
    with pytest.raises(ValidationFailed) as caught:
        timing(now=T0, **kw)
    assert field in caught.value.fields


def test_timing_kinds():
    assert timing(delay_s=5, now=T0).next_run_at == T0 + timedelta(seconds=5)
    at = datetime(2030, 4, 1, 9, tzinfo=timezone(timedelta(hours=2)))
    once = timing(run_at=at, now=T0)
    assert once.kind == "once" and once.next_run_at == at and once.next_run_at.utcoffset() \
        == timedelta(0)
    cron = timing(cron="0 9 * * *", tz="Europe/Berlin", now=T0)
    # 09:00 in Berlin on 31 March 2030 is summer time (UTC+2)
    assert cron.next_run_at == datetime(2030, 3, 31, 7, tzinfo=timezone.utc)
    assert next_tick("* * * * * */2", "UTC", T0) == T0 + timedelta(seconds=2)


def test_catch_up_fires_once_for_the_latest_tick():
    first = datetime(2030, 1, 1, 0, 0, tzinfo=timezone.utc)
    fire_at, missed, upcoming = latest_due("0 * * * *", "UTC", first,
                                           first + timedelta(hours=5, minutes=30))
    assert (fire_at, missed, upcoming) == (first + timedelta(hours=5), 5,
                                           first + timedelta(hours=6))
    # a per-second schedule down for a day: no walk of 86,400 ticks
    now = first + timedelta(days=1, milliseconds=500)
    fire_at, missed, upcoming = latest_due("* * * * * *", "UTC", first, now)
    assert fire_at == first + timedelta(days=1)
    assert missed > 1000 and upcoming == first + timedelta(days=1, seconds=1)


@pytest.fixture()
def embedded(tmp_path):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path)})
    with session_scope(settings) as session:
        incoming = Incoming("cli", "u1", "c1")
        user = resolve_user(session, DEFAULT_TENANT_ID, incoming, settings)
        conversation = resolve_conversation(session, user, incoming, None)
        conversation_id = conversation.id
    return settings, conversation_id


def _counts(settings, schedule_id):
    with session_scope(settings) as session:
        firings = session.execute(select(func.count()).select_from(ScheduleFiring).where(
            ScheduleFiring.schedule_id == schedule_id)).scalar_one()
        jobs = session.execute(select(func.count()).select_from(Job)).scalar_one()
    return firings, jobs


def test_fire_due_makes_one_job_per_tick_however_often_it_runs(embedded, effects):
    settings, conversation_id = embedded
    clock = [T0]
    with session_scope(settings) as session:
        from agentq.models import Conversation
        conversation = session.get(Conversation, conversation_id)
        once = create_schedule(session, conversation, "later", timing(delay_s=1, now=T0),
                               None).id
    sessions = session_factory(settings)
    assert fire_due(settings, sessions, now=lambda: clock[0]) == 0  # not due yet
    clock[0] = T0 + timedelta(seconds=5)
    assert fire_due(settings, sessions, now=lambda: clock[0]) == 1
    assert fire_due(settings, sessions, now=lambda: clock[0]) == 0
    assert _counts(settings, once) == (1, 1)
    # its job's first step went out once, after the firing committed
    assert [type(e).__name__ for e in effects.sent] == ["NextStep"]
    with session_scope(settings) as session:
        row = session.get(Schedule, once)
        assert (row.status, row.next_run_at, row.fire_count) == ("completed", None, 1)
        job = session.execute(select(Job)).scalar_one()
        assert job.conversation_id == conversation_id and job.content == "later"
        assert job.meta["schedule_id"] == str(once)


def test_a_cancelled_schedule_is_never_fired(embedded):
    settings, conversation_id = embedded
    with session_scope(settings) as session:
        from agentq.models import Conversation
        conversation = session.get(Conversation, conversation_id)
        sid = create_schedule(session, conversation, "never", timing(delay_s=0, now=T0),
                              None).id
    with session_scope(settings) as session:
        cancel_schedule(session, session.get(Schedule, sid))
    assert fire_due(settings, session_factory(settings),
                    now=lambda: T0 + timedelta(hours=1)) == 0
    assert _counts(settings, sid) == (0, 0)
