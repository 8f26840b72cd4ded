"""The spine through HTTP: real API, real workers on their queues, Postgres, Redis, and the
real openai SDK against a scripted model server."""
from __future__ import annotations

import json
import time
import uuid

import pytest
import requests
from sqlalchemy import func, select

from agentq.models import TokenLog, ToolCall, User, UserPlatformLink
from agentq.testing.scripted_llm import call, error, text, tool_calls
from tests.support.api import assert_one_tool_turn_told, uid
from tests.support.stack import purge_queues, queue_depth

pytestmark = pytest.mark.integration


def tool_names(job):
    return [c["name"] for c in job["response"]["metadata"]["tool_calls"]]


def test_plain_answer(client, script):
    # given a model that answers in one turn
    marker = script([text("Hello there!", input_tokens=12, output_tokens=4)])
    # when a message is submitted
    submitted = client.submit(f"{marker} hi")
    # then the API answered 202 with a queued job, and the job completes with the answer
    assert submitted["status"] in ("queued", "running")
    job = client.wait(submitted["id"])
    assert job["status"] == "completed" and job["finish_reason"] == "end_turn"
    assert job["response"]["content"] == "Hello there!"
    assert job["usage"]["input_tokens"] == 12 and job["usage"]["output_tokens"] == 4
    assert job["iterations"] == 1
    history = client.get(f"/v1/conversations/{job['conversation_id']}/messages").json()
    assert [m["role"] for m in history["data"]] == ["user", "assistant"]


def test_one_tool_call_then_answer(client, script, llm):
    def sees_result(request):
        tool_msgs = [m for m in request["messages"] if m["role"] == "tool"]
        assert json.loads(tool_msgs[-1]["content"]) == {"expression": "6*7", "result": 42}
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("It is 42.", check=sees_result)])
    job = client.wait(client.submit(f"{marker} what is 6*7?")["id"])
    assert job["status"] == "completed", job
    assert job["response"]["content"] == "It is 42."
    assert job["response"]["metadata"]["tool_calls"][0]["name"] == "math.evaluate"
    assert job["response"]["metadata"]["tool_calls"][0]["success"] is True
    assert_one_tool_turn_told(client, job)


def test_two_parallel_calls_on_their_module_queues(client, script, stack):
    marker = script([tool_calls(call("math.evaluate", {"expression": "1+1"}),
                                call("time.now", {"timezone": "UTC"})),
                     text("done")])
    job = client.wait(client.submit(f"{marker} both")["id"])
    assert job["status"] == "completed"
    assert tool_names(job) == ["math.evaluate", "time.now"]
    with stack.sessions()() as s:
        queues = s.execute(select(ToolCall.name, ToolCall.queue)
                           .where(ToolCall.job_id == uuid.UUID(job["id"]))).all()
    assert dict(queues) == {"math.evaluate": "tools.math", "time.now": "tools.time"}


def test_slow_module_runs_on_its_own_queue(client, script, stack):
    user = uid("u")
    assert stack.agentq("users", "set", "api", user, "--level", "user").returncode == 0
    marker = script([tool_calls(call("code.run_python", {"code": "print(6*7)"})),
                     text("printed")])
    job = client.wait(client.submit(f"{marker} run it", user=user)["id"])
    assert job["status"] == "completed", job
    with stack.sessions()() as s:
        row = s.execute(select(ToolCall).where(ToolCall.job_id == uuid.UUID(job["id"]))
                        ).scalar_one()
    assert row.queue == "tools.slow.code"
    assert row.result["ok"] and row.result["result"]["stdout"].strip() == "42"


@pytest.mark.parametrize("tool_call, code", [
    (call("flaky.always_fail", {}), "tool_error"),
    (call("flaky.sleep", {"seconds": 3}), "tool_timeout"),
    (call("math.evaluate", {"expr": "1"}), "invalid_arguments"),
    (call("math.evaluate", "{not json"), "invalid_arguments"),
    (call("nosuch.tool", {}), "tool_not_found"),
    (call("flaky.admin_only", {}), "tool_not_found"),
])
def test_tool_errors_go_back_to_the_model_as_json(client, script, tool_call, code):
    def sees_error(request):
        result = json.loads([m for m in request["messages"] if m["role"] == "tool"][-1]
                            ["content"])
        assert result["error"]["code"] == code, result
    marker = script([tool_calls(tool_call), text("sorry", check=sees_error)])
    job = client.wait(client.submit(f"{marker} go")["id"])
    assert job["status"] == "completed", job
    assert job["response"]["metadata"]["tool_calls"][0]["success"] is False


@pytest.mark.parametrize("tool_call, code, shown", [
    (call("nosuch.tool", {"x": 6}), "tool_not_found", {"x": 6}),
    (call("math.evaluate", "{not json"), "invalid_arguments", "{not json"),
])
def test_a_rejected_tool_call_shows_its_arguments(client, script, admin_key, tool_call, code,
                                                  shown):
    # a call rejected before it runs has no tool_execution_start: its end event carries
    # what the model sent, and the dashboard's job page shows it
    marker = script([tool_calls(tool_call), text("sorry")])
    job = client.wait(client.submit(f"{marker} go")["id"])
    [end] = [e for e in client.events(job["id"]) if e["type"] == "tool_execution_end"]
    assert end["data"]["error"] == code
    assert end["data"]["arguments"] == shown
    from api.ui import COOKIE
    page = requests.get(client.url(f"/ui/jobs/{job['id']}"), timeout=30,
                        cookies={COOKIE: admin_key})
    assert page.status_code == 200, page.text
    view = page.text.split("rejected; arguments:", 1)[1].split("</pre>", 1)[0]
    assert ("x" in view and "6" in view) if isinstance(shown, dict) else "{not json" in view


def test_a_failing_tool_is_retried_once(client, script, stack):
    marker = script([tool_calls(call("flaky.fail_once", {})), text("ok")])
    job = client.wait(client.submit(f"{marker} go")["id"])
    assert job["response"]["metadata"]["tool_calls"][0]["success"] is True
    with stack.sessions()() as s:
        row = s.execute(select(ToolCall).where(ToolCall.job_id == uuid.UUID(job["id"]))
                        ).scalar_one()
    assert row.result["attempts"] == 2


def test_iteration_guard(client, script, stack):
    replies = [tool_calls(call("math.evaluate", {"expression": f"{i}+1"}), content=f"step {i}")
               for i in range(10)]
    marker = script(replies)
    job = client.wait(client.submit(f"{marker} loop forever")["id"])
    assert job["status"] == "completed" and job["finish_reason"] == "max_iterations"
    assert job["iterations"] == 10
    assert job["response"]["content"] == "step 9"


def test_budget_exceeded(client, script, stack):
    user = uid("u")
    # given a guest whose 40-token budget the first call uses up
    marker = script([tool_calls(call("math.evaluate", {"expression": "1"}),
                                input_tokens=30, output_tokens=15)])
    assert stack.agentq("users", "set", "api", user, "--budget", "40").returncode == 0
    job = client.wait(client.submit(f"{marker} go", user=user)["id"])
    assert job["status"] == "failed" and job["finish_reason"] == "budget_exceeded"
    assert "budget" in job["response"]["content"]
    with stack.sessions()() as s:
        used = s.execute(select(User.tokens_used_this_month).join(
            UserPlatformLink, UserPlatformLink.user_id == User.id).where(
            UserPlatformLink.platform_user_id == user)).scalar_one()
        logs = s.execute(select(func.count()).select_from(TokenLog).where(
            TokenLog.job_id == uuid.UUID(job["id"]))).scalar_one()
    assert used == 45 and logs == 1


def test_rate_limit_then_success(client, script, llm):
    marker = script([error(429, headers={"retry-after": "0"}), text("after 429")])
    job = client.wait(client.submit(f"{marker} go")["id"])
    assert job["response"]["content"] == "after 429"


def test_fallback_to_the_next_model(client, script, stack):
    marker = script([error(500), error(500), error(500),
                     text("from fallback", expect_model="fallback-model")])
    job = client.wait(client.submit(f"{marker} go")["id"])
    assert job["status"] == "completed"
    with stack.sessions()() as s:
        model = s.execute(select(TokenLog.model).where(TokenLog.job_id == uuid.UUID(job["id"]))
                          ).scalar_one()
    assert model == "fallback-model"


def test_a_thread_is_its_own_conversation_and_history_reaches_the_model(client, script):
    user, channel = uid("u"), uid("c")
    def sees_history(request):
        contents = [m.get("content") for m in request["messages"]]
        assert any("first" in (c or "") for c in contents)
        assert "First answer." in contents
    marker = script([text("First answer."), text("In thread."), text("Second.",
                                                                     check=sees_history)])
    first = client.wait(client.submit(f"{marker} first", user=user, channel=channel)["id"])
    threaded = client.wait(client.submit(f"{marker} in a thread", user=user, channel=channel,
                                         platform_thread_id="t1")["id"])
    second = client.wait(client.submit(f"{marker} second", user=user, channel=channel)["id"])
    assert threaded["conversation_id"] != first["conversation_id"]
    assert second["conversation_id"] == first["conversation_id"]


def test_a_duplicated_step_message_does_nothing_twice(client, script, stack, llm):
    marker = script([text("only once")])
    job = client.wait(client.submit(f"{marker} go")["id"])
    # when the first step's message is delivered again
    from tasks.app import make_celery
    app = make_celery(stack.settings())  # the stack's broker and backend, either broker
    duplicates = [
        app.send_task("orchestrator.step", (job["id"], 0), {"cause": "start"},
                      queue="orchestrator"),
        app.send_task("orchestrator.step", (job["id"], 1), {"cause": "continue"},
                      queue="orchestrator")]
    # the worker ran both (their results are in the backend, no exception)...
    assert [d.get(timeout=30) for d in duplicates] == [None, None]
    app.close()
    # then no second model call was made (script: exhausted check) and nothing changed
    again = client.get(f"/v1/jobs/{job['id']}").json()
    assert again == job
    with stack.sessions()() as s:
        assert s.execute(select(func.count()).select_from(TokenLog).where(
            TokenLog.job_id == uuid.UUID(job["id"]))).scalar_one() == 1


def wait_for_replies(broadcast, timeout_s: float = 120) -> list[str]:
    """The orchestrator workers that answered `broadcast`, retried until one does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        names = [name for reply in broadcast() or [] for name in reply
                 if name.startswith("orchestrator@")]
        if names:
            return names
    raise AssertionError("no orchestrator worker answered")


def wait_until_true(predicate, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


def test_a_lost_step_message_is_redriven_by_the_sweeper(client, script, stack):
    marker = script([text("recovered")])
    broker = stack.env["AGENTQ_BROKER_URL"]
    # given the orchestrator is not consuming, a submitted job's step message is deleted
    from tasks.app import make_celery
    app = make_celery(stack.settings())
    # waits for the orchestrator's own answer (a loaded machine may answer a broadcast late)
    orchestrators = wait_for_replies(
        lambda: app.control.cancel_consumer("orchestrator", reply=True, timeout=5))
    try:
        submitted = client.submit(f"{marker} lose me")
        wait_until_true(lambda: queue_depth(broker, "orchestrator") >= 1)
        purge_queues(broker, ["orchestrator"])
    finally:
        app.control.add_consumer("orchestrator", reply=True, timeout=5,
                                 destination=orchestrators)
        app.close()
    # then the sweeper re-drives it from Postgres and it completes
    job = client.wait(submitted["id"], timeout_s=120)
    assert job["status"] == "completed" and job["response"]["content"] == "recovered"
    assert "job_redriven" in [e["type"] for e in client.events(job["id"])]


def test_auth_and_validation(client, stack):
    anon = client.http.__class__()
    assert anon.post(client.url("/v1/messages"), json={}).status_code == 401
    bad = client.post("/v1/messages", json={"platform": "api", "platform_user_id": "u",
                                            "platform_channel_id": "c", "content": "  "})
    assert bad.status_code == 422
    assert "content" in bad.json()["error"]["details"]["fields"]
    unknown = client.post("/v1/messages", json={"platform": "api", "platform_user_id": "u",
                                                "platform_channel_id": "c", "content": "x",
                                                "colour": "red"})
    assert unknown.status_code == 422 and "colour" in unknown.json()["error"]["message"]
    assert client.get(f"/v1/jobs/{uuid.uuid4()}").status_code == 404
    ready = client.get("/health/ready").json()
    assert ready["status"] == "ok" and isinstance(ready["backlog"]["unclaimed_jobs"], int)


def test_documents_become_response_files(client, script):
    marker = script([tool_calls(call("files.create_document",
                                     {"title": "report", "content": "# Hi"})),
                     text("Saved.")])
    job = client.wait(client.submit(f"{marker} save")["id"])
    files = job["response"]["files"]
    assert files and files[0]["filename"] == "report.md"
    body = client.get(files[0]["url"].replace(client.stack.base, ""))
    assert body.status_code == 200 and body.text == "# Hi"
