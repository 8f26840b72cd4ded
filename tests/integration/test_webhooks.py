"""Webhooks through the whole stack: a job with a callback_url ends, the `webhooks` worker
POSTs the signed event to a receiver running in this test on loopback, retries it, and the
API lists and redelivers it. The stack allows private callbacks and retries after 0.5 s."""
from __future__ import annotations

import time

import pytest

import api
from agentq import config
from agentq.config import Settings
from agentq.testing.scripted_llm import text
from tests.support.webhook_receiver import DELIVERY_TIMEOUT_S

pytestmark = pytest.mark.integration


def deliveries(client, job_id: str) -> list[dict]:
    response = client.get(f"/v1/jobs/{job_id}/deliveries")
    assert response.status_code == 200, response.text
    return response.json()["data"]


def wait_settled(client, job_id: str, count: int) -> list[dict]:
    """The job's delivery rows once `count` exist and none is pending."""
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = deliveries(client, job_id)
        if len(rows) >= count and all(r["status"] != "pending" for r in rows):
            return rows
        time.sleep(0.1)
    raise AssertionError(f"deliveries did not settle: {rows}")


def ended_job_with_callback(client, script, url: str) -> dict:
    marker = script([text("Done.")])
    job = client.wait(client.submit(f"{marker} hello", callback_url=url)["id"])
    assert job["status"] == "completed", job
    return job


def test_a_good_delivery_is_signed_and_carries_the_job(client, script, receiver):
    # given a receiver that answers 200
    url = receiver.url("/good")
    # when a job with that callback_url completes
    job = ended_job_with_callback(client, script, url)
    # then one signed request arrives with the job object, and one succeeded delivery row
    [request] = receiver.wait_for("/good", 1)
    assert request["verified"] is True
    assert request["payload"]["type"] == "job.completed"
    assert request["payload"]["timestamp"] == job["finished_at"]
    assert request["payload"]["data"] == job
    [row] = wait_settled(client, job["id"], 1)
    assert row["status"] == "succeeded" and row["status_code"] == 200
    assert row["attempt"] == 1 and row["event_id"] == request["webhook_id"]
    assert row["event_type"] == "job.completed" and row["url"] == url
    assert isinstance(row["latency_ms"], int) and row["error"] is None
    assert set(row) == {"id", "event_id", "event_type", "url", "attempt", "status",
                        "status_code", "latency_ms", "error", "created_at",
                        "next_attempt_at"}


def test_failures_are_retried_with_the_same_webhook_id(client, script, receiver):
    # given a receiver failing twice, then succeeding
    url = receiver.url("/flaky", 500, 500)
    job = ended_job_with_callback(client, script, url)
    # then three verified requests, one webhook-id, the same body each time
    requests = receiver.wait_for("/flaky", 3)
    assert [r["status"] for r in requests] == [500, 500, 200]
    assert all(r["verified"] for r in requests)
    assert len({r["webhook_id"] for r in requests}) == 1
    assert len({r["body"] for r in requests}) == 1
    # and three rows, oldest first
    rows = wait_settled(client, job["id"], 3)
    assert [r["status"] for r in rows] == ["failed", "failed", "succeeded"]
    assert [r["attempt"] for r in rows] == [1, 2, 3]
    assert [r["status_code"] for r in rows] == [500, 500, 200]
    assert {r["event_id"] for r in rows} == {requests[0]["webhook_id"]}


def test_410_gives_up_without_retrying(client, script, receiver):
    url = receiver.url("/gone", 410)
    job = ended_job_with_callback(client, script, url)
    receiver.wait_for("/gone", 1)
    [row] = wait_settled(client, job["id"], 1)
    assert row["status"] == "gave_up" and row["status_code"] == 410
    # and no row is pending, so no attempt can follow (one is made only for a pending row)
    assert len(receiver.received("/gone")) == 1


def test_the_retry_schedule_runs_out(client, script, receiver):
    # the stack's schedule is 0.5,0.5,0.5: one attempt and three retries
    url = receiver.url("/down", 503, 503, 503, 503, 503)
    job = ended_job_with_callback(client, script, url)
    receiver.wait_for("/down", 4)
    rows = wait_settled(client, job["id"], 4)
    assert [r["status"] for r in rows] == ["failed", "failed", "failed", "gave_up"]
    # and none is pending, so no attempt can follow (one is made only for a pending row)
    assert len(rows) == len(receiver.received("/down")) == 4


def test_redeliver_sends_the_event_again(client, script, receiver):
    url = receiver.url("/again")
    job = ended_job_with_callback(client, script, url)
    [first] = receiver.wait_for("/again", 1)
    wait_settled(client, job["id"], 1)
    # when the event is redelivered
    response = client.post(f"/v1/jobs/{job['id']}/deliveries/redeliver")
    assert response.status_code == 202, response.text
    row = response.json()
    assert row["status"] == "pending" and row["attempt"] == 2
    assert row["event_id"] == first["webhook_id"]
    # then it arrives again: same webhook-id, same body
    second = receiver.wait_for("/again", 2)[1]
    assert second["verified"] and second["webhook_id"] == first["webhook_id"]
    assert second["body"] == first["body"]
    rows = wait_settled(client, job["id"], 2)
    assert [(r["attempt"], r["status"]) for r in rows] == [(1, "succeeded"), (2, "succeeded")]
    assert rows[1]["id"] == row["id"]


def test_redeliver_needs_an_ended_job_with_a_callback(client, script):
    marker = script([text("No hook.")])
    job = client.wait(client.submit(f"{marker} hi")["id"])
    response = client.post(f"/v1/jobs/{job['id']}/deliveries/redeliver")
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "conflict"
    assert deliveries(client, job["id"]) == []
    missing = client.get("/v1/jobs/00000000-0000-0000-0000-000000000000/deliveries")
    assert missing.status_code == 404


@pytest.fixture()
def strict_app(stack):
    """A second API in this process that refuses private callbacks."""
    before = config._settings
    app = api.create_app(Settings.from_env({**stack.env, "AGENTQ_WEBHOOK_ALLOW_PRIVATE": "0"}))
    try:
        yield app
    finally:
        config.set_settings(before)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/hook", "http://localhost/hook",
                                 "http://[::1]/hook", "http://169.254.169.254/latest",
                                 "ftp://example.com/hook"])
def test_a_private_callback_is_refused_at_submit(stack, strict_app, url):
    key = stack.create_key("strict", admin=False)
    answer = strict_app.test_client().post(
        "/v1/messages", headers={"Authorization": f"Bearer {key}"},
        json={"platform": "api", "platform_user_id": "u-strict", "platform_channel_id": "c",
              "content": "hi", "callback_url": url})
    assert answer.status_code == 422, answer.get_data(as_text=True)
    error = answer.get_json()["error"]
    assert error["code"] == "validation_error"
    assert list(error["details"]["fields"]) == ["callback_url"]
