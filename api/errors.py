"""One handler renders every error into API.md's shape: {"error": {code, message, details}}."""
from __future__ import annotations

import logging

from flask import Flask, jsonify
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException

from agentq.errors import ClientError

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str, details: dict | None = None):
    response = jsonify({"error": {"code": code, "message": message, "details": details or {}}})
    response.status_code = status
    return response


def register(app: Flask) -> None:
    @app.errorhandler(ClientError)
    def _client(exc: ClientError):
        return error_response(exc.status, exc.code, exc.message, exc.details)

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
        log.exception("unhandled error")
        return error_response(500, "internal_error", "An internal error occurred.")
