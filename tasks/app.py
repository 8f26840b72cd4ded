"""The Celery app: broker, backend, routing and the reliability defaults, set once.

Late acks and reject-on-worker-lost: a task whose worker dies is delivered again, and our
steps and tool calls are idempotent, so that is safe. Prefetch 1: a long task never holds
others hostage in a worker's buffer. Results (chords) kept at least a day.

On RabbitMQ (`amqp://`, DESIGN 1.2) every queue is a durable quorum queue bound to a topic
exchange, with publisher confirms and heartbeats: see `rabbitmq_settings`.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

from celery import Celery, signals
from celery.result import AsyncResult
from kombu import Exchange, Queue

from agentq import logs
from agentq.config import Settings, get_settings
from agentq.db import make_sqlite_folder
from tasks import metrics, names, tracing
from tasks.names import MAINTENANCE_QUEUE, ORCHESTRATOR_QUEUE, WEBHOOKS_QUEUE

REDIS_VISIBILITY_TIMEOUT_S = 3600
QUORUM = {"x-queue-type": "quorum"}
AMQP_HEARTBEAT_S = 30


def is_amqp(broker_url: str) -> bool:
    return broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))


def rabbitmq_settings() -> dict[str, Any]:
    """The Celery settings of a RabbitMQ broker (docs/deploying.md says why each).

    - Quorum queues (replicated, durable; the type RabbitMQ recommends for data that must
      not be lost): the three fixed queues are declared so, and every other queue Celery
      creates on the fly (each module's `tools.<module>` and `tools.slow.<module>`, named
      by a worker's -Q or by a send) too (`task_create_missing_queue_type`). Celery sees
      quorum queues and turns off global QoS (they do not support it: prefetch stays per
      consumer, fixed at the pool's size x 1).
    - Topic exchanges, not Celery's default direct ones: a countdown or ETA (a step that
      waits for its provider's Retry-After, a webhook's retry) then goes through Celery's
      native delayed delivery (RabbitMQ's TTL and dead-letter queues, `celery_delayed_*`)
      instead of sitting unacknowledged in a worker's memory, which on a quorum queue
      would hold one of its few prefetch slots until the ETA.
    - Publisher confirms: a send returns once RabbitMQ has the message (replicated), so
      a job the API answered 202 for is in the queue, or the send raised and the sweeper
      re-drives it from Postgres.
    - Heartbeats every 30 s: a dead TCP peer (a machine gone, a link cut) is noticed in
      about a minute rather than at the kernel's keepalive (hours).
    """
    return {
        "task_queues": tuple(Queue(name, Exchange(name, type="topic"), routing_key=name,
                                   durable=True, queue_arguments=QUORUM)
                             for name in (ORCHESTRATOR_QUEUE, MAINTENANCE_QUEUE,
                                          WEBHOOKS_QUEUE)),
        "task_default_queue_type": "quorum",
        "task_default_exchange_type": "topic",
        "task_create_missing_queue_type": "quorum",
        "task_create_missing_queue_exchange_type": "topic",
        "broker_native_delayed_delivery_queue_type": "quorum",
        "worker_detect_quorum_queues": True,
        "broker_transport_options": {"confirm_publish": True},
        "broker_heartbeat": AMQP_HEARTBEAT_S,
        # a publish that meets a lost connection is retried on a new one (bounded: the
        # caller then sees the error; a committed job is re-driven by the sweeper)
        "task_publish_retry": True,
        "task_publish_retry_policy": {"max_retries": 3, "interval_start": 0.2,
                                      "interval_step": 0.5, "interval_max": 1.0},
    }


def module_queue_declaration(celery_app: Celery) -> dict[str, Any]:
    """The arguments of `control.add_consumer` that make a module queue added at run time
    the same queue a sender declares (on RabbitMQ: quorum, on its topic exchange;
    `add_consumer` alone would declare a classic queue on a direct exchange, and
    RabbitMQ refuses a queue declared twice with different arguments)."""
    if not is_amqp(str(celery_app.conf.broker_url or "")):
        return {}
    return {"exchange_type": "topic",
            "options": {"queue_arguments": dict(QUORUM), "durable": True}}


def _every(task: str, interval_s: float, min_expires_s: float = 0.0) -> dict[str, Any]:
    """A beat entry: `task` on the maintenance queue every `interval_s`, by name; a run
    not started within its interval is dropped (the next one does its work); nothing reads
    its result."""
    return {"task": task, "schedule": interval_s,
            "options": {"queue": MAINTENANCE_QUEUE, "expires": max(min_expires_s, interval_s),
                        "ignore_result": True}}


class AgentqCelery(Celery):
    """Celery, with countdowns and ETAs on RabbitMQ sent in whole seconds, rounded up.

    Native delayed delivery (what quorum queues need, celery 5.7.0) routes a delay through
    `calculate_routing_key(int(countdown))`: under a second that is 0 and it raises
    ValueError("countdown must be a positive number"), so the send failed (a provider's
    Retry-After of 0.5 s, a webhook retry 0.2 s later); above, the fraction is cut off and
    the message arrives early, to be held in the worker until its ETA, in one of its
    prefetch slots (fixed on quorum queues: a held message is a step that cannot start).
    Rounded up, a delayed message arrives when it is due, at most a second late, and runs
    at once."""

    def send_task(  # type: ignore[override]  # the same call, its many keywords passed on in **options
            self, name: str, args: Sequence[Any] | None = None,
            kwargs: dict[str, Any] | None = None, countdown: float | None = None,
            eta: datetime | None = None, **options: Any) -> AsyncResult[Any]:
        if (countdown or eta) and is_amqp(str(self.conf.broker_url or "")):
            countdown, eta = _whole_seconds(self, countdown, eta)
        return super().send_task(name, args, kwargs, countdown=countdown, eta=eta,
                                 **options)


def _whole_seconds(celery_app: Celery, countdown: float | None,
                   eta: datetime | str | None) -> tuple[float | None, None]:
    import math

    from celery.utils.time import maybe_make_aware
    if eta is not None:
        if isinstance(eta, str):
            eta = datetime.fromisoformat(eta)
        remaining = (maybe_make_aware(eta) - celery_app.now()).total_seconds()
    else:
        remaining = float(countdown or 0)
    if remaining <= 0:
        return None, None  # due now
    return float(math.ceil(remaining)), None


def make_celery(settings: Settings) -> Celery:
    broker = settings.broker_url
    if settings.embedded_broker:  # the in-memory broker, woken by each put (no 1 s polling)
        from tasks import embedded_transport
        broker = embedded_transport.register()
    make_sqlite_folder(settings.result_backend_url)  # the embedded defaults' results file
    app = AgentqCelery("agentq", broker=broker, backend=settings.result_backend_url,
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
        # a task in flight when the broker goes away runs to its end (its result is stored
        # in Postgres; the redelivered copy finds it there: agentq.loop.execute) rather than
        # being cancelled half-way, which would leave a not idempotent call interrupted
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # survives a broker restart with tasks in flight (see tasks/consumer.py)
        worker_consumer="tasks.consumer:Consumer",
        broker_transport=("tasks.consumer:Transport"
                          if settings.broker_url.startswith("redis://") else None),
        beat_schedule={
            "sweep": _every(names.SWEEP, settings.sweep_interval_s),
            "sweep-webhooks": _every(names.SWEEP_WEBHOOKS, settings.sweep_interval_s),
            "summarize-idle": _every(names.SUMMARIZE_IDLE, settings.memory_digest_interval_s,
                                     min_expires_s=5.0),
            "fire-schedules": _every(names.FIRE_SCHEDULES, settings.schedule_interval_s,
                                     min_expires_s=5.0)},
        timezone="UTC",
        # Results are needed only to join a chord; without chords nothing reads them. With
        # chords only the header's (tools.execute) are read: each sender says which it
        # wants (`ignore_result`, tasks/names.py).
        task_ignore_result=settings.tool_join != "chord",
    )
    if is_amqp(settings.broker_url):
        app.conf.update(rabbitmq_settings())
    return app


@signals.setup_logging.connect
def _setup_logging(**_kwargs: Any) -> None:
    logs.configure(get_settings().log_level)


@signals.worker_init.connect
def _gevent_pool(sender: Any = None, **_kwargs: Any) -> None:
    """Under the gevent pool (AGENTQ_ORCHESTRATOR_POOL=gevent): psycopg2 waits through
    gevent and the result backend is one per process, set before the worker makes any
    connection (tasks/pools.py)."""
    from tasks import pools
    if sender is not None and pools.is_gevent(sender.pool_cls):
        pools.cooperate(sender.app)


@signals.worker_init.connect
def _declare_rabbitmq_queues(sender: Any = None, **_kwargs: Any) -> None:
    """On RabbitMQ, every worker declares the three fixed queues (and their exchanges)
    before its consumer starts: Celery's delayed-delivery step then binds each of them to
    the delayed-delivery exchange in every worker, whichever started first (it binds, it
    does not declare: a queue no worker had declared yet was an error in the log). Where
    the broker is away, the consumer's own reconnect takes over."""
    if sender is None or not is_amqp(str(sender.app.conf.broker_url or "")):
        return
    import logging
    try:
        with sender.app.connection_for_write() as conn:
            conn.connect()  # one attempt: a broker away is the consumer's to wait for
            channel = conn.default_channel
            for queue in sender.app.conf.task_queues or ():
                queue.bind(channel).declare()
    except Exception as exc:  # noqa: BLE001 - the consumer connects (and retries) next
        logging.getLogger(__name__).warning(
            "queues not declared at start", extra={"error": type(exc).__name__})


@signals.worker_init.connect
def _sandbox_at_start(sender: Any = None, **_kwargs: Any) -> None:
    """The tools-slow worker sets up the code sandbox before its pool forks: itself not
    dumpable, the cgroup v2 delegation its runs' groups are made in (agentq.tools.cgroups).
    Where that cannot be done it says why and runs no code (`sandbox_unavailable`)."""
    kind = (getattr(sender, "hostname", "") or "").partition("@")[0]
    if kind == "tools-slow":
        from agentq.tools import sandbox
        sandbox.prepare()


@signals.worker_ready.connect
def _describe_pool(sender: Any = None, **_kwargs: Any) -> None:
    """Under gevent, how psycopg2 waits; an orchestrator makes room for a socket per slot and
    says what it lacks (tasks/pools.py)."""
    import logging

    from tasks import pools
    if sender is None:
        return
    log = logging.getLogger("tasks.pools")
    controller = sender.controller
    if pools.is_gevent(controller.pool_cls):
        log.info(pools.describe())
    if str(controller.hostname or "").startswith("orchestrator@"):
        line = pools.open_files_warning(int(controller.concurrency))
        if line is not None:
            log.warning(line)


@signals.worker_process_init.connect
def _after_fork(**_kwargs: Any) -> None:
    """A forked pool process must not share the parent's database connections."""
    from agentq.db import dispose_engines
    dispose_engines()
    tracing.after_fork()


@signals.worker_ready.connect
def _follow_module_queues(sender: Any = None, **_kwargs: Any) -> None:
    """A tools worker consumes the queue of every module offered now, and follows modules
    registered or removed while it runs (HTTP modules and MCP servers)."""
    hostname = getattr(sender, "hostname", "") or ""
    kind = hostname.partition("@")[0]
    if kind not in ("tools", "tools-slow"):
        return
    start_module_watcher(sender.app, hostname, ("slow",) if kind == "tools-slow" else ("fast",))


def start_module_watcher(celery_app: Celery, hostname: str, speeds: tuple[str, ...]) -> None:
    """Follow the module queues of these speeds (`fast`, `slow`) in a daemon thread."""
    import threading
    threading.Thread(target=_watch_modules, args=(celery_app, hostname, speeds),
                     name="module-queues", daemon=True).start()


def _watch_modules(celery_app: Celery, hostname: str, speeds: tuple[str, ...]) -> None:
    import logging
    import time

    from agentq.tools.registry import get_registry
    log = logging.getLogger("agentq.modules")
    settings = get_settings()
    registry = get_registry(settings)

    def queues() -> set[str]:
        return {q for speed in speeds for q in registry.all_queues(slow=speed == "slow")}
    consumed = queues()
    local = {q for q in consumed if q.rpartition(".")[2] in registry.local_module_names}
    while True:
        time.sleep(max(settings.module_sync_s, 0.5))
        try:
            wanted = queues()
            for queue in sorted(wanted - consumed):
                celery_app.control.add_consumer(queue, destination=[hostname], reply=False,
                                                **module_queue_declaration(celery_app))
                log.info("consuming module queue", extra={"queue": queue})
            for queue in sorted(consumed - wanted - local):
                celery_app.control.cancel_consumer(queue, destination=[hostname], reply=False)
                log.info("stopped consuming module queue", extra={"queue": queue})
            consumed = wanted | local
        except Exception as exc:  # noqa: BLE001 - the broker or database is away: try again next time
            log.warning("module queues not updated", extra={"error": type(exc).__name__})


metrics.install()
app = make_celery(get_settings())
tracing.configure("worker")
