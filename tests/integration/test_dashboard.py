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

from tests.integration.conftest import uid
from tests.support.scripted_llm import call, text, tool_calls
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


@pytest.fixture()
def page(browser, stack, admin_key):
    context = browser.new_context(base_url=stack.base, bypass_csp=True)
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto("/ui/jobs")
    page.get_by_label("API key").fill(admin_key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/ui/jobs"))
    yield page
    context.close()


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
    # the tool call with its arguments and result
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
    from tests.integration.conftest import wait_until
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
    row.get_by_role("button", name=f"Cancel schedule {schedule['id'][:8]}").click()
    page.get_by_role("status").get_by_text("cancelled").wait_for()
    assert page.locator(f"tr[data-schedule='{schedule['id']}']").count() == 0
    assert client.get(f"/v1/schedules/{schedule['id']}").status_code == 404


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
    assert listing.status_code == 200 and job["id"][:8] not in listing.text
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
