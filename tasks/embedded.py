"""The embedded runner: with no broker configured, one process holds the broker (kombu's
in-memory transport), a worker on every queue, and the sweeper; the API runs beside them.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from agentq.config import Settings
from tasks import names
from tasks.names import MAINTENANCE_QUEUE, ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE

log = logging.getLogger(__name__)
EMBEDDED_CONCURRENCY = 16


def all_queues(settings: Settings) -> list[str]:
    from agentq.tools.registry import get_registry
    registry = get_registry(settings)
    return [ORCHESTRATOR_QUEUE, MAINTENANCE_QUEUE, WEBHOOKS_QUEUE,
            *registry.all_queues(slow=False), *registry.all_queues(slow=True)]


class EmbeddedWorker:
    """A Celery worker in a thread of this process, plus a sweeper thread."""

    def __init__(self, settings: Settings):
        if not settings.embedded_broker:
            raise ValueError("the embedded worker needs the in-memory broker")
        from tasks.app import app
        self.settings = settings
        self.app = app
        self.ready = threading.Event()
        self._stop = threading.Event()
        ready = self.ready

        # the app's own WorkController class, made at run time (Celery's subclass_with_self)
        class Controller(app.WorkController):  # type: ignore[misc,name-defined]
            def on_consumer_ready(self, consumer: Any) -> None:
                super().on_consumer_ready(consumer)
                ready.set()
                from tasks.app import start_module_watcher
                start_module_watcher(app, consumer.hostname, ("fast", "slow"))

        self.worker = Controller(
            app=app, pool_cls="threads", concurrency=EMBEDDED_CONCURRENCY,
            queues=all_queues(settings), without_heartbeat=True, without_mingle=True,
            without_gossip=True, loglevel=settings.log_level, hostname="embedded@localhost")

    def start(self, timeout_s: float = 30) -> None:
        from tasks.base import services
        threading.Thread(target=self.worker.start, name="agentq-worker", daemon=True).start()
        services()  # the router (openai SDK), registry and sessions now, not in a job's step
        with self.app.producer_or_acquire() as producer:  # and the publishing connection
            producer.connection.ensure_connection()
        threading.Thread(target=self._sweep_loop, name="agentq-sweeper", daemon=True).start()
        threading.Thread(target=self._schedule_loop, name="agentq-schedules",
                         daemon=True).start()
        if not self.ready.wait(timeout_s):
            log.warning("embedded worker not ready yet")

    def _sweep_loop(self) -> None:
        # a first pass at once: a job left due by an earlier process (its step never sent,
        # its predecessor cancelled) starts now, not an interval later
        while not self._stop.is_set():
            for name in (names.SWEEP, names.SWEEP_WEBHOOKS):
                try:
                    self.app.send_task(name, queue=MAINTENANCE_QUEUE, ignore_result=True)
                except Exception:
                    log.exception("sweep failed", extra={"task": name})
            self._stop.wait(self.settings.sweep_interval_s)

    def _schedule_loop(self) -> None:
        while not self._stop.wait(self.settings.schedule_interval_s):
            try:
                self.app.send_task(names.FIRE_SCHEDULES, queue=MAINTENANCE_QUEUE,
                                   ignore_result=True)
            except Exception:
                log.exception("firing schedules failed")

    def stop(self) -> None:
        self._stop.set()
        self.worker.stop(in_sighandler=False)
