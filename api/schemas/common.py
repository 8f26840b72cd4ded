"""What the API's schemas share: the strict base of every request body, the validators of
text and callbacks, a job's limits, and the error shape of API.md."""
from __future__ import annotations

import json
import re
from typing import Any

from flask import g, has_app_context
from marshmallow import RAISE, Schema, ValidationError, fields, pre_load, validate, validates

from agentq.config import get_settings
from agentq.errors import ValidationFailed
from agentq.webhooks.urls import FIELD as CALLBACK_FIELD
from agentq.webhooks.urls import check_callback_url

MAX_CONTENT_CHARS = 100_000
MAX_METADATA_BYTES = 16_384
PAGE_SIZE = {"description": "Page size."}
"""A page size query parameter's description (query strings: each field is a query parameter
of the route that loads it, its operation's `query` in api/openapi.py, described by its
`description`)."""


def not_blank(value: str) -> None:
    if not value.strip():
        raise ValidationError("Must not be blank.")


def callback_allowed(value: str | None) -> None:
    """SSRF guard at submit: http(s), and a public address unless the deployment allows
    private ones (the check runs again at each send)."""
    if value is None:
        return
    settings = g.settings if has_app_context() and "settings" in g else get_settings()
    try:
        check_callback_url(value, settings.webhook_allow_private)
    except ValidationFailed as exc:
        raise ValidationError(exc.fields[CALLBACK_FIELD]) from None


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL, unpaired surrogates


def _storable(value: Any) -> bool:
    """Postgres text and JSONB hold neither NUL nor unpaired surrogates (a 500 otherwise)."""
    if isinstance(value, str):
        return not _UNSTORABLE.search(value)
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    return True


class StrictSchema(Schema):
    class Meta:
        unknown = RAISE

    @pre_load
    def _no_unstorable_text(self, data: Any, **_kw) -> Any:
        if isinstance(data, dict) and not _storable(data):
            bad = [k for k, v in data.items() if not (_storable(k) and _storable(v))]
            raise ValidationError({k if isinstance(k, str) and _storable(k) else "_schema":
                                   ["Must not contain NUL (\\u0000) or unpaired surrogate "
                                    "characters."] for k in bad})
        return data


class LimitsSchema(StrictSchema):
    """Per-job execution limits (seed 001); the smaller of these, the persona's and the
    settings' applies."""
    max_iterations = fields.Integer(load_default=None, allow_none=True,
                                    validate=validate.Range(min=1, max=200))
    max_tokens = fields.Integer(load_default=None, allow_none=True,
                                validate=validate.Range(min=1, max=10**12))
    max_seconds = fields.Float(load_default=None, allow_none=True,
                               validate=validate.Range(min=0.1, max=7 * 86400),
                               allow_nan=False)


class AppliedLimitsSchema(Schema):
    """The limits that apply to a job (the job object's `limits_applied`): each the
    smallest of the request's, the persona's and the settings' (the settings' may lie
    outside a request's ranges), null where none sets it."""
    max_iterations = fields.Integer(allow_none=True)
    max_tokens = fields.Integer(allow_none=True)
    max_seconds = fields.Float(allow_none=True)


class CallbackAndMetadata(StrictSchema):
    """A webhook on the job's end, and metadata echoed back (messages, schedules)."""
    callback_url = fields.Url(load_default=None, allow_none=True, schemes={"http", "https"})
    metadata = fields.Dict(keys=fields.String(), load_default=dict)

    @validates("metadata")
    def _metadata_size(self, value: dict[str, Any], **_kw) -> None:
        if len(json.dumps(value)) > MAX_METADATA_BYTES:
            raise ValidationError(f"Must be at most {MAX_METADATA_BYTES} bytes as JSON.")

    @validates("callback_url")
    def _callback_url_allowed(self, value: str | None, **_kw) -> None:
        callback_allowed(value)


class ErrorBodySchema(Schema):
    code = fields.String()
    message = fields.String()
    details = fields.Dict()


class ErrorSchema(Schema):
    error = fields.Nested(ErrorBodySchema)
