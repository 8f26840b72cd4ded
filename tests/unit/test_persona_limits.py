"""A persona's limits apply to its jobs; a request's smaller limit wins over them, and the
settings cap both (the step, driven without Celery as in test_step)."""
from __future__ import annotations

import uuid

from agentq.db import session_scope
from agentq.loop.identity import Incoming
from agentq.loop.submit import Submission, create_job
from agentq.loop.uow import UnitOfWork
from agentq.models import Message, Persona
from agentq.tenants import DEFAULT_TENANT_ID
from agentq.testing.harness import calls


def _persona(h, limits: dict) -> None:
    with session_scope(h.settings) as session:
        from agentq.models import Tenant
        if session.get(Tenant, DEFAULT_TENANT_ID) is None:
            session.add(Tenant(id=DEFAULT_TENANT_ID, name="default"))
            session.flush()
        session.add(Persona(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID, name="p",
                            platform="test", is_default=False, limits=limits))


def _submit(h, limits: dict | None = None) -> str:
    with UnitOfWork(h.sessions) as uow:
        job = create_job(uow, h.settings, Submission(
            Incoming("test", "u-1", f"chan-{uuid.uuid4().hex[:6]}"), "loop", limits=limits))
        return str(job.id)


def test_a_personas_limit_applies_and_a_smaller_request_limit_wins(make):
    h = make(forever=calls(("math.evaluate", {"expression": "1+1"})))
    _persona(h, {"max_iterations": 3, "max_tokens": 10_000})
    job_id = _submit(h)
    h.drive(job_id, limit=50)
    job = h.job(job_id)
    assert (job.status, job.finish_reason, job.iteration) == ("completed", "max_iterations", 3)
    job_id = _submit(h, {"max_iterations": 5, "max_tokens": 30})  # 15 tokens a call
    h.drive(job_id, limit=50)
    job = h.job(job_id)
    assert (job.finish_reason, job.iteration) == ("max_tokens", 2)
    last = h.rows(Message, job_id, Message.seq)[-1]
    assert (last.role, last.content) == ("user", "[Agent stopped: max_tokens]")


def test_the_settings_cap_a_personas_limit(make):
    h = make(forever=calls(("math.evaluate", {"expression": "1+1"})),
             AGENTQ_MAX_ITERATIONS="2")
    _persona(h, {"max_iterations": 50})
    job_id = _submit(h, {"max_iterations": 40})
    h.drive(job_id, limit=50)
    assert h.job(job_id).iteration == 2
