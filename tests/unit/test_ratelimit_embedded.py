"""The per-key limits in the embedded mode (`agentq dev`: one process, the memory:// broker):
Flask-Limiter on its memory storage, holds in the process (api/ratelimit.py)."""
from __future__ import annotations

import pytest

from agentq.config import set_settings
from agentq.db import dispose_engines, session_scope
from agentq.keys import create_key
from tests.support import unit_db


@pytest.fixture
def api(tmp_path):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path),
                                 "AGENTQ_QUOTA_REQUESTS_PER_SECOND": "3",
                                 "AGENTQ_QUOTA_STREAMS_PER_KEY": "1"})
    assert settings.embedded_broker
    with session_scope(settings) as session:
        _, key = create_key(session, "embedded", admin=False)
    from api import create_app
    app = create_app(settings)
    yield app, {"Authorization": f"Bearer {key}"}
    set_settings(None)
    dispose_engines()


def test_requests_past_the_rate_get_429_with_retry_after(api):
    app, headers = api
    client = app.test_client()
    missing = "/v1/jobs/00000000-0000-0000-0000-00000000abcd"
    answers = [client.get(missing, headers=headers) for _ in range(10)]
    assert {a.status_code for a in answers} == {404, 429}
    refused = next(a for a in answers if a.status_code == 429)
    error = refused.get_json()["error"]
    assert (error["code"], error["details"]["limit"], error["details"]["quota"]) == \
        ("rate_limited", "requests_per_second", 3)
    assert int(refused.headers["Retry-After"]) == error["details"]["retry_after_s"] >= 1


def test_a_key_past_its_holds_gets_429_and_its_slot_back_after(api):
    app, headers = api
    holds = app.extensions["agentq_holds"]
    from flask import g

    from agentq.config import get_settings
    from api.auth import _authenticate
    from api.ratelimit import RateLimited, take_hold
    with app.test_request_context(headers=headers):
        g.settings = get_settings()  # create_app's settings
        _authenticate()
        hold = take_hold()  # an event stream's slot: the key's one
        with pytest.raises(RateLimited) as refused:
            take_hold(5)
        assert refused.value.details["limit"] == "streams_per_key"
        assert refused.value.retry_after_s >= 1
        hold.release()
        again = take_hold(5)
        assert holds.count(again.key) == 1
        again.release()
