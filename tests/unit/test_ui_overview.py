"""The overview page (/ui/overview) on SQLite in embedded mode, as `agentq dev` serves it:
the last hour's numbers from the database, the in-memory broker's queues, the worker of this
process (tests/integration/test_dashboard.py checks it on Postgres with real workers)."""
from __future__ import annotations

import re

import pytest

from agentq.db import session_scope
from agentq.errors import ProviderError
from agentq.keys import create_key
from agentq.testing.harness import text
from api import ui_overview
from api.ui_overview import percentile


def number(page: str, ident: str) -> str:
    return re.search(rf'id="{ident}"[^>]*>([^<]*)<', page).group(1)


@pytest.fixture(autouse=True)
def _fresh_broker_reads():
    ui_overview._cache.clear()
    yield
    ui_overview._cache.clear()


def test_the_overview_counts_the_last_hour_in_embedded_mode(make):
    # given two jobs that completed and one that failed (on SQLite, or on Postgres with
    # AGENTQ_UNIT_DB=postgres)
    h = make(text("4", input_tokens=100, output_tokens=20),
             text("5", input_tokens=300, output_tokens=40),
             ProviderError("the model said no", transient=False))
    for question in ("2+2?", "2+3?", "fails"):
        h.drive(h.submit(question))
    assert h.settings.embedded_broker
    from api import create_app
    from api.ui import COOKIE
    with session_scope(h.settings) as session:
        _, key = create_key(session, "overview", admin=True)
    client = create_app(h.settings).test_client()
    client.set_cookie(COOKIE, key)
    # when the overview is read
    response = client.get("/ui/overview")
    # then it counts them, their tokens and their durations
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert (number(page, "ov-ended"), number(page, "ov-failed")) == ("3", "1")
    assert number(page, "ov-failure-rate") == "33.3%"
    assert number(page, "ov-tokens") == "460"
    assert re.search(r'<tr data-model="gpt-4o-mini"><th scope="row">gpt-4o-mini</th>'
                     r'<td class="num">2</td><td class="num">400</td><td class="num">60</td>',
                     page)
    # the tokens of each minute, by model
    drawn = re.findall(r'<rect class="m\d" data-model="([^"]+)" data-tokens="(\d+)"', page)
    assert sum(int(t) for _, t in drawn) == 460 and {m for m, _ in drawn} == {"gpt-4o-mini"}
    # the in-memory broker's queues are read; the worker is this process's (not started here)
    depths = dict(re.findall(r'data-queue="([^"]+)" data-depth="(\d*)"', page))
    assert {"orchestrator", "webhooks", "maintenance"} <= set(depths)
    assert all(d.isdigit() for d in depths.values())
    assert "Embedded mode" in page and "not running" in page
    # and the live part alone, for the page's refresh
    part = client.get("/ui/overview?part=1").get_data(as_text=True)
    assert "<html" not in part and number(part, "ov-ended") == "3"


def test_an_unknown_parameter_of_the_overview_is_refused(make):
    h = make()
    from api import create_app
    from api.ui import COOKIE
    with session_scope(h.settings) as session:
        _, key = create_key(session, "overview", admin=True)
    client = create_app(h.settings).test_client()
    client.set_cookie(COOKIE, key)
    assert client.get("/ui/overview?bogus=1").status_code == 400


def test_percentiles_interpolate_between_the_nearest_values():
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([float(n) for n in range(1, 21)], 0.95) == pytest.approx(19.05)


def test_a_broker_read_kept_is_shown_while_a_new_one_is_read():
    import threading
    import time
    reads, done, release = [], [], threading.Event()

    def read():
        reads.append(len(reads) + 1)
        if len(reads) > 1:
            release.wait(10)  # a slow ping
        done.append(reads[-1])
        return len(reads)

    assert ui_overview._cached("workers", read) == 1  # the first read is waited for
    ui_overview._cache["workers"] = (0.0, 1)  # kept too long
    assert ui_overview._cached("workers", read) == 1  # the kept one, at once
    assert ui_overview._cached("workers", read) == 1  # one read under way, not two
    assert done == [1]  # both answered while the new read still waited for its ping
    release.set()
    deadline = time.monotonic() + 10
    while ui_overview._cache["workers"][1] != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ui_overview._cached("workers", read) == 2 and reads == [1, 2]
