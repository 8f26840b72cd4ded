"""Holding an answer until a job ends (`?wait=S`)."""
from __future__ import annotations

import time
import uuid

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from agentq.models import TERMINAL_STATUSES, Job

POLL_FIRST_S = 0.02
POLL_MAX_S = 0.5


def wait_for_end(sessions: sessionmaker, job_id: uuid.UUID, timeout_s: float) -> bool:
    """True once the job has ended, False when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    pause = POLL_FIRST_S
    while True:
        with sessions() as session:
            status = session.execute(select(Job.status).where(Job.id == job_id)).scalar()
        if status in TERMINAL_STATUSES:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, POLL_MAX_S)
