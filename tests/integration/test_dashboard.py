"""The /ui dashboard in a real browser (Debian's Chromium driven by Playwright) against the
live stack: sign in, the jobs list and its filters (`waiting` too), a running job updating
live, cancel, approving and denying a waiting tool call, replay and its side-by-side compare,
batches, schedules (listed, cancelled); each page saved as a screenshot under
test-artifacts/ui/ and checked by axe-core (no serious or critical violation)."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from agentq.testing.scripted_llm import call, error, text, tool_calls
from tests.support.api import Client, uid
from tests.support.stack import REDIS_URL
from tests.support.tool_gate import ToolGate

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM = os.environ.get("AGENTQ_TEST_CHROMIUM") or shutil.which("chromium") or \
    "/usr/bin/chromium"
# as the machine's notes say: no background networking (its connections would be refused)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def signed_in(browser, stack, key: str, path: str = "/ui/jobs", **options):
    """A page of a new browser context (`options`: new_context's) signed in with `key`,
    at `path`; close it with `page.context.close()`."""
    context = browser.new_context(base_url=stack.base, bypass_csp=True, **options)
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto(path)
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(re.escape(path)))
    return page


@pytest.fixture()
def page(browser, stack, admin_key):
    page = signed_in(browser, stack, admin_key)
    yield page
    page.context.close()


def beside(page, path: str):
    """`path` opened in a new page of the same signed-in context. A job's page reloads
    itself 300 ms after its job ends (api/static/ui.js); that reload, landing while the same
    page navigates elsewhere, aborts the navigation (net::ERR_ABORTED), so a page that may
    still be due to reload is left alone."""
    fresh = page.context.new_page()
    fresh.goto(path)
    return fresh


def check(page, name: str) -> None:
    """A screenshot as a test artefact, and axe-core's serious/critical violations: none."""
    from axe_playwright_python.sync_playwright import Axe
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    violations = [v for v in Axe().run(page).response["violations"]
                  if v.get("impact") in ("serious", "critical")]
    assert not violations, [(v["id"], v["help"], [n["target"] for n in v["nodes"]])
                            for v in violations]


def test_sign_in_refuses_a_bad_key_and_pages_need_one(browser, stack):
    context = browser.new_context(base_url=stack.base, bypass_csp=True)
    page = context.new_page()
    page.goto("/ui/batches")
    assert "/ui/sign-in" in page.url
    page.get_by_label("API key").fill("not-a-key")
    page.get_by_role("button", name="Sign in").click()
    assert page.get_by_role("alert").inner_text() == "That API key is not valid."
    check(page, "sign-in")
    context.close()


def test_a_running_job_updates_live_then_shows_its_answer(page, client, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"}), delay_s=2.0),
                     text("It is 42.", delay_s=1.0)])
    job = client.submit(f"{marker} what is 6*7", user=uid("ui"))
    page.goto(f"/ui/jobs/{job['id']}")
    # events arrive through the stream while the page is open, then the page shows the end
    page.locator("#timeline").get_by_text("tool_execution_end").wait_for()
    # the page reloads itself once the job has ended: the answer is rendered by the server
    page.locator("pre.answer").get_by_text("It is 42.").wait_for()
    page.wait_for_load_state()
    assert page.locator("#job-status").inner_text() == "completed"
    assert page.locator("#timeline").get_by_text("job_end").count() == 1
    # the waterfall has its tool call; the events, folded once the job has ended, have its
    # arguments and result
    assert page.locator("#waterfall li[data-label='Tool: math.evaluate']").count() == 1
    page.get_by_text("Events", exact=True).click()
    timeline = page.locator("#timeline").inner_text()
    assert "math.evaluate" in timeline and "6*7" in timeline and "42" in timeline
    check(page, "job")


def test_the_jobs_list_filters_and_follows_a_live_job(page, client, script):
    user = uid("ui")
    marker = script([text("done", delay_s=2.0)])
    job = client.submit(f"{marker} hello", user=user)
    page.goto(f"/ui/jobs?user={user}")
    row = page.locator(f"tr[data-job='{job['id']}']")
    row.wait_for()
    # the row turns completed without a reload (its event stream, then a refresh of the rows)
    page.locator(f"tr[data-job='{job['id']}'][data-status='completed']").wait_for()
    assert page.locator("#jobs tbody tr[data-job]").count() == 1
    page.get_by_label("Status").select_option("failed")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"status=failed"))
    assert page.locator(f"tr[data-job='{job['id']}']").count() == 0
    check(page, "jobs")


def test_cancel_from_the_job_page(page, client, script):
    # the job waits in its tool call at a gate the test opens after the cancel: it is running
    # however long the page takes (a held model reply would outlast the model's timeout)
    gate = ToolGate(REDIS_URL)
    marker = script([tool_calls(call("flaky.gated", gate.args()))])
    job = client.submit(f"{marker} go", user=uid("ui"))
    try:
        gate.wait_started()
        page.goto(f"/ui/jobs/{job['id']}")
        assert page.locator("#job-status").inner_text() == "running"
        page.get_by_role("button", name="Cancel job").click()
        page.get_by_role("status").get_by_text("Cancel requested").wait_for()
    finally:
        gate.close()
    assert client.wait(job["id"])["status"] == "cancelled"
    ended = beside(page, f"/ui/jobs/{job['id']}")
    assert ended.locator("#job-status").inner_text() == "cancelled"
    check(ended, "cancel")


def waiting_for_approval(page, client, script, user: str, expression: str) -> dict:
    """A job whose flaky.guarded call waits for approval, its page open on the Approve and
    Deny buttons (the page reloads itself when the approval is asked for)."""
    from tests.support.api import wait_until
    marker = script([tool_calls(call("flaky.guarded", {"text": expression})),
                     text("guarded done")])
    job = client.submit(f"{marker} guarded", user=user)
    page.goto(f"/ui/jobs/{job['id']}")
    page.get_by_role("button", name="Approve flaky.guarded").wait_for()
    shown = wait_until(lambda: (lambda j: j if j["status"] == "waiting" else None)(
        client.get(f"/v1/jobs/{job['id']}").json()), what="job waiting")
    assert shown["waiting_for"] == "approval"
    assert page.locator("#job-status").inner_text() == "waiting"
    assert page.locator("#job-waiting-for").inner_text() == "approval"
    return job


def test_a_waiting_call_is_approved_from_the_job_page(page, client, script):
    user = uid("ui")
    job = waiting_for_approval(page, client, script, user, "ls")
    assert expression_shown(page, "ls")
    # the jobs list finds it under `waiting`, with its Cancel button on its page
    page.goto(f"/ui/jobs?user={user}&status=waiting")
    page.locator(f"tr[data-job='{job['id']}'][data-status='waiting']").wait_for()
    page.goto(f"/ui/jobs/{job['id']}")
    assert page.get_by_role("button", name="Cancel job").is_visible()
    check(page, "approval")
    # keyboard: Approve is reached and pressed without a mouse
    page.get_by_role("button", name="Approve flaky.guarded").focus()
    page.keyboard.press("Enter")
    page.get_by_role("status").get_by_text("Approved").wait_for()
    ended = client.wait(job["id"])
    assert ended["status"] == "completed" and ended["response"]["content"] == "guarded done"
    assert ended["response"]["metadata"]["tool_calls"][0]["success"] is True


def test_a_waiting_call_is_denied_with_a_reason_from_the_job_page(page, client, script):
    job = waiting_for_approval(page, client, script, uid("ui"), "rm -rf /")
    page.get_by_label("Reason for denying flaky.guarded").fill("not on my watch")
    page.get_by_role("button", name="Deny flaky.guarded").click()
    page.get_by_role("status").get_by_text("Denied").wait_for()
    ended = client.wait(job["id"])
    assert ended["status"] == "completed"
    assert ended["response"]["metadata"]["tool_calls"][0]["success"] is False
    events = client.events(job["id"])
    assert any("not on my watch" in str(e["data"]) for e in events)


def expression_shown(page, expression: str) -> bool:
    return expression in page.locator("#approvals").inner_text()


def test_the_schedules_page_lists_and_cancels(page, client, script):
    marker = script([text("hello")])
    job = client.wait(client.submit(f"{marker} hi", user=uid("ui"))["id"])
    created = client.post("/v1/schedules", json={
        "conversation_id": job["conversation_id"], "content": "every new year",
        "cron": "0 0 1 1 *", "timezone": "UTC"})
    assert created.status_code == 201, created.text
    schedule = created.json()
    page.goto("/ui/schedules")
    row = page.locator(f"tr[data-schedule='{schedule['id']}']")
    row.wait_for()
    assert row.get_attribute("data-status") == "active"
    cells = row.locator("td").all_inner_texts()
    assert "0 0 1 1 *" in cells[2] and cells[3].startswith(schedule["next_run_at"][:10])
    assert cells[4] == "0" and "every new year" in cells[6]
    check(page, "schedules")
    row.get_by_role("button", name=f"Cancel schedule {schedule['id'][-8:]}").click()
    page.get_by_role("status").get_by_text("cancelled").wait_for()
    assert page.locator(f"tr[data-schedule='{schedule['id']}']").count() == 0
    # the API still reads it, as cancelled (issue 31)
    shown = client.get(f"/v1/schedules/{schedule['id']}")
    assert shown.status_code == 200 and shown.json()["status"] == "cancelled"


def test_replay_and_its_side_by_side_compare(page, client, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "2*3"})), text("six")])
    original = client.wait(client.submit(f"{marker} go", user=uid("ui"))["id"])
    page.goto(f"/ui/jobs/{original['id']}")
    page.get_by_label("Replay mode").select_option("recorded")
    page.get_by_role("button", name="Replay").click()
    page.get_by_role("status").get_by_text("Replay (recorded)").wait_for()
    replay_id = page.locator("#job").get_attribute("data-job")
    assert replay_id != original["id"]
    assert client.wait(replay_id)["status"] == "completed"
    compare = beside(page, f"/ui/jobs/{replay_id}/compare")
    assert compare.get_by_role("heading", name="Original", exact=True).is_visible()
    assert compare.get_by_role("heading", name="Replay", exact=True).is_visible()
    assert compare.get_by_text("Same answer: yes").count() == 1
    assert compare.locator(".answer").all_inner_texts() == ["six", "six"]
    check(compare, "compare")


def test_batches_show_their_progress(page, client, script):
    marker = script([text("a"), text("b")])
    response = client.post("/v1/batches", json={"requests": [
        {"platform": "api", "platform_user_id": uid("ui"), "platform_channel_id": uid("c"),
         "content": f"{marker} {n}"} for n in range(2)]})
    assert response.status_code == 202, response.text
    batch = response.json()
    page.goto("/ui/batches")
    progress = page.locator(f"#p-{batch['id']}")
    assert progress.get_attribute("max") == "2"
    # keyboard: the first link of the page is reachable by Tab (skip link, then nav)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    check(page, "batches")
    wait_batch(client, batch["id"])


def wait_batch(client, batch_id: str) -> None:
    import time
    while client.get(f"/v1/batches/{batch_id}").json()["status"] != "completed":
        time.sleep(0.1)  # a batch that never completes is the test's timeout


def ui_session(stack, key: str):
    import requests
    session = requests.Session()
    response = session.post(f"{stack.base}/ui/sign-in", data={"key": key},
                            headers={"Origin": stack.base}, allow_redirects=False)
    assert response.status_code == 302, response.text
    return session


def test_another_tenants_key_sees_none_of_its_jobs_in_the_dashboard(stack, client, script):
    marker = script([text("private")])
    job = client.wait(client.submit(f"{marker} secret", user=uid("ui"))["id"])
    other = stack.create_key("ui-other", admin=True, tenant=stack.create_tenant(uid("t")))
    session = ui_session(stack, other)
    listing = session.get(f"{stack.base}/ui/jobs")
    assert listing.status_code == 200 and job["id"][-8:] not in listing.text
    for path in (f"/ui/jobs/{job['id']}", f"/ui/jobs/{job['id']}/events"):
        page = session.get(stack.base + path)
        assert page.status_code == 404 and "private" not in page.text
    refused = session.post(f"{stack.base}/ui/jobs/{job['id']}/replay", data={"mode": "live"},
                           headers={"Origin": stack.base}, allow_redirects=False)
    assert refused.status_code == 404


def test_changes_from_another_origin_are_refused(stack, client, script, admin_key):
    marker = script([text("done")])
    job = client.wait(client.submit(f"{marker} hi", user=uid("ui"))["id"])
    session = ui_session(stack, admin_key)
    forged = session.post(f"{stack.base}/ui/jobs/{job['id']}/replay", data={"mode": "live"},
                          headers={"Origin": "https://evil.example"}, allow_redirects=False)
    assert forged.status_code == 403
    unsigned = session.post(f"{stack.base}/ui/jobs/{job['id']}/replay", data={"mode": "live"},
                            allow_redirects=False)  # no Origin, no Referer
    assert unsigned.status_code == 403
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "completed"


def rows_shown(page, selector: str) -> list[dict]:
    """Each matching element's data-* attributes and its text."""
    return page.locator(selector).evaluate_all(
        "els => els.map(e => ({...e.dataset, text: e.innerText}))")


def db_rows(stack, job_id: str):
    """(the job, its events by type, its tool calls by name, its token logs by turn) as
    stored."""
    import uuid as _uuid

    from sqlalchemy import select

    from agentq.models import Job, JobEvent, TokenLog, ToolCall
    ident = _uuid.UUID(job_id)
    with stack.sessions()() as session:
        job = session.get(Job, ident)
        events: dict[str, list] = {}
        for e in session.execute(select(JobEvent).where(JobEvent.job_id == ident)
                                 .order_by(JobEvent.seq)).scalars():
            events.setdefault(e.type, []).append(e)
        calls = {c.name: c for c in session.execute(
            select(ToolCall).where(ToolCall.job_id == ident)).scalars()}
        logs = {t.iteration: t for t in session.execute(
            select(TokenLog).where(TokenLog.job_id == ident)).scalars()}
        session.expunge_all()
    return job, events, calls, logs


def ms(later, earlier) -> float:
    return (later - earlier).total_seconds() * 1000


def test_the_job_page_draws_its_steps_as_a_waterfall(page, client, script, stack):
    from tests.support.api import wait_until
    marker = script([
        tool_calls(call("math.evaluate", {"expression": "6*7"}),
                   call("flaky.sleep", {"seconds": 0.4}),
                   call("flaky.guarded", {"text": "show the work"}),
                   delay_s=0.6, model="gpt-4o-mini", input_tokens=1200, output_tokens=60),
        text("It is 42.", delay_s=0.4, model="gpt-4o-mini", input_tokens=1500,
             output_tokens=20)])
    job = client.submit(f"{marker} what is 6*7?\nShow your work.", user=uid("ui"))
    # the guarded call waits for a person, who approves it through the API
    asked = wait_until(lambda: next((e for e in client.events(job["id"])
                                     if e["type"] == "approval_required"), None),
                       what="approval asked")
    approved = client.post(f"/v1/jobs/{job['id']}/tool_calls/"
                           f"{asked['data']['tool_use_id']}/approve")
    assert approved.status_code == 202, approved.text
    assert client.wait(job["id"])["status"] == "completed"
    stored, events, calls, logs = db_rows(stack, job["id"])

    page.goto(f"/ui/jobs/{job['id']}")
    bars = rows_shown(page, "#waterfall li.wf-row")
    # a bar for the job, its queue, each turn, model call, approval and tool call
    assert sorted(b["kind"] for b in bars) == sorted(
        ["job", "queued", "turn", "model", "approval", "tool", "tool", "tool", "turn", "model"])
    assert [b["kind"] for b in bars][:4] == ["job", "queued", "turn", "model"]
    assert [b["kind"] for b in bars][-2:] == ["turn", "model"]
    labels = {b["label"] for b in bars}
    assert {"Tool: math.evaluate", "Tool: flaky.sleep", "Tool: flaky.guarded",
            "Approval: flaky.guarded", "Model call: gpt-4o-mini", "Turn 1", "Turn 2"} <= labels

    def bar(label: str, nth: int = 0) -> dict:
        return [b for b in bars if b["label"] == label][nth]

    def same(shown: dict, expected_ms: float) -> None:
        assert abs(float(shown["durationMs"]) - expected_ms) < 0.01, (shown, expected_ms)

    # each bar lasts what its rows say
    same(bar("Job"), ms(stored.finished_at, stored.created_at))
    same(bar("Queued"), ms(events["job_start"][0].created_at, stored.created_at))
    for name in ("math.evaluate", "flaky.sleep", "flaky.guarded"):
        row = calls[name]
        same(bar(f"Tool: {name}"), ms(row.finished_at, row.started_at))
        assert bar(f"Tool: {name}")["start"] == row.started_at.isoformat()
    assert float(bar("Tool: flaky.sleep")["durationMs"]) >= 400  # it slept 0.4 s
    same(bar("Approval: flaky.guarded"), ms(events["approval_resolved"][0].created_at,
                                            events["approval_required"][0].created_at))
    turn_starts, turn_ends = events["turn_start"], events["turn_end"]
    for n in (1, 2):
        same(bar(f"Turn {n}"), ms(turn_ends[n - 1].created_at, turn_starts[n - 1].created_at))
        model = bar("Model call: gpt-4o-mini", n - 1)
        began, ended = ([e for e in events[kind] if e.data.get("role") == "assistant"]
                        for kind in ("message_start", "message_end"))
        same(model, ms(ended[n - 1].created_at, began[n - 1].created_at))
        assert float(model["durationMs"]) > 0
        # its tokens and cost, as logged
        log = logs[n]
        assert f"{log.input_tokens} in / {log.output_tokens} out" in model["text"]
        assert f"${log.cost_estimate:.6f}" in model["text"] and log.cost_estimate > 0
    assert (logs[1].input_tokens, logs[2].output_tokens) == (1200, 20)
    # the axis starts at 0 and the facts name the model and the question's first line
    assert page.locator("#waterfall .wf-tick-label").first.text_content() == "0"
    assert page.locator("#job-model").inner_text() == "gpt-4o-mini"
    assert page.locator("#job-question").inner_text() == f"{marker} what is 6*7?"
    # the JSON is one click away
    row = page.locator("#waterfall li.wf-row[data-label='Tool: flaky.guarded']")
    assert not row.locator("pre").is_visible()
    row.locator("summary").click()
    assert calls["flaky.guarded"].tool_use_id in row.locator("pre").inner_text()
    assert '"show the work"' in row.locator("pre").inner_text()
    row.locator("summary").click()
    page.evaluate("document.activeElement.blur()")
    check(page, "job-waterfall")  # docs/ui/job-waterfall.png


def test_the_jobs_list_shows_each_job_s_question_model_and_duration(page, client, script,
                                                                    stack):
    user = uid("ui")
    marker = script([text("done", delay_s=0.3)])
    job = client.wait(client.submit(f"{marker} first line\nsecond line", user=user)["id"])
    stored = db_rows(stack, job["id"])[0]
    page.goto(f"/ui/jobs?user={user}")
    row = page.locator(f"tr[data-job='{job['id']}']")
    assert row.locator("td.question").inner_text() == f"{marker} first line"
    assert row.locator("td.model").inner_text() == "primary-model"
    shown = float(row.get_attribute("data-duration-ms"))
    assert abs(shown - ms(stored.finished_at, stored.created_at)) < 0.01
    assert re.fullmatch(r"[\d.]+ m?s", row.locator("td.duration").inner_text())
    page.goto("/ui/jobs")  # every job of the session's key: the list as a person sees it
    page.locator(f"tr[data-job='{job['id']}']").wait_for()
    check(page, "jobs-list")  # docs/ui/jobs.png


def overview_expected(stack, tenant_id: str | None = None, api_key_id=None) -> dict:
    """The last hour's numbers as the database has them (computed here, not by the page's
    code): ended jobs by status, the p50/p95 duration, tokens and cost per model."""
    import statistics
    import uuid as _uuid
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import select

    from agentq.models import Job, TokenLog
    since = datetime.now(timezone.utc) - timedelta(hours=1)
    query = select(Job).where(Job.finished_at >= since)
    usage = select(TokenLog, Job).join(Job, Job.id == TokenLog.job_id).where(
        TokenLog.created_at >= since)
    if tenant_id:
        query = query.where(Job.tenant_id == _uuid.UUID(tenant_id))
        usage = usage.where(Job.tenant_id == _uuid.UUID(tenant_id))
    if api_key_id:
        query = query.where(Job.api_key_id == api_key_id)
        usage = usage.where(Job.api_key_id == api_key_id)
    with stack.sessions()() as session:
        jobs = session.execute(query).scalars().all()
        logs = [t for t, _ in session.execute(usage).all()]
        durations = sorted((j.finished_at - j.created_at).total_seconds() for j in jobs)
        ended = {s: sum(1 for j in jobs if j.status == s)
                 for s in ("completed", "failed", "cancelled")}
    models: dict[str, list] = {}
    for t in logs:
        m = models.setdefault(t.model, [0, 0, 0, 0.0])
        m[0] += 1
        m[1] += t.input_tokens
        m[2] += t.output_tokens
        m[3] += t.cost_estimate
    quantiles = (statistics.quantiles(durations, n=20, method="inclusive")
                 if len(durations) > 1 else durations * 19)
    return {"ended": ended, "total": len(jobs), "durations": durations,
            "p50": statistics.median(durations) if durations else None,
            "p95": quantiles[18] if durations else None, "models": models,
            "tokens": sum(m[1] + m[2] for m in models.values()),
            "cost": sum(m[3] for m in models.values())}


def shown_value(page, ident: str) -> float:
    return float(page.locator(f"#{ident}").get_attribute("data-value"))


def assert_overview_matches(page, expected: dict) -> None:
    assert int(page.locator("#ov-ended").inner_text()) == expected["total"]
    assert int(page.locator("#ov-failed").inner_text()) == expected["ended"]["failed"]
    assert int(page.locator("#ov-cancelled").inner_text()) == expected["ended"]["cancelled"]
    assert abs(shown_value(page, "ov-jobs-per-s") - expected["total"] / 3600) < 1e-6
    assert abs(shown_value(page, "ov-failure-rate")
               - expected["ended"]["failed"] / expected["total"]) < 1e-6
    assert abs(shown_value(page, "ov-p50") - expected["p50"]) < 1e-5
    assert abs(shown_value(page, "ov-p95") - expected["p95"]) < 1e-5
    assert int(shown_value(page, "ov-tokens")) == expected["tokens"]
    assert abs(shown_value(page, "ov-cost") - expected["cost"]) < 1e-7
    drawn = rows_shown(page, "#tokens-per-minute rect[data-model]")
    assert sum(int(r["tokens"]) for r in drawn) == expected["tokens"]
    assert {r["model"] for r in drawn} == set(expected["models"])
    rows = rows_shown(page, "#models tbody tr[data-model]")
    assert {r["model"] for r in rows} == set(expected["models"])
    for r in rows:
        calls, inp, out, _cost = expected["models"][r["model"]]
        assert r["text"].split("\t")[1:4] == [str(calls), str(inp), str(out)], r


def broker_depth(stack, queue: str) -> int:
    """Messages waiting in `queue`, asked of the stack's broker (Redis or RabbitMQ)."""
    url = stack.env["AGENTQ_BROKER_URL"]
    if url.startswith("redis"):
        import redis
        client = redis.Redis.from_url(url)
        try:
            return client.llen(queue)
        finally:
            client.close()
    from kombu import Connection
    with Connection(url) as conn:
        return conn.default_channel.queue_declare(queue=queue, passive=True).message_count


def test_the_overview_shows_the_last_hour_by_the_tenant_rules(browser, stack, llm):
    from sqlalchemy import update

    from agentq.keys import lookup
    from agentq.models import ApiKey
    # a tenant of its own: two jobs of its admin key (one fails), one of another key
    tenant = stack.create_tenant(uid("ov"))
    admin = stack.create_key("ov-admin", admin=True, tenant=tenant)
    member = stack.create_key("ov-member", admin=False, tenant=tenant)
    admins, members = Client(stack, admin), Client(stack, member)
    keys = [uid("s").replace("-", "_") for _ in range(4)]  # a script per job
    ok = llm.script(keys[0], [text("fine", model="gpt-4o-mini", input_tokens=900,
                                   output_tokens=40, delay_s=0.2)])
    bad = llm.script(keys[1], [error(400, "bad request"), error(400, "bad request")])
    mine = llm.script(keys[2], [text("mine", input_tokens=50, output_tokens=7)])
    jobs = [admins.submit(f"{ok} one", user=uid("ov")), admins.submit(f"{bad} two"),
            members.submit(f"{mine} three", user=uid("ov"))]
    assert [admins.wait(j["id"])["status"] for j in jobs] == ["completed", "failed",
                                                              "completed"]
    expected = overview_expected(stack, tenant)
    assert (expected["total"], expected["ended"]["failed"]) == (3, 1)

    # its admin sees the tenant's jobs: the numbers are the database's
    page = signed_in(browser, stack, admin)
    page.get_by_role("link", name="Overview").click()
    page.wait_for_url(re.compile(r"/ui/overview"))
    assert "this tenant's jobs" in page.locator("#overview-scope").inner_text()
    assert_overview_matches(page, expected)
    assert page.locator("#ov-failure-rate").inner_text() == "33.3%"
    assert "gpt-4o-mini" in {r["model"] for r in rows_shown(page, "#models tbody tr[data-model]")}
    # the per-minute chart: one column part per status, as many jobs as ended
    minutes = page.locator("#per-minute rect[data-minute]")
    assert minutes.count() >= 2
    # queues and workers, from the broker
    queues = rows_shown(page, "#queues tbody tr[data-queue]")
    assert {"orchestrator", "webhooks", "maintenance"} <= {q["queue"] for q in queues}
    for q in queues:
        assert q["depth"] != "" and int(q["depth"]) >= 0
    assert broker_depth(stack, "orchestrator") == 0 == int(
        [q for q in queues if q["queue"] == "orchestrator"][0]["depth"])
    workers = [w["hostname"] for w in rows_shown(page, "#workers li")]
    assert {w.partition("@")[0] for w in workers} >= set(stack.workers)
    assert int(page.locator("#workers-count").inner_text()) == len(workers)
    check(page, "overview")

    # it refreshes itself: a job that ends meanwhile is counted without a reload
    more = llm.script(keys[3], [text("later")])
    admins.wait(admins.submit(f"{more} four", user=uid("ov"))["id"])
    page.locator("#ov-ended").get_by_text("4", exact=True).wait_for(timeout=30_000)
    assert page.locator("#overview-refresh").inner_text().startswith("Refreshed")
    page.context.close()

    # a key that is not an admin sees its own jobs; an operator every tenant's
    session = ui_session(stack, member)
    own = session.get(f"{stack.base}/ui/overview?part=1")
    assert own.status_code == 200
    assert re.search(r'id="ov-ended">1<', own.text) and 'id="ov-failed">0<' in own.text
    with stack.sessions()() as db:
        row = lookup(db, admin)
        db.execute(update(ApiKey).where(ApiKey.id == row.id).values(is_operator=True))
        db.commit()
    page = signed_in(browser, stack, admin, "/ui/overview",
                     viewport={"width": 1280, "height": 900})
    assert "every tenant" in page.locator("#overview-scope").inner_text()
    assert int(page.locator("#ov-ended").inner_text()) == overview_expected(stack)["total"] >= 4
    check(page, "overview-all")  # docs/ui/overview.png
    page.context.close()
    for key in keys:
        llm.assert_done(key)


def test_a_live_job_s_waterfall_grows_as_it_runs(page, client, script):
    # the job waits in a gated tool call (it stays running however slow the page is)
    gate = ToolGate(REDIS_URL)
    marker = script([tool_calls(call("flaky.gated", gate.args()), delay_s=1.0),
                     text("through the gate")])
    job = client.submit(f"{marker} go", user=uid("ui"))
    try:
        page.goto(f"/ui/jobs/{job['id']}")
        # drawn by the server after the events the page followed: the tool's bar, still open
        tool = page.locator("#waterfall li[data-label='Tool: flaky.gated'][data-open='true']")
        tool.wait_for()
        assert page.locator("#waterfall li[data-kind='job']").get_attribute("data-open") == \
            "true"
        assert page.locator("#job-status").inner_text() == "running"
        assert tool.locator(".wf-duration").inner_text().endswith("so far")
        # what the page reads to redraw it: the waterfall alone, not the whole page
        part = page.request.get(f"/ui/jobs/{job['id']}?part=waterfall")
        assert part.ok, part.status
        assert part.text().lstrip().startswith('<section id="waterfall"')
        assert "<html" not in part.text() and 'id="timeline"' not in part.text()
        assert 'data-label="Tool: flaky.gated"' in part.text()
    finally:
        gate.close()
    assert client.wait(job["id"])["status"] == "completed"
