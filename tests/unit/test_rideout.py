"""`api.rideout.rides_out_database`: a submit tried again inside its request while the
database is away, unless that could write its job twice; no server needed (the failures
are raised as SQLAlchemy raises them)."""
from __future__ import annotations

import pytest
from flask import Flask, g
from sqlalchemy.exc import OperationalError

from agentq.config import Settings
from api.rideout import rides_out_database

AWAY = OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))


def run(view, ride_out_s: float = 8.0, headers: dict | None = None):
    app = Flask(__name__)
    with app.test_request_context("/v1/messages", method="POST", headers=headers or {}):
        g.settings = Settings.from_env({"AGENTQ_DATABASE_RIDE_OUT_S": str(ride_out_s)})
        return rides_out_database(view)()


def failing(times: int, commit: bool = False):
    calls = []

    def view():
        calls.append(1)
        if len(calls) <= times:
            if commit:
                g.commit_reached = True  # what the before_commit listener records
            raise AWAY
        return "answered"
    return view, calls


def test_a_submit_that_met_the_database_away_before_any_commit_is_answered_when_it_is_back():
    view, calls = failing(2)
    assert run(view) == "answered"
    assert len(calls) == 3


def test_a_commit_cut_off_without_an_idempotency_key_is_not_tried_again():
    view, calls = failing(1, commit=True)
    with pytest.raises(OperationalError):
        run(view)
    assert len(calls) == 1


def test_a_commit_cut_off_with_an_idempotency_key_is_tried_again():
    view, calls = failing(1, commit=True)
    assert run(view, headers={"Idempotency-Key": "k-1"}) == "answered"
    assert len(calls) == 2


def test_no_ride_out_answers_at_once_and_another_error_is_raised_untouched():
    view, calls = failing(1)
    with pytest.raises(OperationalError):
        run(view, ride_out_s=0)
    assert len(calls) == 1

    def bug():
        calls.append(1)
        raise KeyError("a bug")
    with pytest.raises(KeyError):
        run(bug)
    assert len(calls) == 2
