"""`tasks.base.maintenance_run`: a beat task's work through a database blip, and past it a
line in the log instead of a traceback; no server needed."""
from __future__ import annotations

import logging

from sqlalchemy.exc import OperationalError

from tasks import base

AWAY = OperationalError("BEGIN", {}, Exception("could not connect to server"))


def test_work_that_met_the_database_away_runs_when_it_is_back():
    failures = [AWAY]

    def work():
        if failures:
            raise failures.pop()
        return 7
    assert base.maintenance_run("maintenance.sweep", work) == 7


def test_work_past_the_ride_out_is_left_to_the_next_tick(monkeypatch, caplog):
    monkeypatch.setattr(base, "MAINTENANCE_RIDE_OUT_S", 0)
    caplog.set_level(logging.INFO)

    def work():
        raise AWAY
    assert base.maintenance_run("maintenance.sweep", work) == 0
    [line] = [r for r in caplog.records if r.name == base.log.name]
    assert line.getMessage().startswith("maintenance task not run")
    assert not any(r.exc_info for r in caplog.records)
