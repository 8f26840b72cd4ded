"""`db.riding_out`: the attempts of a write whose work is done already (a tool ran, the
model answered), tried again while the database is away and logged as they go; no server
needed (the failures are raised as SQLAlchemy raises them)."""
from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from agentq.db import riding_out

AWAY = OperationalError("BEGIN", {}, Exception("could not connect to server"))


def _messages(caplog) -> list[tuple[str, dict]]:
    return [(r.getMessage(), {k: getattr(r, k) for k in ("job_id", "tries") if hasattr(r, k)})
            for r in caplog.records if r.name == "agentq.db"]


def test_a_write_that_fails_while_the_database_is_away_is_done_when_it_answers(caplog):
    caplog.set_level(logging.INFO, logger="agentq.db")
    failures, written = [AWAY, AWAY], []
    for attempt in riding_out(60, "model reply", job_id="j1"):
        with attempt:
            if failures:
                raise failures.pop()
            written.append("reply")
    assert written == ["reply"]
    assert _messages(caplog) == [
        ("database unreachable: the model reply is written when it answers",
         {"job_id": "j1", "tries": 1}),
        ("database unreachable: the model reply is written when it answers",
         {"job_id": "j1", "tries": 2}),
        ("model reply stored after the database came back", {"job_id": "j1", "tries": 3})]


def test_a_write_done_at_once_logs_nothing(caplog):
    caplog.set_level(logging.INFO, logger="agentq.db")
    tries = 0
    for attempt in riding_out(60, "tool result"):
        with attempt:
            tries += 1
    assert tries == 1 and _messages(caplog) == []


def test_an_error_that_is_not_the_database_being_away_is_raised_at_once(caplog):
    caplog.set_level(logging.INFO, logger="agentq.db")
    tries = 0
    with pytest.raises(ValueError):
        for attempt in riding_out(60, "summary"):
            with attempt:
                tries += 1
                raise ValueError("a bug, not an outage")
    assert tries == 1 and _messages(caplog) == []


def test_past_its_deadline_the_database_error_is_raised():
    tries = 0
    with pytest.raises(OperationalError):
        for attempt in riding_out(0, "delivery attempt"):
            with attempt:
                tries += 1
                raise AWAY
    assert tries == 1


def test_a_body_that_returns_from_the_loop_ends_it():
    def write() -> int:
        for attempt in riding_out(60, "memory"):
            with attempt:
                return 0
        return 1
    assert write() == 0
