"""Schedules (seed 000's scheduler): a message that continues a conversation later, once
(`run_at`, or `delay_s` from now) or on each tick of a cron expression in a time zone.

Beat runs `fire_due` every AGENTQ_SCHEDULE_INTERVAL_S. A firing is exactly once per
(schedule, tick), whichever beat process gets there first and across restarts:

- each due schedule is claimed with `FOR UPDATE SKIP LOCKED` (two beats split the work),
- the firing row (unique on schedule and tick), the continue job and the schedule's next
  tick are written in one transaction, so a beat that dies before it commits leaves the
  schedule due, and one that dies after leaves it advanced;
- a second firing of the same tick hits the unique key and writes nothing.

Catch-up policy: a cron schedule that missed ticks (beat was down) fires ONCE, for the
latest tick that is due, and records how many it skipped (`missed`); then it waits for its
next tick after now. A one-off fires once however late.

Cancelled schedules are never selected; a deleted tenant or conversation deletes its
schedules (ON DELETE CASCADE), so they cannot fire either. A revoked key's schedules are
cancelled when it is revoked (`agentq.keys.revoke_key`); one found due all the same (its key
revoked some other way) is cancelled here instead of firing.

Cron expressions are parsed by croniter: five fields, or six with the sixth being seconds
(croniter's convention), e.g. `* * * * * */2` is every two seconds.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import Any, Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import utcnow
from agentq.errors import Conflict, NotFound, ValidationFailed
from agentq.ids import new_id
from agentq.loop.states import SCHEDULE_SHOWN, ScheduleStatus
from agentq.loop.uow import UnitOfWork
from agentq.models import ApiKey, Conversation, Schedule, ScheduleFiring

log = logging.getLogger(__name__)

MAX_DELAY_S = 366 * 86400
MAX_CRON_CHARS = 200
MAX_TIMEZONE_CHARS = 64
FIRE_BATCH = 100
"""Due schedules looked up at a time (each then fires in a transaction of its own)."""
CATCH_UP_STEPS = 1000
"""Ticks walked forward one by one before jumping straight to the latest due one."""
RECENT_FIRINGS = 20


def zone(name: str) -> tzinfo:
    if name == "UTC":
        return dt_timezone.utc
    try:
        if not name or len(name) > MAX_TIMEZONE_CHARS:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationFailed({"timezone": [f"Unknown time zone {name[:64]!r}; use an IANA "
                                             "name such as 'UTC' or 'Europe/Berlin'."]},
                               "Unknown time zone.") from None


def check_cron(expr: str | None) -> str:
    expr = " ".join((expr or "").split())
    if not expr or len(expr) > MAX_CRON_CHARS or len(expr.split()) not in (5, 6) \
            or not croniter.is_valid(expr):
        raise ValidationFailed({"cron": ["Must be a cron expression of 5 fields (minute "
                                         "hour day month weekday), or 6 with seconds last."]},
                               "Invalid cron expression.")
    return expr


def next_tick(expr: str, tz: str, after: datetime) -> datetime:
    """The first tick of `expr` in zone `tz` strictly after `after` (UTC out)."""
    local = after.astimezone(zone(tz))
    return croniter(expr, local).get_next(datetime).astimezone(dt_timezone.utc)


def latest_due(expr: str, tz: str, first: datetime, now: datetime) -> tuple[datetime, int,
                                                                             datetime]:
    """From the due tick `first`: (the latest tick <= now, ticks skipped before it, the
    first tick after now)."""
    fire_at, skipped = first, 0
    it = croniter(expr, first.astimezone(zone(tz)))
    for _ in range(CATCH_UP_STEPS):
        nxt = it.get_next(datetime).astimezone(dt_timezone.utc)
        if nxt > now:
            return fire_at, skipped, nxt
        fire_at, skipped = nxt, skipped + 1
    # a long outage of a frequent schedule: jump
    prev = croniter(expr, now.astimezone(zone(tz))).get_prev(datetime).astimezone(
        dt_timezone.utc)
    upcoming = next_tick(expr, tz, now)
    if prev > fire_at:
        fire_at = prev
        skipped += 1  # at least; the exact count is not worth walking for
    return fire_at, skipped, upcoming


@dataclass
class Timing:
    kind: str
    run_at: datetime | None
    cron: str | None
    timezone: str
    next_run_at: datetime


def timing(run_at: datetime | None = None, delay_s: float | None = None,
           cron: str | None = None, tz: str | None = None,
           now: datetime | None = None) -> Timing:
    """Exactly one of run_at, delay_s and cron; timezone goes with cron (default UTC)."""
    now = now or utcnow()
    given = [name for name, value in (("run_at", run_at), ("delay_s", delay_s),
                                      ("cron", cron)) if value is not None]
    if len(given) != 1:
        raise ValidationFailed({(given[1] if len(given) > 1 else "run_at"):
                                ["Give exactly one of run_at, delay_s and cron."]},
                               "Give exactly one of run_at, delay_s and cron.")
    if tz is not None and cron is None:
        raise ValidationFailed({"timezone": ["Only with cron (run_at carries its own "
                                             "offset)."]})
    if delay_s is not None:
        if not 0 <= delay_s <= MAX_DELAY_S:
            raise ValidationFailed({"delay_s": [f"Must be between 0 and {MAX_DELAY_S}."]})
        at = now + timedelta(seconds=delay_s)
        return Timing("once", at, None, "UTC", at)
    if run_at is not None:
        if run_at.tzinfo is None:
            raise ValidationFailed({"run_at": ["Must have a time zone offset."]})
        if run_at - now > timedelta(seconds=MAX_DELAY_S):
            raise ValidationFailed({"run_at": ["Must be within a year from now."]})
        at = run_at.astimezone(dt_timezone.utc)
        return Timing("once", at, None, "UTC", at)
    expr = check_cron(cron)
    name = tz or "UTC"
    zone(name)
    try:
        first = next_tick(expr, name, now)
    except (ValueError, OverflowError):  # croniter's CroniterBadDateError is a ValueError
        # a valid expression with no date to fire on (`0 0 30 2 *`: 30 February)
        raise ValidationFailed({"cron": ["This expression never fires (no date matches it, "
                                         "e.g. 30 February)."]},
                               "The cron expression never fires.") from None
    return Timing("cron", None, expr, name, first)


def create_schedule(session: Session, conversation: Conversation, content: str, when: Timing,
                    api_key_id: uuid.UUID | None, created_by: str = "api",
                    tool_use_id: str | None = None, callback_url: str | None = None,
                    metadata: dict[str, Any] | None = None,
                    settings: Settings | None = None) -> Schedule:
    """A new active schedule; `QuotaExceeded` (422) when the tenant holds its quota of
    active schedules already (`agentq.tenants.Quotas.schedules`)."""
    check_schedule_quota(session, conversation.tenant_id, settings)
    now = utcnow()
    schedule = Schedule(id=new_id(), tenant_id=conversation.tenant_id,
                        api_key_id=api_key_id, conversation_id=conversation.id,
                        user_id=conversation.user_id, content=content, kind=when.kind,
                        run_at=when.run_at, cron=when.cron, timezone=when.timezone,
                        next_run_at=when.next_run_at, status=ScheduleStatus.ACTIVE,
                        created_by=created_by, tool_use_id=tool_use_id,
                        callback_url=callback_url, meta=metadata or {}, fire_count=0,
                        created_at=now)
    session.add(schedule)
    session.flush()
    return schedule


def check_schedule_quota(session: Session, tenant_id: uuid.UUID,
                         settings: Settings | None = None) -> None:
    """Refuse one more active schedule past the tenant's quota (agentq.tenants.check_quota)."""
    from agentq.tenants import check_quota
    check_quota(session, tenant_id, "schedules", select(func.count()).select_from(Schedule)
                .where(Schedule.tenant_id == tenant_id,
                       Schedule.status == ScheduleStatus.ACTIVE), settings)


def cancel_schedule(session: Session, schedule: Schedule) -> Schedule:
    """DELETE: an active schedule is cancelled (never fires again; shown `cancelled`),
    one that was done stays done; either keeps its firings and shows `cancelled_at`. A
    second DELETE changes nothing."""
    session.refresh(schedule, with_for_update=True)
    now = utcnow()
    if schedule.status == ScheduleStatus.ACTIVE:
        schedule.status, schedule.next_run_at = ScheduleStatus.CANCELLED, None
    schedule.cancelled_at = schedule.cancelled_at or now
    session.flush()
    return schedule


def firings(session: Session, schedule_id: uuid.UUID,
            limit: int = RECENT_FIRINGS) -> list[ScheduleFiring]:
    return list(session.execute(
        select(ScheduleFiring).where(ScheduleFiring.schedule_id == schedule_id)
        .order_by(ScheduleFiring.fire_at.desc()).limit(limit)).scalars())


STATUS_STORED = {shown: stored for stored, shown in SCHEDULE_SHOWN.items()}
"""The API's status → the stored one, where they differ (a one-off that fired is stored
`completed`, shown `done`: `agentq.loop.states.SCHEDULE_SHOWN`)."""


def last_jobs(session: Session, schedule_ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
    """Each schedule's latest firing's job (schedules that never fired are absent)."""
    if not schedule_ids:
        return {}
    latest = (select(ScheduleFiring.schedule_id, func.max(ScheduleFiring.fire_at).label("at"))
              .where(ScheduleFiring.schedule_id.in_(schedule_ids))
              .group_by(ScheduleFiring.schedule_id).subquery())
    rows = session.execute(select(ScheduleFiring.schedule_id, ScheduleFiring.job_id).join(
        latest, (ScheduleFiring.schedule_id == latest.c.schedule_id)
        & (ScheduleFiring.fire_at == latest.c.at))).all()
    return {schedule_id: job_id for schedule_id, job_id in rows if job_id is not None}


def schedule_object(schedule: Schedule, recent: list[ScheduleFiring] | None = None,
                    last_job_id: uuid.UUID | None = None) -> dict:
    """The schedule as the API shows it (API.md 1.1: id, conversation_id, content,
    next_run_at, cron, status, runs, last_job_id; and more). `recent` (newest first) adds
    `firings` and, without `last_job_id`, gives it."""
    def iso(value):
        return value.isoformat() if value else None
    if last_job_id is None and recent:
        last_job_id = recent[0].job_id
    body = {"id": str(schedule.id), "conversation_id": str(schedule.conversation_id),
            "content": schedule.content, "kind": schedule.kind, "run_at": iso(schedule.run_at),
            "cron": schedule.cron, "timezone": schedule.timezone,
            "next_run_at": iso(schedule.next_run_at),
            "status": SCHEDULE_SHOWN.get(schedule.status, schedule.status),
            "runs": schedule.fire_count,
            "last_job_id": str(last_job_id) if last_job_id else None,
            "created_by": schedule.created_by,
            "last_fired_at": iso(schedule.last_fired_at),
            "created_at": iso(schedule.created_at), "cancelled_at": iso(schedule.cancelled_at),
            "metadata": schedule.meta or {}}
    if recent is not None:
        body["firings"] = [{"fire_at": iso(f.fire_at), "job_id": str(f.job_id) if f.job_id
                            else None, "missed": f.missed, "created_at": iso(f.created_at)}
                           for f in recent]
    return body


# --- firing ---------------------------------------------------------------------------------

class _NothingToFire(Exception):
    """Raised inside a firing's unit of work to roll it back: another beat has the
    schedule, it was cancelled, or this tick has a firing already."""


def fire_due(settings: Settings, sessions: Callable[[], Session],
             now: Callable[[], datetime] = utcnow, batch: int = FIRE_BATCH,
             max_rounds: int = 1000) -> int:
    """Fire every schedule due now, each in a unit of work of its own (so that a firing
    holds its schedule, conversation and job rows only briefly, taken in the order a
    submit takes them; its job's first step goes out after its commit). Returns the
    firings made."""
    total = 0
    for _ in range(max_rounds):
        with sessions() as session:
            due = list(session.execute(
                select(Schedule.id).where(Schedule.status == ScheduleStatus.ACTIVE,
                                          Schedule.next_run_at <= now())
                .order_by(Schedule.next_run_at).limit(batch)).scalars())
        for schedule_id in due:
            try:
                # losing this commit in a database crash loses the firing, its job and the
                # advance together: the tick is still due after recovery and fires then,
                # once. So the transaction need not wait for its disk flush.
                with UnitOfWork(sessions, durable=False) as uow:
                    fired = _fire_one(uow, settings, schedule_id, now())
            except _NothingToFire:
                continue
            except (NotFound, Conflict, OperationalError):
                # a deadlock, a conversation that changed hands too often: nothing was
                # written; the schedule stays due and the next tick tries again
                log.warning("schedule firing rolled back", exc_info=True,
                            extra={"schedule_id": str(schedule_id)})
                continue
            total += int(fired)
        if len(due) < batch:
            return total
    return total


def _fire_one(uow: UnitOfWork, settings: Settings, schedule_id: uuid.UUID,
              now: datetime) -> bool:
    """Claim the schedule, make its continue job and the firing row, advance it: one
    unit of work (`_NothingToFire` rolls it back). False: not fired, but cancelled (its
    key is revoked)."""
    from agentq.loop.submit import Submission, submit
    session = uow.session
    claimed = session.execute(
        select(Schedule, ApiKey.revoked_at)
        .outerjoin(ApiKey, ApiKey.id == Schedule.api_key_id)
        .where(Schedule.id == schedule_id, Schedule.status == ScheduleStatus.ACTIVE,
               Schedule.next_run_at <= now)
        .with_for_update(of=Schedule, skip_locked=True)).one_or_none()
    if claimed is None:
        raise _NothingToFire
    schedule, key_revoked_at = claimed
    if key_revoked_at is not None:
        log.info("schedule of a revoked key cancelled", extra={"schedule_id": str(schedule.id)})
        schedule.status, schedule.next_run_at = ScheduleStatus.CANCELLED, None
        schedule.cancelled_at = schedule.cancelled_at or now
        return False
    due = schedule.next_run_at
    assert due is not None, "claimed by next_run_at <= now"
    upcoming: datetime | None
    if schedule.kind == "cron":
        assert schedule.cron is not None, "a cron schedule has its expression (timing)"
        fire_at, missed, upcoming = latest_due(schedule.cron, schedule.timezone, due, now)
    else:
        fire_at, missed, upcoming = due, 0, None
    submitted = submit(uow, settings, Submission(
        incoming=None, conversation_id=schedule.conversation_id, content=schedule.content,
        metadata={**(schedule.meta or {}), "schedule_id": str(schedule.id),
                  "scheduled_for": fire_at.isoformat()},
        callback_url=schedule.callback_url, on_busy="queue",
        api_key_id=schedule.api_key_id, tenant_id=schedule.tenant_id))
    insert = (pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert)
    made = session.execute(
        insert(ScheduleFiring).values(id=new_id(), schedule_id=schedule.id,
                                      fire_at=fire_at, job_id=submitted.job.id,
                                      missed=missed, created_at=utcnow())
        .on_conflict_do_nothing(index_elements=["schedule_id", "fire_at"])
        .returning(ScheduleFiring.id)).first()
    if made is None:
        log.info("schedule tick fired already", extra={"schedule_id": str(schedule.id)})
        raise _NothingToFire
    schedule.next_run_at = upcoming
    if upcoming is None:
        schedule.status = ScheduleStatus.COMPLETED
    schedule.fire_count += 1
    schedule.last_fired_at = now
    return True


def due_count(session: Session, now: datetime | None = None) -> int:
    return session.execute(select(func.count()).select_from(Schedule).where(
        Schedule.status == ScheduleStatus.ACTIVE,
        Schedule.next_run_at <= (now or utcnow()))).scalar_one()

