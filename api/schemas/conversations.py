"""A conversation's schemas (api/conversations.py): the conversation, its messages, a branch
and an update."""
from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from api.schemas.common import (
    MAX_CONTENT_CHARS,
    CallbackAndMetadata,
    LimitsSchema,
    StrictSchema,
    not_blank,
)


class MessageSchema(Schema):
    id = fields.String()
    seq = fields.Integer()
    role = fields.String()
    content = fields.String()
    job_id = fields.String(allow_none=True)
    model_used = fields.String(allow_none=True)
    created_at = fields.String()


class MessagePageSchema(Schema):
    data = fields.List(fields.Nested(MessageSchema))
    has_more = fields.Boolean()
    next_after = fields.Integer(allow_none=True)


class BranchRequestSchema(CallbackAndMetadata):
    """POST /v1/conversations/<id>/branch: continue from an earlier point with new content."""
    at_message_id = fields.UUID(load_default=None, allow_none=True, metadata={
        "description": "Branch before this message of the conversation: the branch holds "
                       "the messages before it."})
    at_job_id = fields.UUID(load_default=None, allow_none=True, metadata={
        "description": "Branch before this job of the conversation (before its first "
                       "message)."})
    content = fields.String(required=True,
                            validate=[validate.Length(1, MAX_CONTENT_CHARS), not_blank])
    persona_id = fields.UUID(load_default=None, allow_none=True, metadata={
        "description": "Answer as this persona of the key's tenant (404 if it has none "
                       "such); else the conversation's."})
    model = fields.String(load_default=None, allow_none=True, validate=validate.Length(1, 200),
                          metadata={"description": "A non-admin key: the persona's default "
                                                   "model or a configured one."})
    limits = fields.Nested(LimitsSchema, load_default=None, allow_none=True)
    stream = fields.Boolean(load_default=False)

    @validates_schema
    def _one_point(self, data: dict[str, Any], **_kw) -> None:
        if (data.get("at_message_id") is None) == (data.get("at_job_id") is None):
            raise ValidationError("Give exactly one of at_message_id and at_job_id.",
                                  "at_message_id")


class BranchedFromSchema(Schema):
    conversation_id = fields.String(required=True)
    message_id = fields.String(allow_none=True, required=True)


class ConversationSchema(Schema):
    id = fields.String(required=True)
    created_at = fields.String(required=True)
    persona_id = fields.String(allow_none=True, required=True)
    branched_from = fields.Nested(BranchedFromSchema, allow_none=True, required=True, metadata={
        "description": "A branch's source conversation and branch point; null otherwise."})
    active_project = fields.String(allow_none=True, required=True, metadata={
        "description": "The conversation's active project, sent in its context."})


class ConversationUpdateSchema(StrictSchema):
    active_project = fields.String(required=True, allow_none=True,
                                   validate=validate.Length(max=MAX_CONTENT_CHARS), metadata={
                                       "description": "Sent in the context of the "
                                                      "conversation's jobs (null: none)."})


