"""Per-job limits (seed 001) through the API: each ends its job with its own finish reason,
the "[Agent stopped: <reason>]" message in the conversation and a `limit_reached` event."""
from __future__ import annotations

import pytest

from agentq.testing.scripted_llm import call, tool_calls
from tests.support.api import uid

pytestmark = pytest.mark.integration


def _loop(n: int, **kw):
    return [tool_calls(call("math.evaluate", {"expression": f"{i}+1"}), content=f"step {i}",
                       **kw) for i in range(n)]


def _stopped(client, job: dict, reason: str) -> None:
    assert (job["status"], job["finish_reason"]) == ("completed", reason), job
    events = client.events(job["id"])
    reached = [e["data"] for e in events if e["type"] == "limit_reached"]
    assert len(reached) == 1 and reached[0]["reason"] == reason
    kinds = [e["type"] for e in events]
    assert kinds.index("limit_reached") < kinds.index("job_end")
    messages = client.get(f"/v1/conversations/{job['conversation_id']}/messages").json()["data"]
    assert messages[-1]["role"] == "user"
    assert messages[-1]["content"] == f"[Agent stopped: {reason}]"


def test_max_iterations_of_a_request_is_below_the_settings(client, script):
    marker = script(_loop(3))
    job = client.wait(client.submit(f"{marker} loop", limits={"max_iterations": 3})["id"])
    _stopped(client, job, "max_iterations")
    assert job["iterations"] == 3
    assert job["limits"] == {"max_iterations": 3}
    assert job["response"]["content"] == "step 2"


def test_max_iterations_above_the_settings_is_capped_by_them(client, script):
    marker = script(_loop(10))  # the test stack's AGENTQ_MAX_ITERATIONS is 10
    job = client.wait(client.submit(f"{marker} loop", limits={"max_iterations": 50})["id"])
    _stopped(client, job, "max_iterations")
    assert job["iterations"] == 10


def test_max_tokens_ends_the_job_once_used(client, script):
    # each call uses 10 + 5 tokens: after three (45) a limit of 40 is reached
    marker = script(_loop(3))
    job = client.wait(client.submit(f"{marker} loop", limits={"max_tokens": 40})["id"])
    _stopped(client, job, "max_tokens")
    assert job["iterations"] == 3
    assert job["usage"]["input_tokens"] + job["usage"]["output_tokens"] == 45


def test_max_seconds_ends_the_job_at_the_next_step(client, script):
    # the first model call alone takes longer than the job may run
    marker = script(_loop(1, delay_s=1.5))
    job = client.wait(client.submit(f"{marker} loop", limits={"max_seconds": 1})["id"])
    _stopped(client, job, "max_time")
    assert job["iterations"] == 1


@pytest.mark.parametrize("limits", [
    {"max_iterations": 0}, {"max_iterations": 201}, {"max_tokens": -5},
    {"max_seconds": "soon"}, {"max_seconds": 0}, {"max_turns": 3}, "ten", [3],
])
def test_bad_limits_are_refused_in_the_error_shape(client, limits):
    body = {"platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
            "content": "hello", "limits": limits}
    response = client.post("/v1/messages", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert "limits" in error["details"]["fields"]
