"""GET /metrics: Prometheus' text format, summed over every process of this machine
(tasks/metrics.py; the names are in docs/metrics.md). No key unless AGENTQ_METRICS_TOKEN is
set; then `Authorization: Bearer <token>`."""
from __future__ import annotations

import hmac

from flask import Blueprint, Response, g, request

from agentq.errors import Unauthorized
from api.openapi import operation
from tasks import metrics as recording

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
@operation(
    "metrics", "Prometheus metrics of every process (docs/metrics.md)",
    tags=["health"],
    security=[],
    description="No key unless AGENTQ_METRICS_TOKEN is set; then "
                "`Authorization: Bearer <token>`.",
    responses={
        200: {"description": "Prometheus' text exposition format.",
              "content": {"text/plain": {"schema": {"type": "string"}}}},
    },
    errors=(401,))
def scrape():
    token = g.settings.metrics_token
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise Unauthorized("GET /metrics needs the metrics token "
                               "(Authorization: Bearer <AGENTQ_METRICS_TOKEN>).")
    body, content_type = recording.render(g.settings)
    return Response(body, content_type=content_type)
