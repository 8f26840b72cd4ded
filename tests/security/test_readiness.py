"""/health/ready says when the code sandbox cannot run code (issue 9), in its usual shape."""
from __future__ import annotations

import pytest

from agentq.config import Settings, set_settings
from agentq.tools import sandbox, sandbox_bwrap
from api import create_app


@pytest.fixture
def app_client(tmp_path):
    settings = Settings.from_env({"AGENTQ_DATABASE_URL": f"sqlite:///{tmp_path}/ready.db",
                                  "AGENTQ_HOME": str(tmp_path)})
    app = create_app(settings)
    yield app.test_client()
    set_settings(None)


def test_ready_names_a_sandbox_that_cannot_run(app_client, monkeypatch):
    monkeypatch.setattr(sandbox, "_probe_cache", None)
    monkeypatch.setenv(sandbox_bwrap.BWRAP_ENV, "/nonexistent/bwrap")
    response = app_client.get("/health/ready")
    assert response.status_code == 503
    body = response.get_json()
    assert body["down"] == ["sandbox"]
    assert "bubblewrap" in body["error"]["details"]["sandbox"]
    assert body["error"]["code"] == "not_ready"


def test_ready_when_the_sandbox_runs(app_client, monkeypatch):
    monkeypatch.setattr(sandbox, "_probe_cache", None)
    response = app_client.get("/health/ready")
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["status"] == "ok"
    assert set(body["backlog"]) == {"unclaimed_jobs"}  # a count (null if unreadable)
