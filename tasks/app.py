"""The Celery app: broker, backend, routing and the reliability defaults, set once.

Late acks and reject-on-worker-lost: a task whose worker dies is delivered again, and our
steps and tool calls are idempotent, so that is safe. Prefetch 1: a long task never holds
others hostage in a worker's buffer. Results (chords) kept at least a day.
"""
from __future__ import annotations

from celery import Celery, signals

from agentq import logs
from agentq.config import Settings, get_settings

ORCHESTRATOR_QUEUE = "orchestrator"
MAINTENANCE_QUEUE = "maintenance"
WEBHOOKS_QUEUE = "webhooks"
REDIS_VISIBILITY_TIMEOUT_S = 3600


def make_celery(settings: Settings) -> Celery:
    app = Celery("agentq", broker=settings.broker_url, backend=settings.result_backend_url,
                 include=["tasks.orchestrator", "tasks.tools", "tasks.maintenance",
                          "tasks.webhooks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=ORCHESTRATOR_QUEUE,
        task_routes={"orchestrator.*": {"queue": ORCHESTRATOR_QUEUE},
                     "maintenance.*": {"queue": MAINTENANCE_QUEUE},
                     "webhooks.*": {"queue": WEBHOOKS_QUEUE}},
        task_serializer="json", result_serializer="json", accept_content=["json"],
        result_expires=settings.result_expires_s,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": REDIS_VISIBILITY_TIMEOUT_S},
        result_backend_transport_options={"visibility_timeout": REDIS_VISIBILITY_TIMEOUT_S},
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        beat_schedule={"sweep": {"task": "maintenance.sweep",
                                 "schedule": settings.sweep_interval_s,
                                 "options": {"queue": MAINTENANCE_QUEUE,
                                             "expires": settings.sweep_interval_s}},
                         "sweep-webhooks": {"task": "maintenance.sweep_webhooks",
                                            "schedule": settings.sweep_interval_s,
                                            "options": {"queue": MAINTENANCE_QUEUE,
                                                        "expires": settings.sweep_interval_s}}},
        timezone="UTC",
        # Results are needed only to join a chord; without chords nothing reads them.
        task_ignore_result=settings.tool_join != "chord",
    )
    return app


@signals.setup_logging.connect
def _setup_logging(**_kwargs) -> None:
    logs.configure(get_settings().log_level)


@signals.worker_process_init.connect
def _after_fork(**_kwargs) -> None:
    """A forked pool process must not share the parent's database connections."""
    from agentq.db import dispose_engines
    dispose_engines()


app = make_celery(get_settings())
