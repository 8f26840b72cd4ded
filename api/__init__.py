"""The thin Flask API: `create_app(settings=None)` builds it."""
from __future__ import annotations

from flask import Flask, g
from flask.json.provider import DefaultJSONProvider

from agentq.config import Settings, get_settings, set_settings


class _UnsortedJSON(DefaultJSONProvider):
    sort_keys = False
    """Bodies keep the order their view wrote them in."""


def create_app(settings: Settings | None = None) -> Flask:
    if settings is not None:
        set_settings(settings)
    settings = get_settings()
    app = Flask("agentq", static_folder=None)
    app.config["JSON_SORT_KEYS"] = False
    app.json = _UnsortedJSON(app)

    @app.before_request
    def _bind_settings() -> None:
        g.settings = settings

    from api import limits, ratelimit, ui
    limits.register(app, settings.front.max_body_bytes, ui.QUERY_PARAMETERS)
    ratelimit.register(app, settings)

    from agentq.loop.store import on_events
    from agentq.notify import hub_for
    from api import (
        admin,
        batches,
        conversations,
        deliveries,
        embed,
        errors,
        files,
        health,
        jobs,
        metrics,
        modules,
        schedules,
        ui,
    )
    on_events(hub_for(settings).publish)  # committed events reach streams and waits
    from tasks import metrics as recording
    recording.install()
    from tasks import tracing
    if tracing.configure("api"):  # the API's sends carry the trace to the workers
        from opentelemetry.instrumentation.flask import FlaskInstrumentor
        FlaskInstrumentor().instrument_app(app, excluded_urls="health,metrics")
    import tasks.dispatch  # noqa: F401  (after the tracing: this process's effect dispatcher)
    errors.register(app)
    for module in (jobs, conversations, files, health, embed, deliveries, batches, admin,
                   metrics, modules, schedules, ui):
        app.register_blueprint(module.bp)
    from api import openapi
    app.register_blueprint(openapi.bp)
    return app
