"""What the processes' log says, and at which level (agentq.logs.configure)."""
from __future__ import annotations

import logging

import pytest

from agentq import logs


@pytest.fixture
def restored():
    """The root logger and the noisy loggers' levels and handlers, as they were."""
    root = logging.getLogger()
    saved = (root.level, root.handlers[:],
             {name: logging.getLogger(name).level for name in logs.NOISY + logs.PER_TASK})
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def test_celerys_line_per_task_received_and_succeeded_is_not_written_at_info(restored):
    # given the processes' log at its default level
    logs.configure("INFO", to_stderr=False)
    # then Celery's per-task lines are not written (its task failures are)
    for name in ("celery.worker.strategy", "celery.app.trace"):
        logger = logging.getLogger(name)
        assert not logger.isEnabledFor(logging.INFO)
        assert logger.isEnabledFor(logging.ERROR)
    # and our own lines at INFO are
    assert logging.getLogger("agentq.loop.step").isEnabledFor(logging.INFO)


def test_at_debug_celerys_per_task_lines_are_written(restored):
    # given a log asked for at DEBUG (configured once, then again: the level follows)
    logs.configure("INFO", to_stderr=False)
    logs.configure("DEBUG", to_stderr=False)
    # then Celery's per-task lines are written too
    for name in ("celery.worker.strategy", "celery.app.trace"):
        assert logging.getLogger(name).isEnabledFor(logging.INFO)
    # but never the HTTP client's and the SDK's requests
    for name in ("httpx", "httpx2", "openai"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
