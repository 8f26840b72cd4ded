"""gunicorn's settings for the web process (read from the working directory).

A request header up to this size reaches the app, which refuses one longer than
AGENTQ_MAX_HEADER_BYTES (8 KiB by default) with a 431 in the API's error shape; gunicorn's
own limit (8190 bytes by default) would answer with an HTML page instead.
"""
limit_request_field_size = 65536


def child_exit(_server, worker):
    """A web worker that ended leaves no live gauge behind (prometheus multiprocess mode)."""
    from agentq import metrics
    metrics.mark_process_dead(worker.pid)
