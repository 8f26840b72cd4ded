"""The web process's entry point: `gunicorn api.wsgi:app`."""
import sys

from agentq import logs
from agentq.config import get_settings
from api import create_app

WEB_BACKEND_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5,
                            "interval_max": 0.5}
"""Celery's Redis result backend retries a lost connection 20 times, a second apart: in a
worker that rides out a Redis restart, but a submit answered by the web process while Redis
is away would hang ~20 s (the job is already committed; the sweeper sends it later). The
web process gives up at once instead."""


def _bounded_backend_retries() -> None:
    if get_settings().embedded_broker:
        return
    from tasks.app import app as celery_app
    options = dict(celery_app.conf.result_backend_transport_options or {})
    options["retry_policy"] = WEB_BACKEND_RETRY_POLICY
    celery_app.conf.result_backend_transport_options = options


def _green() -> bool:
    """Under gunicorn's gevent worker (gunicorn.conf.py), which patched the standard library
    before importing this module, psycopg2 is made to wait through gevent (psycogreen), as
    in the orchestrator's gevent pool (tasks/pools.py): else one greenlet's query would stop
    every other connection of the worker. Before any connection is made."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("socket"):
        return False
    from psycogreen.gevent import patch_psycopg

    from agentq.db import dispose_engines
    patch_psycopg()
    dispose_engines()
    return True


def _one_result_backend() -> None:
    """Celery keeps a result backend per thread, and under gevent a greenlet is a thread:
    one for the process instead (tasks/pools.py says why)."""
    if get_settings().embedded_broker:
        return
    from tasks.app import app as celery_app
    celery_app.conf.result_backend_thread_safe = True


green = _green()
logs.configure(get_settings().log_level)
app = create_app()  # first: it names this process's traces (importing tasks.app would not)
_bounded_backend_retries()
if green:
    _one_result_backend()
