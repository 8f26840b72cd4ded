"""One handler renders every error into API.md's shape: {"error": {code, message, details}}."""
from __future__ import annotations

import logging

from flask import Flask, jsonify
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException

from agentq.db import DATABASE_UNREACHABLE
from agentq.errors import ClientError

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str, details: dict | None = None):
    response = jsonify({"error": {"code": code, "message": message, "details": details or {}}})
    response.status_code = status
    return response


RETRY_AFTER_S = 5
"""What a 503 asks the client to wait: about one Postgres restart or broker reconnect."""


def unavailable_dependency(exc: BaseException | None) -> str | None:
    """`database` or `broker` when `exc` (or what caused it) says that one is unreachable;
    None for any other error (a bug stays a 500)."""
    from sqlalchemy import exc as sa_exc
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DATABASE_UNREACHABLE) or (
                isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated):
            return "database"
        try:
            import kombu.exceptions
            import redis.exceptions
            if isinstance(exc, (kombu.exceptions.OperationalError,
                                redis.exceptions.ConnectionError,
                                redis.exceptions.TimeoutError)):
                return "broker"
        except ImportError:  # pragma: no cover - both ship with celery[redis]
            pass
        exc = exc.__cause__ or exc.__context__
    return None


def unavailable_response(what: str):
    """503 in the error shape with Retry-After: nothing was done; the same request (with
    the same Idempotency-Key, for a submit) may be sent again after the wait."""
    response = error_response(
        503, "unavailable",
        f"The service is briefly unavailable (its {what} cannot be reached); the request "
        f"was not completed. Retry after {RETRY_AFTER_S} s; a submit retried with the same "
        "Idempotency-Key creates its job once.",
        {"unavailable": what, "retry_after_s": RETRY_AFTER_S})
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def register(app: Flask) -> None:
    @app.errorhandler(ClientError)
    def _client(exc: ClientError):
        response = error_response(exc.status, exc.code, exc.message, exc.details)
        retry_after_s = getattr(exc, "retry_after_s", None)
        if retry_after_s is not None:  # a 429's wait (RFC 9110 Retry-After)
            response.headers["Retry-After"] = str(retry_after_s)
        return response

    @app.errorhandler(ValidationError)
    def _validation(exc: ValidationError):
        fields = exc.normalized_messages()
        names = ", ".join(sorted(map(str, fields))) if isinstance(fields, dict) else ""
        return error_response(422, "validation_error",
                              f"Invalid field(s): {names}." if names else "Invalid request.",
                              {"fields": fields})

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        code = (exc.name or "error").lower().replace(" ", "_")
        response = error_response(exc.code or 500, code, exc.description or exc.name)
        for name, value in exc.get_headers():  # e.g. 405's Allow (RFC 9110)
            if name.lower() not in ("content-type", "content-length"):
                response.headers[name] = value
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        away = unavailable_dependency(exc)
        if away is not None:
            log.warning("dependency unavailable: %s (%s)", away, type(exc).__name__)
            return unavailable_response(away)
        log.exception("unhandled error")
        return error_response(500, "internal_error", "An internal error occurred.")
