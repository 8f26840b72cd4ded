"""GET /health (alive) and GET /health/ready (the database and the broker answer, and the
code sandbox can run code on this machine: `sandbox` in `down` otherwise)."""
from __future__ import annotations

import logging

from flask import Blueprint, g, jsonify
from sqlalchemy import text

from agentq.db import engine_for
from agentq.tools import sandbox

log = logging.getLogger(__name__)
bp = Blueprint("health", __name__)
BROKER_TIMEOUT_S = 2


@bp.get("/health")
def health():
    return jsonify({"status": "ok"})


@bp.get("/health/ready")
def ready():
    down: dict[str, str] = {}
    try:
        with engine_for(g.settings).connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        down["database"] = type(exc).__name__
    if not g.settings.embedded_broker:
        from tasks.app import app as celery_app
        try:
            with celery_app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        except Exception as exc:
            down["broker"] = type(exc).__name__
    sandbox_problem = sandbox.problem()
    if sandbox_problem:
        down["sandbox"] = sandbox_problem
    if down:
        response = jsonify({"status": "unavailable", "down": sorted(down),
                            "error": {"code": "not_ready",
                                      "message": "Not ready: " + ", ".join(sorted(down))
                                                 + " not available.",
                                      "details": down}})
        response.status_code = 503
        return response
    return jsonify({"status": "ok"})
