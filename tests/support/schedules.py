"""Schedules through the API, for the tests that make them (test_schedules.py,
test_users_saw_api.py): a conversation to schedule in, a schedule, its first firings, and a
sentinel that shows beat has run since."""
from __future__ import annotations

from agentq.testing.scripted_llm import text
from tests.support.api import uid, wait_until


def conversation_of(client, llm, key: str) -> str:
    """A conversation (one finished job) whose history carries `script:<key>`."""
    marker = llm.script(key, [text("ok")])
    job = client.submit(f"{marker} start")
    assert client.wait(job["id"])["status"] == "completed"
    return job["conversation_id"]


def schedule(client, conversation_id: str, content: str, **when) -> dict:
    response = client.post("/v1/schedules", json={"conversation_id": conversation_id,
                                                  "content": content, **when})
    assert response.status_code == 201, response.text
    return response.json()


def sentinel(client, llm) -> None:
    """A schedule made now, on a conversation of its own, has fired and its job ended:
    beat has run since anything made before this call became due."""
    key = uid("sentinel").replace("-", "_")
    conversation_id = conversation_of(client, llm, key)
    llm.script(key, [text("sentinel")])
    body = schedule(client, conversation_id, f"script:{key} sentinel", delay_s=0)
    client.wait(fired(client, body["id"])["firings"][0]["job_id"])
    llm.assert_done(key)


def fired(client, schedule_id: str, at_least: int = 1) -> dict:
    def done():
        body = client.get(f"/v1/schedules/{schedule_id}").json()
        return body if body["runs"] >= at_least else None
    return wait_until(done, what=f"schedule {schedule_id} fired {at_least}x")
