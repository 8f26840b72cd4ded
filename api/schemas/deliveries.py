"""Webhook deliveries (api/deliveries.py): a job's deliveries, and a signing secret shown
once."""
from __future__ import annotations

from marshmallow import Schema, fields, validate

from agentq.loop.states import DeliveryStatus, values


class WebhookSecretSchema(Schema):
    secret = fields.String(required=True, metadata={
        "description": "`whsec_` + base64: shown this once."})


class DeliverySchema(Schema):
    id = fields.String(required=True)
    event_id = fields.String(required=True)
    event_type = fields.String(required=True)
    url = fields.String(required=True)
    attempt = fields.Integer(required=True)
    status = fields.String(required=True,
                           validate=validate.OneOf(values(*DeliveryStatus)))
    status_code = fields.Integer(allow_none=True, required=True)
    latency_ms = fields.Integer(allow_none=True, required=True)
    error = fields.String(allow_none=True, required=True)
    created_at = fields.String(required=True)
    next_attempt_at = fields.String(allow_none=True, required=True)


class DeliveryPageSchema(Schema):
    data = fields.List(fields.Nested(DeliverySchema), required=True)

