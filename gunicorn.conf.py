"""gunicorn's settings for the web process (read from the working directory).

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

from gunicorn import util

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
