"""Bad input never becomes a 5xx: limits checked before anything is parsed.

- A body larger than `max_body_bytes` is refused (413) from its Content-Length, unread
  (Flask's MAX_CONTENT_LENGTH also stops a chunked body that grows past it).
- JSON (a body, a JSONL line) nested deeper than `max_json_depth` is refused (400) before
  `json.loads` sees it: the decoder recurses once a level, and Postgres' JSONB and the
  response encoder have their own limits.
- A header longer than `max_header_bytes`, or more than MAX_HEADERS headers, is refused
  (431) in the error shape; gunicorn is configured with larger limits (gunicorn.conf.py) so
  the app is the one that answers, and what gunicorn still refuses itself (a request line
  over 8190 bytes, a head past its larger limits) it answers in the same shape.
- A query parameter the route does not take (it is not in the route's OpenAPI entry) is
  refused (400), never ignored.
"""
from __future__ import annotations

import json
import re
import sys
from typing import Any, Mapping
from urllib.parse import unquote_to_bytes

from flask import Flask, current_app, g, request

from agentq.errors import (
    BadEncoding,
    BadJson,
    ClientError,
    HeaderTooLarge,
    PayloadTooLarge,
    UnknownQueryParameter,
)

UI_QUERIES = "agentq_ui_queries"
"""The app's extension holding the dashboard pages' query parameters (`register`)."""
MAX_HEADERS = 100
"""Headers one request may have (gunicorn.conf.py lets up to 150 through to be refused
here)."""


class TooManyHeaders(ClientError):
    status = 431
    code = "too_many_headers"

    def __init__(self, count: int, limit: int):
        super().__init__(f"The request has {count} headers; the limit is {limit}.",
                         count=count, limit=limit)

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r'[^\[\]{}]+')
_EMPTY_PAIR = re.compile(r'\[\]|\{\}')


def check_depth(text: str, limit: int, where: str = "The body") -> None:
    """Raise BadJson when `text` nests arrays/objects deeper than `limit`.

    Strings are cut out, then innermost empty pairs are removed one level a pass (each
    pass a C-speed regex): a document within the limit is gone after `limit` passes."""
    if text.count("[") + text.count("{") <= limit:
        return
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for _ in range(limit):
        reduced = _EMPTY_PAIR.sub("", brackets)
        if reduced == brackets:
            break
        brackets = reduced
    if not brackets:
        return
    if (brackets.count("[") == brackets.count("]")
            and brackets.count("{") == brackets.count("}")):
        raise BadJson(f"{where} is nested deeper than {limit} levels of arrays and objects.",
                      limit=limit)
    raise BadJson(f"{where} is not JSON: its brackets do not match.")


def parse_json(text: str, limit: int, where: str = "The body", **details: Any) -> Any:
    """JSON from untrusted text: depth first, then the standard decoder."""
    check_depth(text, limit, where)
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError on bytes
        message = getattr(exc, "msg", None) or str(exc)
        raise BadJson(f"{where} is not JSON: {message}.", **details) from None
    except RecursionError:  # unreachable with a sane limit; never a 500
        raise BadJson(f"{where} is nested too deep.", limit=limit) from None


def utf8(data: bytes, where: str = "The body", **details: Any) -> str:
    """`data` decoded as UTF-8, strictly: invalid bytes are a 400 `bad_encoding` naming
    where they are, never text with U+FFFD in their place (Flask's `get_data(as_text=True)`
    replaces them)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadEncoding(f"{where} is not valid UTF-8 (byte {exc.start}: {exc.reason}); "
                          "send UTF-8 text.", encoding="utf-8", position=exc.start,
                          **details) from None


def request_text() -> str:
    """The request body as text: UTF-8, strictly (`utf8`)."""
    return utf8(request.get_data())


def request_json() -> Any:
    """The request body as JSON, within the limits."""
    return parse_json(request_text(), g.settings.front.max_json_depth)


def _allowed_query(rule: str, endpoint: str | None) -> set[str]:
    from api.openapi import operation_of
    if rule.startswith("/ui"):  # the dashboard's pages are outside the spec: their own list
        return current_app.extensions.get(UI_QUERIES, {}).get(rule, set())
    declared = operation_of(current_app.view_functions.get(endpoint or ""))
    return declared.query_names() if declared is not None else set()


class RequestTimeout(ClientError):
    status = 408
    code = "request_timeout"


def read_body_within(seconds: float) -> None:
    """Under gevent (the web process: gunicorn.conf.py), the body must arrive whole within
    `seconds` of the head, else 408 (the connection is then closed): a client sending it a
    byte at a time would otherwise keep its connection, and a slot of the worker's
    AGENTQ_WEB_CONNECTIONS, for as long as it likes. The body is read into the request's
    cache, which everything after reads. Elsewhere (`agentq dev`'s threads) nothing is
    done here."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("socket"):
        return
    import gevent
    deadline = gevent.Timeout(seconds)
    try:
        with deadline:
            request.get_data(cache=True)
    except gevent.Timeout as exc:
        if exc is not deadline:
            raise
        raise RequestTimeout(f"The request body did not arrive whole within {seconds:g} s.",
                             timeout_s=seconds) from None


def check_request() -> None:
    settings = g.settings
    count = len(request.headers)
    if count > MAX_HEADERS:
        raise TooManyHeaders(count, MAX_HEADERS)
    for name, value in request.headers.items():
        if len(value) > settings.front.max_header_bytes:
            raise HeaderTooLarge(name, len(value), settings.front.max_header_bytes)
    length = request.content_length
    if length is not None and length > settings.front.max_body_bytes:
        raise PayloadTooLarge(length, settings.front.max_body_bytes)
    if length or request.headers.get("Transfer-Encoding"):
        read_body_within(settings.front.body_timeout_s)
    if request.query_string:  # werkzeug decodes it with replacement: check it first
        query = utf8(unquote_to_bytes(request.query_string), "The query string")
        if "\x00" in query:  # Postgres takes no NUL in a parameter (a 500 otherwise)
            raise ClientError("The query string holds a NUL character (%00).")
    if request.url_rule is not None and request.method != "OPTIONS" and request.args:
        allowed = _allowed_query(request.url_rule.rule, request.url_rule.endpoint)
        unknown = sorted(set(request.args) - allowed)
        if unknown:
            raise UnknownQueryParameter(unknown, sorted(allowed))


def register(app: Flask, max_body_bytes: int,
             ui_queries: Mapping[str, set[str]] | None = None) -> None:
    """The limits on every request of `app`; `ui_queries`: the query parameters each
    dashboard page takes (`api.ui.QUERY_PARAMETERS`: the pages are outside the spec)."""
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.extensions[UI_QUERIES] = dict(ui_queries or {})
    app.before_request(check_request)
