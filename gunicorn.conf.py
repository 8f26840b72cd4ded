"""gunicorn's settings for the web process (read from the working directory).

A front that slow clients cannot stop (docs/security.md, "The web front"):

* gevent workers: each connection is a greenlet, not a thread, so thousands of slow or
  half-open connections, event streams and `?wait` holds cost memory, not the request
  threads everyone else needs (with gthread's 2 x 8 threads, 100 connections sending half a
  request head left /health unanswered for as long as they were held). psycopg2 is made to
  wait through gevent (api/wsgi.py); Redis and the broker go through patched sockets.
* each request head must arrive whole within AGENTQ_HEADER_TIMEOUT_S: the gevent worker
  reads every head (a new connection's first too) under `gevent.Timeout(keepalive)`
  (gunicorn/workers/base_async.py `handle`, ggevent `timeout_ctx`), so `keepalive` IS the
  header timeout there, and is never 0 (which would turn it off); api/web_worker.py gives
  each head up to half of it again, at random, so that connections opened together are not
  all closed (and opened again by the client) together. A body must arrive within
  AGENTQ_BODY_TIMEOUT_S (api/limits.py).
* AGENTQ_WEB_CONNECTIONS connections per worker (gunicorn's default is 1,000), and the
  open-files limit raised to its hard limit so that many sockets can be held.

Oversize or malformed requests get the API's error shape, whoever refuses them:

* gunicorn's own limits are set above the app's, so that what a client normally sends too
  much of reaches the app, which refuses it naming the problem (api/limits.py): a header
  longer than AGENTQ_MAX_HEADER_BYTES (8 KiB by default) or more than api.limits.MAX_HEADERS
  headers is a 431 in the error shape;
* they stay bounded (gunicorn buffers a request's head in memory, up to about
  limit_request_fields x limit_request_field_size), and a request line is never let past
  8190 bytes (gunicorn's maximum; 0 would mean an unbounded line). What gunicorn refuses
  itself -- a longer request line (414), a header past 128 KiB or more than 150 headers
  (431), a request line or header it cannot parse (400) -- is answered by `error_response`
  below in the same JSON shape, not gunicorn's HTML page.
"""
import json
import resource

from gunicorn import util

from agentq.config import Settings

_settings = Settings.from_env()

worker_class = "api.web_worker.Worker"  # gevent's, the head deadline spread out
worker_connections = _settings.front.web_connections
keepalive = _settings.front.header_timeout_s
timeout = 30  # a worker whose event loop is blocked this long is restarted (the heartbeat)
graceful_timeout = 10  # on a stop or restart, open streams are cut after this

limit_request_line = 8190
limit_request_field_size = 128 * 1024
limit_request_fields = 150

_CODES = {400: "bad_request", 403: "forbidden", 414: "uri_too_long",
          417: "expectation_failed", 431: "header_too_large", 500: "internal_error",
          501: "not_implemented"}


def error_response(sock, status_int, reason, mesg):
    """gunicorn's `util.write_error`, answering in the API's error shape (API.md)."""
    code = _CODES.get(status_int) or reason.lower().replace(" ", "_")
    message = (f"{reason}: {mesg}" if mesg else reason)[:500]
    if status_int >= 500 and status_int != 501:
        message = "An internal error occurred."
    body = json.dumps({"error": {"code": code, "message": message, "details": {}}}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


util.write_error = error_response


def child_exit(_server, worker):
    """A web worker that ended leaves no live gauge behind (prometheus multiprocess mode)."""
    from agentq import metrics
    metrics.mark_process_dead(worker.pid)


def on_starting(_server):
    """Every connection is a file descriptor: raise the soft open-files limit to the hard
    one (the web process may hold workers x AGENTQ_WEB_CONNECTIONS sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # e.g. an infinite hard limit the kernel caps lower
            pass
