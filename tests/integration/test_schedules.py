"""Schedules through HTTP and real beat processes: a schedule fires once at its time with TWO
beat processes running and across a restart of both, a cron schedule fires on its ticks, a
cancelled one never fires, missed ticks are caught up by firing once for the latest, and a
schedule the model makes with the `scheduler` tool continues its conversation.

Nothing here asserts a duration: each test waits for an outcome (a firing, a job's end)
with a generous timeout. "Never fires again" is shown by a later schedule that did fire."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select, update

from agentq.models import Job, Schedule, ScheduleFiring
from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import Client, uid, wait_until
from tests.support.schedules import conversation_of, fired, schedule, sentinel
from tests.support.stack import ROOT, die_with_parent

pytestmark = pytest.mark.integration
WAIT_S = 60


class Beat:
    """One `agentq beat` process of its own (its own beat schedule file)."""

    def __init__(self, stack, home):
        self.stack, self.home = stack, home
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Beat":
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.home / f"beat-{time.monotonic_ns()}.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen([self.stack.agentq_bin(), "beat"], cwd=ROOT,
                                         env={**self.stack.env, "AGENTQ_HOME": str(self.home)},
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=die_with_parent)
        wait_until(lambda: b" ready." in log.read_bytes() or self.proc.poll() is not None,
                   what="beat ready")
        assert self.proc.poll() is None, log.read_text()[-3000:]
        return self

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def second_beat(stack, tmp_path_factory):
    beat = Beat(stack, tmp_path_factory.mktemp("beat2")).start()
    yield beat
    beat.stop()


def stop_stack_beat(stack) -> None:
    proc = stack.procs["beat"]
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def start_stack_beat(stack) -> None:
    """Start the stack's own beat again, as `Stack.start` did."""
    log = stack.logs["beat"]
    log.write_bytes(b"")
    with log.open("ab") as out:
        stack.procs["beat"] = subprocess.Popen(
            [stack.agentq_bin(), "beat"], cwd=ROOT, env=stack.env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
    wait_until(lambda: b" ready." in log.read_bytes(), what="the stack's beat ready")


def firings(stack, schedule_id: str) -> list[ScheduleFiring]:
    with stack.sessions()() as session:
        return list(session.execute(select(ScheduleFiring).where(
            ScheduleFiring.schedule_id == uuid.UUID(schedule_id))
            .order_by(ScheduleFiring.fire_at)).scalars())


def jobs_of(stack, schedule_id: str) -> list[Job]:
    with stack.sessions()() as session:
        return list(session.execute(select(Job).where(
            Job.meta["schedule_id"].as_string() == schedule_id)).scalars())


def test_a_schedule_fires_once_at_its_time_with_two_beats(stack, client, llm, second_beat):
    key = uid("sch").replace("-", "_")
    conversation_id = conversation_of(client, llm, key)
    llm.script(key, [text(f"later {i}") for i in range(12)])
    run_at = (datetime.now(timezone.utc) + timedelta(seconds=2)).isoformat()
    made = [schedule(client, conversation_id, f"script:{key} wake up {i}", run_at=run_at)
            for i in range(12)]
    assert made[0]["status"] == "active" and made[0]["next_run_at"]
    # the contract's object (API.md 1.1), before its first firing
    assert {k: made[0][k] for k in ("conversation_id", "content", "cron", "runs",
                                    "last_job_id")} == {
        "conversation_id": conversation_id, "content": f"script:{key} wake up 0",
        "cron": None, "runs": 0, "last_job_id": None}
    for body in made:
        shown = fired(client, body["id"])
        assert shown["status"] == "done" and shown["next_run_at"] is None
        assert shown["runs"] == 1 and len(shown["firings"]) == 1
        assert shown["last_job_id"] == shown["firings"][0]["job_id"]
        assert datetime.fromisoformat(shown["firings"][0]["fire_at"]) == \
            datetime.fromisoformat(run_at)
        job = client.wait(shown["firings"][0]["job_id"])
        assert job["status"] == "completed" and job["conversation_id"] == conversation_id
        assert job["metadata"]["schedule_id"] == body["id"]
    sentinel(client, llm)  # later ticks of both beats came and went
    for body in made:
        assert len(firings(stack, body["id"])) == 1
        assert len(jobs_of(stack, body["id"])) == 1
    llm.assert_done(key)


def test_schedules_made_while_beat_is_down_fire_once_after_it_restarts(
        stack, client, llm, second_beat):
    key = uid("rst").replace("-", "_")
    conversation_id = conversation_of(client, llm, key)
    second_beat.stop()
    stop_stack_beat(stack)  # no beat at all now
    llm.script(key, [text(f"r{i}") for i in range(3)])
    made = [schedule(client, conversation_id, f"script:{key} r{i}", delay_s=0.5)
            for i in range(3)]
    start_stack_beat(stack)
    second_beat.start()  # both from fresh processes
    for body in made:
        client.wait(fired(client, body["id"])["firings"][0]["job_id"])
    sentinel(client, llm)
    assert [len(firings(stack, b["id"])) for b in made] == [1, 1, 1]
    assert [len(jobs_of(stack, b["id"])) for b in made] == [1, 1, 1]
    llm.assert_done(key)


def test_a_cron_schedule_fires_on_its_ticks_and_never_after_cancel(stack, client, llm):
    key = uid("cron").replace("-", "_")
    conversation_id = conversation_of(client, llm, key)
    llm.script(key, [text(f"tick {i}") for i in range(30)])
    body = schedule(client, conversation_id, f"script:{key} tick", cron="* * * * * */1",
                    timezone="Europe/Berlin")
    assert body["kind"] == "cron" and body["timezone"] == "Europe/Berlin"
    shown = fired(client, body["id"], at_least=3)
    assert shown["status"] == "active" and shown["last_job_id"] in [
        f["job_id"] for f in shown["firings"]]
    listed = client.get("/v1/schedules", params={"conversation_id": conversation_id,
                                                 "status": "active"}).json()["data"]
    assert [s["id"] for s in listed] == [body["id"]] and listed[0]["last_job_id"]
    deleted = client.http.delete(client.url(f"/v1/schedules/{body['id']}"), timeout=70)
    assert deleted.status_code == 204, deleted.text
    assert deleted.content == b""
    with stack.sessions()() as session:
        row = session.get(Schedule, uuid.UUID(body["id"]))
        assert row.status == "cancelled" and row.next_run_at is None
        count = row.fire_count
    ticks = [f.fire_at for f in firings(stack, body["id"])]
    assert len(ticks) == count and len(set(ticks)) == count
    assert all(t.microsecond == 0 for t in ticks)  # each firing is a tick of the cron
    for job in jobs_of(stack, body["id"]):
        assert client.wait(str(job.id))["status"] == "completed"
        assert str(job.conversation_id) == conversation_id
    sentinel(client, llm)  # a one-off made after the cancel fired; the cron one has not
    assert len(firings(stack, body["id"])) == count
    after = client.get(f"/v1/schedules/{body['id']}").json()  # readable, cancelled
    assert (after["status"], after["runs"], after["next_run_at"]) == ("cancelled", count, None)
    messages = client.get(f"/v1/conversations/{conversation_id}/messages",
                          params={"limit": 1000}).json()["data"]
    assert sum(1 for m in messages if m["role"] == "assistant"
               and m["content"].startswith("tick ")) == count


def test_a_cancelled_schedule_never_fires(stack, client, llm):
    key = uid("cnl").replace("-", "_")
    conversation_id = conversation_of(client, llm, key)
    doomed = schedule(client, conversation_id, f"script:{key} never", delay_s=2)
    gone = client.http.delete(client.url(f"/v1/schedules/{doomed['id']}"), timeout=70)
    assert gone.status_code == 204 and gone.content == b""
    assert client.http.delete(client.url(f"/v1/schedules/{doomed['id']}"),
                              timeout=70).status_code == 204  # again: nothing changes
    listed = client.get("/v1/schedules", params={"conversation_id": conversation_id,
                                                 "status": "active"}).json()
    assert doomed["id"] not in [s["id"] for s in listed["data"]]
    time_due = datetime.fromisoformat(doomed["next_run_at"])
    wait_until(lambda: datetime.now(timezone.utc) > time_due, what="past its run_at")
    sentinel(client, llm)
    assert firings(stack, doomed["id"]) == [] and jobs_of(stack, doomed["id"]) == []


def test_missed_cron_ticks_fire_once_for_the_latest(stack, client, llm):
    """Beat was away for years: a yearly schedule fires once, for this year's tick."""
    key = uid("miss").replace("-", "_")
    conversation_id = conversation_of(client, llm, key)
    llm.script(key, [text("caught up")])
    body = schedule(client, conversation_id, f"script:{key} yearly", cron="0 0 1 1 *")
    with stack.sessions()() as session, session.begin():
        session.execute(update(Schedule).where(Schedule.id == uuid.UUID(body["id"])).values(
            next_run_at=datetime(2020, 1, 1, tzinfo=timezone.utc)))
    shown = fired(client, body["id"])
    (firing,) = shown["firings"]
    this_year = datetime(datetime.now(timezone.utc).year, 1, 1, tzinfo=timezone.utc)
    assert datetime.fromisoformat(firing["fire_at"]) == this_year
    assert firing["missed"] == this_year.year - 2020
    assert datetime.fromisoformat(shown["next_run_at"]) == this_year.replace(
        year=this_year.year + 1)
    assert shown["status"] == "active"
    assert client.wait(firing["job_id"])["status"] == "completed"


@pytest.mark.parametrize("body,field", [
    ({"content": "x"}, "run_at"),
    ({"content": "x", "delay_s": 1, "cron": "* * * * *"}, "cron"),
    ({"content": "x", "cron": "not a cron"}, "cron"),
    ({"content": "x", "cron": "61 * * * *"}, "cron"),
    ({"content": "x", "cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
    ({"content": "x", "delay_s": 5, "timezone": "UTC"}, "timezone"),
    ({"content": "x", "delay_s": -1}, "delay_s"),
    ({"content": "x", "run_at": "2030-01-01T00:00:00"}, "run_at"),
    ({"content": "x", "run_at": "tomorrow"}, "run_at"),
    ({"content": "", "delay_s": 1}, "content"),
    ({"content": "x", "delay_s": 1, "extra": True}, "extra"),
])
def test_bad_schedules_are_422_naming_the_field(client, llm, body, field):
    conversation_id = conversation_of(client, llm, uid("bad").replace("-", "_"))
    response = client.post("/v1/schedules", json={"conversation_id": conversation_id, **body})
    assert response.status_code == 422, response.text
    assert field in response.json()["error"]["details"]["fields"]


def test_schedules_of_other_conversations_and_tenants_are_absent(stack, client, llm):
    conversation_id = conversation_of(client, llm, uid("own").replace("-", "_"))
    missing = client.post("/v1/schedules", json={"conversation_id": str(uuid.uuid4()),
                                                 "content": "x", "delay_s": 1})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    other = Client(stack, stack.create_key("sch-other", admin=True,
                                           tenant=stack.create_tenant(uid("sch-t"))))
    assert other.post("/v1/schedules", json={"conversation_id": conversation_id,
                                             "content": "x", "delay_s": 9999}
                      ).status_code == 404
    mine = schedule(client, conversation_id, "x", delay_s=9999)
    assert other.get(f"/v1/schedules/{mine['id']}").status_code == 404
    assert other.http.delete(other.url(f"/v1/schedules/{mine['id']}"),
                             timeout=70).status_code == 404
    assert mine["id"] not in [s["id"] for s in other.get("/v1/schedules").json()["data"]]
    assert client.get("/v1/schedules/not-a-uuid").status_code == 404
    assert client.get("/v1/schedules", params={"status": "nope"}).status_code == 422
    client.http.delete(client.url(f"/v1/schedules/{mine['id']}"), timeout=70)


@pytest.fixture(scope="module")
def scheduling_tenant(stack):
    """A tenant whose default persona enables the scheduler module, with an admin key."""
    name = uid("tool-t")
    tenant_id = stack.create_tenant(name)
    admin = Client(stack, stack.create_key("tool-adm", admin=True, tenant=tenant_id))
    persona = admin.post("/v1/personas", json={
        "name": "Planner", "allowed_modules": ["scheduler", "time"]})
    assert persona.status_code == 201, persona.text
    return {"name": name, "client": admin}


def test_the_model_schedules_a_continue_with_the_scheduler_tool(stack, llm,
                                                                scheduling_tenant):
    client, tenant = scheduling_tenant["client"], scheduling_tenant["name"]
    ref = uid("u")
    made = stack.agentq("users", "set", "api", ref, "--level", "user", "--tenant", tenant)
    assert made.returncode == 0, made.stderr
    key = uid("tool").replace("-", "_")

    def offered(request):
        names = {t["function"]["name"] for t in request.get("tools") or []}
        assert {"scheduler-add_job", "scheduler-list_jobs", "scheduler-cancel_job"} <= names

    marker = llm.script(key, [
        tool_calls(call("scheduler.add_job", {"content": f"script:{key} remind them",
                                              "delay_s": 1}), check=offered),
        text("I will remind you."),
        text("Here is your reminder."),  # the fired continue
    ])
    job = client.submit(f"{marker} remind me in a second", user=ref)
    ended = client.wait(job["id"])
    assert ended["status"] == "completed", ended
    with stack.sessions()() as session:
        (row,) = session.execute(select(Schedule).where(
            Schedule.conversation_id == uuid.UUID(job["conversation_id"]))).scalars()
        assert row.created_by == "tool" and row.tool_use_id
    shown = fired(client, str(row.id))
    follow = client.wait(shown["firings"][0]["job_id"])
    assert follow["status"] == "completed"
    assert follow["conversation_id"] == job["conversation_id"]
    assert follow["response"]["content"] == "Here is your reminder."
    messages = client.get(f"/v1/conversations/{job['conversation_id']}/messages").json()
    assert [m["content"] for m in messages["data"] if m["role"] == "assistant"][-2:] == [
        "I will remind you.", "Here is your reminder."]
    llm.assert_done(key)


def test_a_guest_may_not_use_the_scheduler_tool(stack, llm, scheduling_tenant):
    client = scheduling_tenant["client"]
    key = uid("guest").replace("-", "_")
    seen = {}

    def result_of(request):
        seen["tool"] = [m for m in request["messages"] if m.get("role") == "tool"]

    marker = llm.script(key, [
        tool_calls(call("scheduler.add_job", {"content": "x", "delay_s": 1})),
        text("I cannot.", check=result_of),
    ])
    job = client.submit(f"{marker} remind me", user=uid("guest"))
    assert client.wait(job["id"])["status"] == "completed"
    error = json.loads(seen["tool"][0]["content"])["error"]
    # a guest is not offered the module's tools: the call is refused as unavailable
    assert error["code"] in ("tool_not_found", "tool_not_permitted"), error
    assert "Available: time.now." in error["message"], error
    with stack.sessions()() as session:
        assert session.execute(select(func.count()).select_from(Schedule).where(
            Schedule.conversation_id == uuid.UUID(job["conversation_id"]))).scalar_one() == 0
    llm.assert_done(key)


def test_the_model_lists_and_cancels_its_scheduled_jobs(stack, client, llm,
                                                        scheduling_tenant):
    """`scheduler.list_jobs` and `scheduler.cancel_job` through a job: the model sees the
    schedule it made in this conversation, cancels it by the id it read, and may not cancel
    one of another conversation (the conversation is injected, never an argument)."""
    admin, tenant = scheduling_tenant["client"], scheduling_tenant["name"]
    ref = uid("u")
    made = stack.agentq("users", "set", "api", ref, "--level", "user", "--tenant", tenant)
    assert made.returncode == 0, made.stderr
    # a schedule of another conversation of the same tenant, which the model must not reach
    other_conversation = conversation_of(admin, llm, uid("elsewhere").replace("-", "_"))
    elsewhere = schedule(admin, other_conversation, "not yours", delay_s=3600)
    key = uid("lc").replace("-", "_")
    seen: dict = {}

    def results(request) -> list[dict]:
        return [json.loads(m["content"]) for m in request["messages"]
                if m.get("role") == "tool"]

    def cancel_what_was_listed(request):
        listed = results(request)[-1]
        seen["listed"] = listed
        (job,) = listed["jobs"]  # only this conversation's
        reply.tool_calls[0]["function"]["arguments"] = json.dumps({"job_id": job["id"]})
        reply.tool_calls[1]["function"]["arguments"] = json.dumps(
            {"job_id": elsewhere["id"]})

    reply = tool_calls(call("scheduler.cancel_job", {"job_id": "filled in"}),
                       call("scheduler.cancel_job", {"job_id": "filled in"}),
                       check=cancel_what_was_listed)
    marker = llm.script(key, [
        tool_calls(call("scheduler.add_job", {"content": f"script:{key} later",
                                              "delay_s": 3600})),
        tool_calls(call("scheduler.list_jobs", {}),
                   check=lambda request: seen.setdefault("added", results(request)[-1])),
        reply,
        text("Cancelled.", check=lambda request: seen.setdefault("cancelled",
                                                                 results(request)[-2:])),
    ])
    job = admin.submit(f"{marker} plan and unplan", user=ref)
    ended = admin.wait(job["id"])
    assert ended["status"] == "completed", ended
    llm.assert_done(key)
    added = seen["added"]["job"]
    assert seen["added"]["scheduled"] is True and added["status"] == "active"
    [listed] = seen["listed"]["jobs"]
    assert listed["id"] == added["id"] and listed["runs"] == 0
    mine, theirs = seen["cancelled"]
    assert mine["cancelled"] is True and mine["job"]["id"] == added["id"]
    assert mine["job"]["status"] == "cancelled"
    assert theirs["error"]["code"] == "scheduler_error", theirs
    assert admin.get(f"/v1/schedules/{added['id']}").json()["status"] == "cancelled"
    with stack.sessions()() as session:
        row = session.get(Schedule, uuid.UUID(added["id"]))
        assert (row.status, row.created_by, str(row.conversation_id)) == (
            "cancelled", "tool", job["conversation_id"])
        assert session.get(Schedule, uuid.UUID(elsewhere["id"])).status == "active"
    assert admin.get(f"/v1/schedules/{elsewhere['id']}").json()["status"] == "active"
    assert admin.http.delete(admin.url(f"/v1/schedules/{elsewhere['id']}"),
                             timeout=70).status_code == 204
