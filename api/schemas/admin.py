"""The administration's schemas (api/admin.py, agentq/admin.py): tenants and their quotas,
API keys, personas and their skills, a tenant's context layers, users and their
identities, and token usage."""
from __future__ import annotations

from datetime import timezone
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from agentq.tenants import MAX_QUOTA, QUOTA_NAMES
from api.schemas.common import (
    MAX_CONTENT_CHARS,
    PAGE_SIZE,
    LimitsSchema,
    StrictSchema,
    not_blank,
)

MODULE_NAME = validate.Regexp(r"^[a-z][a-z0-9_]{0,30}$", error="Not a module name.")


class TenantRequestSchema(StrictSchema):
    name = fields.String(required=True, validate=[validate.Length(1, 200), not_blank])


class QuotasSchema(Schema):
    """A tenant's quotas (API.md 1.2); 0 is no limit."""
    requests_per_second = fields.Integer(required=True, metadata={
        "description": "Requests per second per key (429 `rate_limited` past it)."})
    streams_per_key = fields.Integer(required=True, metadata={
        "description": "Open event streams and `?wait` holds per key (429 past it)."})
    running_jobs = fields.Integer(required=True, metadata={
        "description": "Jobs of the tenant running at once; more stay `queued` with "
                       "`waiting_for: quota`."})
    schedules = fields.Integer(required=True, metadata={
        "description": "Active schedules of the tenant (422 `quota_exceeded` past it)."})
    modules = fields.Integer(required=True, metadata={
        "description": "Tool modules the tenant registered (422 `quota_exceeded` past it)."})
    tool_calls_per_turn = fields.Integer(required=True, metadata={
        "description": "Tool calls one model reply may make; the calls past it get the tool "
                       "error `too_many_tool_calls`."})


QuotasUpdateSchema = StrictSchema.from_dict(
    {name: fields.Integer(strict=True, allow_none=True, validate=validate.Range(0, MAX_QUOTA))
     for name in QUOTA_NAMES}, name="QuotasUpdateSchema")
"""Quotas to set (a whole number, 0 = no limit) or reset to the default (null): any of
agentq.tenants.QUOTA_NAMES."""


class TenantUpdateSchema(StrictSchema):
    quotas = fields.Nested(QuotasUpdateSchema, required=True)


class TenantSchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    created_at = fields.String(required=True)
    quotas = fields.Nested(QuotasSchema, required=True, metadata={
        "description": "Each the tenant's own, or the settings' default."})
    quotas_set = fields.List(fields.String(), required=True, metadata={
        "description": "The quotas an operator set for this tenant (the others are the "
                       "defaults)."})


class TenantPageSchema(Schema):
    data = fields.List(fields.Nested(TenantSchema), required=True)


class KeyRequestSchema(StrictSchema):
    name = fields.String(required=True, validate=[validate.Length(1, 200), not_blank])
    tenant_id = fields.UUID(required=True)
    admin = fields.Boolean(load_default=False)


class ApiKeySchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    prefix = fields.String(required=True)
    tenant_id = fields.String(required=True)
    admin = fields.Boolean(required=True)
    operator = fields.Boolean(required=True, metadata={
        "description": "An operator key (across tenants; made only on the server)."})
    created_at = fields.String(required=True)
    last_used_at = fields.String(allow_none=True, required=True)
    revoked_at = fields.String(allow_none=True, required=True)


class NewApiKeySchema(ApiKeySchema):
    key = fields.String(required=True, metadata={"description": "The key itself: shown only "
                                                               "in this answer."})


class ApiKeyPageSchema(Schema):
    data = fields.List(fields.Nested(ApiKeySchema), required=True)


class SkillSchema(StrictSchema):
    """A named instruction block, sent when all its tools are offered to the job."""
    name = fields.String(required=True, validate=[validate.Length(1, 100), not_blank])
    instructions = fields.String(required=True,
                                 validate=[validate.Length(1, 20_000), not_blank])
    tools = fields.List(fields.String(validate=validate.Length(1, 255)), load_default=list,
                        validate=validate.Length(max=50), metadata={
                            "description": "The tools it needs (`module.tool`): the skill "
                                           "is sent only when all of them are offered."})


class PersonaRequestSchema(StrictSchema):
    name = fields.String(required=True, validate=[validate.Length(1, 200), not_blank])
    platform = fields.String(load_default=None, allow_none=True,
                             validate=validate.Length(1, 64))
    platform_server_id = fields.String(load_default=None, allow_none=True,
                                       validate=validate.Length(1, 255))
    is_default = fields.Boolean(load_default=None, allow_none=True,
                                metadata={"description": "Default: true for a tenant's "
                                                         "first persona."})
    system_prompt = fields.String(load_default=None, allow_none=True,
                                  validate=validate.Length(max=MAX_CONTENT_CHARS))
    allowed_modules = fields.List(fields.String(validate=MODULE_NAME), load_default=None,
                                  allow_none=True, validate=validate.Length(max=100))
    default_model = fields.String(load_default=None, allow_none=True,
                                  validate=validate.Length(1, 200))
    max_tokens_per_request = fields.Integer(load_default=None, allow_none=True,
                                            validate=validate.Range(1, 1_000_000))
    stream = fields.Boolean(load_default=False, metadata={
        "description": "Stream the replies of every job of this persona."})
    limits = fields.Nested(LimitsSchema, load_default=None, allow_none=True, metadata={
        "description": "Limits for every job of this persona (each optional); the smaller of "
                       "the request's, these and the settings' applies."})
    requires_approval = fields.List(
        fields.String(validate=validate.Length(1, 255)), load_default=None, allow_none=True,
        validate=validate.Length(max=100), metadata={
            "description": "Tool names whose calls wait for a person's approval under this "
                           "persona (besides those whose manifest requires it)."})
    bootstrap = fields.String(load_default=None, allow_none=True,
                              validate=validate.Length(max=MAX_CONTENT_CHARS), metadata={
                                  "description": "Context sent after the system prompt."})
    skills = fields.List(fields.Nested(SkillSchema), load_default=None, allow_none=True,
                         validate=validate.Length(max=50))
    tool_docs = fields.Boolean(load_default=False, metadata={
        "description": "Send the offered tools' documentation in the context."})


class PersonaUpdateSchema(PersonaRequestSchema):
    """PATCH: only the fields given change."""
    name = fields.String(validate=[validate.Length(1, 200), not_blank])
    platform = fields.String(allow_none=True, validate=validate.Length(1, 64))
    platform_server_id = fields.String(allow_none=True, validate=validate.Length(1, 255))
    is_default = fields.Boolean()
    system_prompt = fields.String(allow_none=True,
                                  validate=validate.Length(max=MAX_CONTENT_CHARS))
    allowed_modules = fields.List(fields.String(validate=MODULE_NAME), allow_none=True,
                                  validate=validate.Length(max=100))
    default_model = fields.String(allow_none=True, validate=validate.Length(1, 200))
    max_tokens_per_request = fields.Integer(allow_none=True,
                                            validate=validate.Range(1, 1_000_000))
    stream = fields.Boolean()
    limits = fields.Nested(LimitsSchema, allow_none=True)
    requires_approval = fields.List(fields.String(validate=validate.Length(1, 255)),
                                    allow_none=True, validate=validate.Length(max=100))
    bootstrap = fields.String(allow_none=True, validate=validate.Length(max=MAX_CONTENT_CHARS))
    skills = fields.List(fields.Nested(SkillSchema), allow_none=True,
                         validate=validate.Length(max=50))
    tool_docs = fields.Boolean()


class PersonaSchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    platform = fields.String(allow_none=True, required=True)
    platform_server_id = fields.String(allow_none=True, required=True)
    is_default = fields.Boolean(required=True)
    system_prompt = fields.String(allow_none=True, required=True)
    allowed_modules = fields.List(fields.String(), allow_none=True, required=True)
    default_model = fields.String(allow_none=True, required=True)
    max_tokens_per_request = fields.Integer(allow_none=True, required=True)
    stream = fields.Boolean(required=True)
    limits = fields.Nested(LimitsSchema, allow_none=True, required=True)
    requires_approval = fields.List(fields.String(), allow_none=True, required=True)
    bootstrap = fields.String(allow_none=True, required=True)
    skills = fields.List(fields.Nested(SkillSchema), allow_none=True, required=True)
    tool_docs = fields.Boolean(required=True)
    created_at = fields.String(required=True)


class PersonaPageSchema(Schema):
    data = fields.List(fields.Nested(PersonaSchema), required=True)


class ContextLayersUpdateSchema(StrictSchema):
    """A tenant's default context layers (agentq.loop.layers): only the fields given
    change; null clears one."""
    bootstrap = fields.String(allow_none=True, validate=validate.Length(max=MAX_CONTENT_CHARS),
                              metadata={"description": "Sent after the system prompt of a "
                                                       "job whose persona has no bootstrap "
                                                       "of its own."})
    skills = fields.List(fields.Nested(SkillSchema), allow_none=True,
                         validate=validate.Length(max=50), metadata={
                             "description": "Sent before the persona's own skills, less "
                                            "those the persona names again (names unique)."})

    @validates_schema
    def _something(self, data: dict[str, Any], **_kw) -> None:
        if not data:
            raise ValidationError("Give bootstrap, skills or both.", "_schema")


class ContextLayersSchema(Schema):
    tenant_id = fields.String(required=True)
    bootstrap = fields.String(allow_none=True, required=True)
    skills = fields.List(fields.Nested(SkillSchema), allow_none=True, required=True)


class DeletedSchema(Schema):
    id = fields.String(required=True)
    deleted = fields.Boolean(required=True)


class IdentitySchema(Schema):
    platform = fields.String(required=True)
    platform_user_id = fields.String(required=True)
    platform_username = fields.String(allow_none=True, required=True)


class IdentityRequestSchema(StrictSchema):
    platform = fields.String(required=True, validate=[validate.Length(1, 64), not_blank])
    platform_user_id = fields.String(required=True,
                                     validate=[validate.Length(1, 255), not_blank])
    platform_username = fields.String(load_default=None, allow_none=True,
                                      validate=validate.Length(1, 255))


class UserSchema(Schema):
    id = fields.String(required=True)
    display_name = fields.String(allow_none=True, required=True)
    permission_level = fields.String(required=True)
    token_budget_monthly = fields.Integer(allow_none=True, required=True)
    tokens_used_this_month = fields.Integer(required=True)
    budget_reset_at = fields.String(allow_none=True, required=True)
    created_at = fields.String(required=True)
    identities = fields.List(fields.Nested(IdentitySchema), required=True)


class UserPageSchema(Schema):
    data = fields.List(fields.Nested(UserSchema), required=True)


class PeriodUsageSchema(Schema):
    period_start = fields.String(required=True)
    period_end = fields.String(required=True)
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    cost_estimate = fields.Float(required=True)
    calls = fields.Integer(required=True)


class TokenLogSchema(Schema):
    id = fields.String(required=True)
    job_id = fields.String(allow_none=True, required=True)
    conversation_id = fields.String(allow_none=True, required=True)
    model = fields.String(required=True)
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    cost_estimate = fields.Float(required=True)
    created_at = fields.String(required=True)


class UserDetailSchema(UserSchema):
    usage = fields.Nested(PeriodUsageSchema, required=True)
    token_logs = fields.List(fields.Nested(TokenLogSchema), required=True)


class UserUpdateSchema(StrictSchema):
    permission_level = fields.String(validate=validate.OneOf(("guest", "user", "admin",
                                                              "owner")))
    token_budget_monthly = fields.Integer(allow_none=True, strict=True,
                                          validate=validate.Range(0, 10**15),
                                          metadata={"description": "Tokens a budget period; "
                                                                   "null = unlimited."})
    display_name = fields.String(allow_none=True, validate=validate.Length(1, 200))


class UsageRowSchema(Schema):
    key = fields.String(allow_none=True, required=True,
                        metadata={"description": "The user id, persona id or model."})
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    cost_estimate = fields.Float(required=True)
    calls = fields.Integer(required=True)


class UsageReportSchema(Schema):
    group_by = fields.String(required=True)
    since = fields.String(required=True)
    until = fields.String(required=True)
    data = fields.List(fields.Nested(UsageRowSchema), required=True)


class UsageQuerySchema(StrictSchema):
    group_by = fields.String(load_default="user",
                             validate=validate.OneOf(("user", "persona", "model")),
                             metadata={"description": "One row per `user` (id), `persona` "
                                                      "(the job's; null for none) or "
                                                      "`model`."})
    since = fields.AwareDateTime(default_timezone=timezone.utc,
                                 metadata={"description": "From this time (ISO 8601; "
                                                          "default: `until` less the budget "
                                                          "period)."})
    until = fields.AwareDateTime(default_timezone=timezone.utc,
                                 metadata={"description": "Up to this time (ISO 8601; "
                                                          "default: now)."})


class PageQuerySchema(StrictSchema):
    limit = fields.Integer(load_default=100, validate=validate.Range(1, 1000),
                           metadata=PAGE_SIZE)
    offset = fields.Integer(load_default=0, validate=validate.Range(0, 10**9),
                            metadata={"description": "Skip this many."})

