"""GET /health (alive) and GET /health/ready (the database and the broker answer, and the
code sandbox can run code on this machine: `sandbox` in `down` otherwise). A ready answer
also gives the backlog: live jobs the sweeper re-drove that no worker has taken yet (a
number that grows while the orchestrator is down; those jobs wait, they do not fail)."""
from __future__ import annotations

import logging

from flask import Blueprint, g, jsonify
from sqlalchemy import text

from agentq.db import engine_for
from agentq.tools import sandbox
from api.openapi import json_response, operation
from api.schemas.health import HealthSchema, NotReadySchema

log = logging.getLogger(__name__)
bp = Blueprint("health", __name__)
BROKER_TIMEOUT_S = 2


@bp.get("/health")
@operation(
    "health", "Alive",
    tags=["health"],
    security=[],
    responses={
        200: json_response(HealthSchema, "`{\"status\": \"ok\"}`."),
    })
def health():
    return jsonify({"status": "ok"})


@bp.get("/health/ready")
@operation(
    "ready", "Ready: the database and broker answer, the code sandbox works",
    tags=["health"],
    security=[],
    responses={
        200: json_response(HealthSchema, "Ready."),
        503: json_response(NotReadySchema, "Not ready; `down` names what is down "
                      "(`database`, `broker`, `sandbox`). "
                      "`modules`: each tool module's health."),
    })
def ready():
    down: dict[str, str] = {}
    try:
        with engine_for(g.settings).connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - whatever it is, the database is down
        down["database"] = type(exc).__name__
    if not g.settings.embedded_broker:
        from tasks.app import app as celery_app
        try:
            with celery_app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - whatever it is, the broker is down
            down["broker"] = type(exc).__name__
    sandbox_problem = sandbox.problem()
    if sandbox_problem:
        down["sandbox"] = sandbox_problem
    modules = _modules()
    backlog = None
    search = {}
    if "database" not in down:
        try:
            from agentq.db import session_factory
            from agentq.loop.sweeper import backlog as count_backlog
            from agentq.memory import search_backend
            with session_factory(g.settings)() as session:
                backlog = count_backlog(session)
                backend, dims = search_backend(session)
                search = {"memory_search": {"backend": backend, "hnsw_dimensions": dims}}
        except Exception:  # noqa: BLE001 - an informative field, never a reason to fail
            log.warning("backlog unreadable", exc_info=True)
    if down:
        response = jsonify({"status": "unavailable", "down": sorted(down),
                            "backlog": {"unclaimed_jobs": backlog}, **search,
                            **({"modules": modules} if modules else {}),
                            "error": {"code": "not_ready",
                                      "message": "Not ready: " + ", ".join(sorted(down))
                                                 + " not available.",
                                      "details": down}})
        response.status_code = 503
        return response
    # backlog: jobs re-driven that no worker took: something should be consuming and is not
    return jsonify({"status": "ok", "backlog": {"unclaimed_jobs": backlog}, **search,
                    **({"modules": modules} if modules else {})})


def _modules() -> dict[str, dict]:
    """Each external tool module's health, shown when there are any (an unhealthy module
    does not make agentq unready: its tools are just not offered)."""
    try:
        from agentq.tools.registry import get_registry
        remote = get_registry(g.settings).remote
        known = remote.known() if remote else {}
    except Exception as exc:  # noqa: BLE001 - the database is down: reported above
        log.warning("module health not read", extra={"error": type(exc).__name__})
        return {}
    # the global modules and the default tenant's (the operator's) only: this route has no
    # key, and another tenant's module is its own
    from agentq.tenants import DEFAULT_TENANT_ID
    return {name: {"kind": k.spec.kind, "status": k.health.get("status", "unknown"),
                   "error": k.health.get("error")} for name, k in sorted(known.items())
            if k.spec.visible_to(DEFAULT_TENANT_ID)}
