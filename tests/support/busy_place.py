"""One key's message to the place where another key's job runs, for the boundary tests
(another tenant's key, tests/security/test_tenants.py; another key of the same tenant,
tests/security/test_tenant_admins.py): the writer gets a job and a conversation of its
own, and the running job goes on untouched."""
from __future__ import annotations

import contextlib
import threading
import uuid
from dataclasses import dataclass
from typing import Iterator

from sqlalchemy import func, select

from agentq.models import Job, JobInput
from agentq.testing.scripted_llm import text
from tests.support.api import Client, uid, wait_until


def count(stack, model, *where) -> int:
    with stack.sessions()() as session:
        return session.execute(select(func.count()).select_from(model).where(*where)
                               ).scalar_one()


@dataclass(frozen=True)
class Place:
    job: dict
    """The running job, as its POST answered."""
    user: str
    channel: str
    name: str
    """Whose it is, in its question ("<name>'s secret question") and answer."""


@contextlib.contextmanager
def busy_place(stack, holder: Client, script, name: str) -> Iterator[Place]:
    """A job of `holder` running at a new place (user and channel), its model call held
    while the block runs. After the block it must still be running; then it is let go and
    must end as if nobody else had written there: its own answer, not cancelled, not
    steered, no input of anyone's, the only job and the only messages of its conversation."""
    user, channel = uid("u"), uid("c")
    release = threading.Event()
    marker = script([text(f"{name}'s answer", hold=release)])
    question = f"{marker} {name}'s secret question"
    job = holder.submit(question, user=user, channel=channel)
    try:
        wait_until(lambda: holder.get(f"/v1/jobs/{job['id']}").json()["status"] == "running",
                   what=f"{name}'s job running")
        yield Place(job, user, channel, name)
        assert holder.get(f"/v1/jobs/{job['id']}").json()["status"] == "running"  # held
    finally:
        release.set()
    ended = holder.wait(job["id"])
    assert ended["status"] == "completed" and ended["response"]["content"] == f"{name}'s answer"
    types = [e["type"] for e in holder.events(job["id"])]
    assert "cancel_requested" not in types and "steering_queued" not in types
    assert count(stack, JobInput, JobInput.job_id == uuid.UUID(job["id"])) == 0
    assert count(stack, Job, Job.conversation_id == uuid.UUID(job["conversation_id"])) == 1
    history = holder.get(f"/v1/conversations/{job['conversation_id']}/messages").json()
    assert [m["content"] for m in history["data"]] == [question, f"{name}'s answer"]


def write_there(writer: Client, place: Place, script, on_busy: str, name: str) -> dict:
    """`writer` writes as the same platform user at the busy place, with `on_busy`: it
    gets a job of its own in a conversation of its own, answered without a word of the
    running job's. Returns that job as its POST answered."""
    def never_sees_the_holder(request):
        assert f"{place.name}'s secret" not in str(request["messages"])
    marker = script([text(f"{name}'s answer", check=never_sees_the_holder)])
    response = writer.post("/v1/messages", json={
        "platform": "api", "platform_user_id": place.user,
        "platform_channel_id": place.channel, "content": f"{marker} {name}'s question",
        "on_busy": on_busy})
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["id"] != place.job["id"] and place.job["id"] not in response.text
    assert job["conversation_id"] != place.job["conversation_id"]
    assert writer.wait(job["id"])["response"]["content"] == f"{name}'s answer"
    return job
