"""Holding an answer until a job ends (`?wait=S`), woken by the job's `job_end` event rather
than by polling; the database is read once at the start and once at the end, plus a slow
safety re-check in case a notification was lost."""
from __future__ import annotations

import time
import uuid

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from agentq.loop.states import ENDED
from agentq.models import Job
from agentq.notify import Hub

RECHECK_S = 2.0


def _ended(sessions: sessionmaker, job_id: uuid.UUID) -> bool:
    with sessions() as session:
        status = session.execute(select(Job.status).where(Job.id == job_id)).scalar()
    return status in ENDED


def wait_for_end(sessions: sessionmaker, hub: Hub, job_id: uuid.UUID, timeout_s: float) -> bool:
    """True once the job has ended, False when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    with hub.subscribe(str(job_id)) as sub:
        if _ended(sessions, job_id):
            return True
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            events = sub.get(min(left, RECHECK_S))
            if any(e.get("type") == "job_end" for e in events):
                return True
            if not events and _ended(sessions, job_id):
                return True
