"""The web front's limits: what one request may send and how long it may take, and how many
connections one web worker holds (api/limits.py, gunicorn.conf.py; docs/security.md). Read
from the environment into `Settings.front`."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class FrontLimits:
    """One request's and one web worker's bounds."""
    # bad input (api/limits.py)
    max_body_bytes: int = 32 * 1024 * 1024
    """AGENTQ_MAX_BODY_BYTES: a request body larger than this is refused (413) unread."""
    max_json_depth: int = 32
    """AGENTQ_MAX_JSON_DEPTH: JSON (a body, a JSONL line) nested deeper than this many
    arrays/objects is refused (400) before it is parsed."""
    max_header_bytes: int = 8192
    """AGENTQ_MAX_HEADER_BYTES: a request header longer than this is refused (431) in the
    API's error shape; gunicorn is started with a larger limit (`gunicorn.conf.py`), so the
    app, not gunicorn's HTML page, answers."""

    # the web front (gunicorn.conf.py: gevent workers)
    header_timeout_s: int = 20
    """AGENTQ_HEADER_TIMEOUT_S: a connection's request head (the first, or the next on a
    kept-alive connection) must arrive whole within this many seconds, else the connection
    is closed. It is gunicorn's `keepalive`, which the gevent worker applies to each request
    head it reads (each head gets up to half of it again, at random, so that connections
    opened together do not all close together: api/web_worker.py); at least 1 (0 would turn
    the bound off)."""
    body_timeout_s: float = 30.0
    """AGENTQ_BODY_TIMEOUT_S: a request body must arrive whole within this many seconds of
    its head, else `408 request_timeout` (gevent workers; api/limits.py)."""
    web_connections: int = 4096
    """AGENTQ_WEB_CONNECTIONS: connections one web worker holds at once (gunicorn's
    `worker_connections`: slow clients, event streams and `?wait` holds included; each costs
    a greenlet, not a thread). Past it, new connections wait in the listen backlog."""
