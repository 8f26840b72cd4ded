"""POST /v1/embed (api/embed.py): the text and the user who pays for it, and the vector."""
from __future__ import annotations

from typing import Any, TypedDict

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from api.schemas.common import StrictSchema, not_blank


class EmbedRequest(TypedDict):
    """What `EmbedRequestSchema` loads: the user is named whole or not at all."""
    text: str
    platform: str | None
    platform_user_id: str | None


class EmbedRequestSchema(StrictSchema):
    text = fields.String(required=True, validate=[validate.Length(1, 100_000), not_blank])
    platform = fields.String(load_default=None, allow_none=True,
                             validate=validate.Length(1, 64), metadata={
                                 "description": "With platform_user_id: the user whose "
                                                "token budget pays (else the key's own "
                                                "user, platform `api_key`)."})
    platform_user_id = fields.String(load_default=None, allow_none=True,
                                     validate=validate.Length(1, 255))

    @validates_schema
    def _user_whole(self, data: dict[str, Any], **_kw) -> None:
        if (data.get("platform") is None) != (data.get("platform_user_id") is None):
            raise ValidationError("Give platform and platform_user_id together, or neither.",
                                  "platform_user_id")


class EmbedResponseSchema(Schema):
    embedding = fields.List(fields.Float())
