"""The job page is read from one snapshot, on real Postgres.

The page renders the job (its status) and its timeline, and hands the browser the last event
number it rendered: the page's script follows the job's events after that number (a job_start
sets the status to running; approval_required reloads the page). Read in READ COMMITTED, each
statement saw its own snapshot: a step that committed between the job's read and the
events' read gave a page with the old status and the new events, and the events that would
have updated the status were never streamed. The dashboard's cancel and approval tests
(tests/integration/test_dashboard.py) failed on that race in CI: a page stuck at `queued`
with the job running, and an Approve button under the status `running`."""
from __future__ import annotations

import re
import uuid

import pytest
from sqlalchemy import event, func, select

from agentq.db import engine_for, session_scope, snapshot_scope
from agentq.keys import create_key
from agentq.models import ApiKey
from agentq.testing.harness import text
from tests.support import unit_db


@pytest.fixture
def web(make_pg):
    """(harness, a signed-in test client of the API on the harness's database)."""
    from api import create_app
    from api.ui import COOKIE
    h = make_pg(text("4"))
    with session_scope(h.settings) as session:
        _, key = create_key(session, "ui-snapshot", admin=True)
    client = create_app(h.settings).test_client()
    client.set_cookie(COOKIE, key)
    return h, client


def _shown(page: str) -> tuple[str, int, list[str]]:
    """(the status, data-last-seq, the timeline's event types) of a job page."""
    status = re.search(r'id="job-status"[^>]*>([a-z]+)<', page).group(1)
    last_seq = int(re.search(r'data-last-seq="(\d+)"', page).group(1))
    timeline = page.split("<h2>Events</h2>", 1)[1].split("</table>", 1)[0]
    types = re.findall(r"<td>([a-z_]+)</td>", timeline)
    return status, last_seq, types


def test_a_step_committed_while_the_page_is_read_is_not_half_shown(web):
    # given a queued job, and a step of it that commits just after the page read the job
    h, client = web
    job_id = h.submit("What is 2+2?")
    armed = [True]

    def step_meanwhile(conn, cursor, statement, parameters, context, executemany):
        if armed[0] and statement.lstrip().startswith("SELECT") and "FROM jobs" in statement \
                and "WHERE jobs.id" in statement:
            armed[0] = False
            h.stepper.run(job_id, 0, "start")  # its own connection: commits and ends the job

    engine = engine_for(h.settings)
    event.listen(engine, "after_cursor_execute", step_meanwhile)
    try:
        # when the page is read
        page = client.get(f"/ui/jobs/{job_id}")
    finally:
        event.remove(engine, "after_cursor_execute", step_meanwhile)
    assert not armed[0], "the step did not run while the page was read"
    assert page.status_code == 200
    # then it shows the job as it was when its read began: queued, no events, so the
    # browser follows every event of the step from the first
    assert _shown(page.get_data(as_text=True)) == ("queued", 0, [])
    # and the next read shows all of the step
    status, last_seq, types = _shown(client.get(f"/ui/jobs/{job_id}").get_data(as_text=True))
    assert status == "completed" and types[0] == "job_start" and types[-1] == "job_end"
    assert last_seq == len(types) == h.job(job_id).event_seq


def test_the_page_of_an_unknown_job_is_not_found(web):
    _, client = web
    assert client.get(f"/ui/jobs/{uuid.uuid4()}").status_code == 404


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
def test_a_snapshot_does_not_see_what_commits_after_its_first_read(database, tmp_path,
                                                                   pg_url):
    # given a snapshot that has read the keys once
    env = {"AGENTQ_DATABASE_URL": pg_url} if database == "postgres" else {}
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path), **env}, backend=database)
    count = select(func.count()).select_from(ApiKey)
    with snapshot_scope(settings) as snapshot:
        before = snapshot.execute(count).scalar_one()
        # when another transaction commits a key meanwhile
        with session_scope(settings) as other:
            create_key(other, "meanwhile")
        # then the snapshot still reads the keys as they were; a new transaction sees it
        assert snapshot.execute(count).scalar_one() == before
    with session_scope(settings) as session:
        assert session.execute(count).scalar_one() == before + 1
