"""Postgres away: a blip of a few seconds is ridden out inside each submit (no 503: issue
35; api/rideout.py), and beat's tasks wait for it without a traceback; an outage longer
than the ride-out (AGENTQ_DATABASE_RIDE_OUT_S, 8 s) is answered 503 `unavailable` with
Retry-After, never 500, and every submit either wrote its job (202) or said it did not
(503, then resent with the same Idempotency-Key); when Postgres is back every job
completes, once (issue 11, cause 4)."""
from __future__ import annotations

import time
import uuid

import requests

DOWN_S = 20.0
"""longer than a submit's ride-out (8 s): the probes' submits give up with 503"""
BLIP_DOWN_S = 1.0


def test_postgres_stopped_mid_run_answers_503_then_recovers(run_fault, fault_lab):
    probes: list[requests.Response] = []

    def stop_probe_start(lab):
        lab.pg.stop(mode="fast")
        deadline = time.monotonic() + DOWN_S
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {lab.key}"
        while time.monotonic() < deadline:
            probes.append(http.get(f"{lab.stack.base}/v1/jobs/{uuid.uuid4()}", timeout=30))
            probes.append(http.post(f"{lab.stack.base}/v1/messages", timeout=30, json={
                "platform": "api", "platform_user_id": "probe", "platform_channel_id": "p",
                "content": "never written"}))
            time.sleep(0.5)
        http.close()
        lab.pg.start()

    outcome = run_fault("postgres_stopped", stop_probe_start)

    # while it was away: 503 in the error shape with Retry-After, never anything else
    assert probes
    for response in probes:
        assert response.status_code == 503, (response.status_code, response.text)
        assert response.json()["error"]["code"] == "unavailable"
        assert int(response.headers["Retry-After"]) > 0
    # the well-behaved submitter saw 503s too, and resent them: every job exists once
    assert outcome.api.get("503", 0) > 0, outcome.as_dict()
    # and the probe submits answered 503 wrote nothing
    rows = fault_lab.sql("SELECT COUNT(*) FROM jobs j JOIN messages m ON m.job_id = j.id "
                         "WHERE m.content = 'never written'")
    assert rows[0][0] == 0


def test_a_postgres_restart_of_a_few_seconds_is_ridden_out_by_every_submit(run_fault,
                                                                         fault_lab):
    # given Postgres restarted (fast shutdown: every session cut; down, then started)
    # while jobs are submitted at 20/s
    outages: list[float] = []
    beat_log = fault_lab.stack.logs["beat"]
    beat_before = beat_log.stat().st_size

    def blip(lab):
        started = time.monotonic()
        lab.pg.restart(down_s=BLIP_DOWN_S)
        outages.append(time.monotonic() - started)

    outcome = run_fault("postgres_blip", blip)
    assert outages and outages[0] <= 5.0, f"the restart took {outages} s: not a blip"
    # then no submit was refused: each waited for the database inside its request
    # (run_fault asserts that every job completed once and that no 5xx was answered)
    assert outcome.api.get("503", 0) == 0, outcome.as_dict()
    assert outcome.api.get("202", 0) == outcome.jobs, outcome.as_dict()
    # and beat's tasks waited for it too: no traceback in its log since the restart
    with beat_log.open("rb") as log:
        log.seek(beat_before)
        since = log.read().decode(errors="replace")
    assert "Traceback" not in since, since[-3000:]
