"""The orchestrator's pool: Celery's thread pool (the default) or gevent's, chosen by
AGENTQ_ORCHESTRATOR_POOL (`agentq worker orchestrator` passes it to Celery as `-P`; why
threads are the default, and what gevent needs installed: agentq.config.pool).

Under `-P gevent` Celery monkey-patches the standard library before it imports anything
else (`celery.maybe_patch_concurrency`), so what we wait on in Python becomes cooperative
with no change of ours: sockets (Redis, the model server through httpx), `threading` locks,
conditions and events (the provider gate's client, the event hub, the lease keepers, the
metrics), `queue`, `time.sleep`; our own background threads become greenlets. psycopg2 is
the exception: libpq waits on its socket in C, where no patch reaches, so one greenlet's
query would stop every other greenlet of the process. psycogreen's `patch_psycopg` makes
psycopg2 wait through gevent's hub instead; `cooperate()` applies it at `worker_init`
(tasks/app.py), before the worker makes any connection, and only under the gevent pool.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

FILES_BESIDES_SLOTS = 256
"""Files an orchestrator keeps open besides one socket per slot waiting on a model: its
database and broker connections, its logs, the interpreter's own."""


def room_for(slots: int) -> tuple[int, int]:
    """Raise this process's soft limit of open files to what `slots` model calls in flight
    need, as far as the hard limit allows: (the soft limit now, what is needed). A service
    manager's default soft limit is often 1,024, which an orchestrator's thousands of
    waiting sockets would run past (EMFILE); it calls this once ready (tasks/app.py)."""
    import resource
    needed = slots + FILES_BESIDES_SLOTS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft, needed
    raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if raised > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    return raised, needed


def open_files_warning(slots: int) -> str | None:
    """What an orchestrator says once it is ready, having made room for its slots' sockets
    (`room_for`), when the open files allowed are fewer than they need; else None."""
    files, needed = room_for(slots)
    if files >= needed:
        return None
    return (f"open files limited to {files}: {slots} slots need {needed} (raise the hard "
            f"limit: ulimit -Hn, systemd's LimitNOFILE)")


def is_gevent(pool_cls: str | type) -> bool:
    """Whether a worker's pool (a name such as `gevent`, or the class) is gevent's."""
    from celery.concurrency import get_implementation
    return get_implementation(pool_cls).__module__ == "celery.concurrency.gevent"


def cooperate(app: Celery) -> None:
    """Make psycopg2 wait through gevent (this process's connections made after this), and
    give the process one Celery result backend instead of one per greenlet."""
    from gevent import monkey
    if not monkey.is_module_patched("socket"):
        raise RuntimeError("the gevent pool runs on a patched standard library: start the "
                           "worker with `agentq worker` or `celery … worker -P gevent`")
    from psycogreen.gevent import patch_psycopg

    from agentq.db import dispose_engines
    patch_psycopg()
    dispose_engines()  # a connection made before the patch would still block the process
    # Celery keeps a result backend per thread unless told it is thread-safe, and under
    # gevent a thread is a greenlet: every task built its own (a Redis client, a pub/sub
    # subscription per chord header task), and a step that dispatched a chord left behind
    # that backend's result drainer, a greenlet polling its own pub/sub connection forever:
    # two Redis connections more per chord, never closed (946 after 450 one-tool jobs, when
    # a turn of one call was still a chord).
    # One backend for the process: celery 5.7's Redis result consumer serialises its
    # pub/sub use between threads and greenlets, and its one drainer resolves the results.
    app.conf.result_backend_thread_safe = True


def describe() -> str | None:
    """A line for the log once the worker is ready (logging is set up after worker_init):
    how psycopg2 waits, under the gevent pool; None otherwise."""
    from gevent import monkey
    if not monkey.is_module_patched("socket"):
        return None
    import psycopg2.extensions
    if psycopg2.extensions.get_wait_callback() is None:
        return "gevent pool: psycopg2 BLOCKS the process (psycogreen not applied)"
    return "gevent pool: psycopg2 waits through gevent (psycogreen)"
