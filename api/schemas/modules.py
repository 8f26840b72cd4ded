"""A tool module's schemas (api/modules.py): its registration, and the module with its
tools and health as answered."""
from __future__ import annotations

from marshmallow import Schema, fields, validate

from api.schemas.common import StrictSchema


class ModuleRequestSchema(StrictSchema):
    """POST /v1/modules: an HTTP module by url, an MCP server by url or command."""
    name = fields.String(required=True, validate=validate.Regexp(
        r"^[a-z][a-z0-9_]{0,30}$", error="Must be a lowercase letter, then up to 30 "
                                          "lowercase letters, digits or underscores."))
    kind = fields.String(load_default="http", validate=validate.OneOf(["http", "mcp"]))
    url = fields.String(validate=validate.Length(1, 2000))
    command = fields.List(fields.String(validate=validate.Length(1, 1000)),
                          validate=validate.Length(1, 50))
    slow = fields.Boolean(load_default=False)
    secret = fields.String(validate=validate.Length(1, 500), load_only=True)
    permission = fields.String(validate=validate.OneOf(["guest", "user", "admin", "owner"]),
                               metadata={"description": "The level a caller needs for its "
                                         "tools (default guest; an HTTP manifest's own wins)."})
    requires_approval = fields.Raw(metadata={
        "description": "true (every call waits for approval) or a list of its tool names.",
        "oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "string"},
                                        "minItems": 1, "maxItems": 200}]})
    timeout_s = fields.Float(validate=validate.Range(min=0.1, max=86400),
                             allow_nan=False,
                             metadata={"description": "Each call's time limit in seconds."})
    is_global = fields.Boolean(data_key="global", load_default=False, metadata={
        "description": "An operator's module offered to every tenant (a tenant admin "
                       "asking gets 403); otherwise the module is the key's tenant's."})


class ModuleToolSchema(Schema):
    name = fields.String(required=True)
    description = fields.String(required=True)
    parameters = fields.Dict(required=True)
    permission = fields.String(required=True)


class ModuleHealthSchema(Schema):
    status = fields.String(required=True)
    error = fields.String(allow_none=True)
    checked_at = fields.Float(allow_none=True)


class ModuleSchema(Schema):
    name = fields.String(required=True)
    kind = fields.String(required=True)
    url = fields.String(allow_none=True)
    command = fields.List(fields.String(), allow_none=True)
    slow = fields.Boolean(required=True)
    local = fields.Boolean(required=True, metadata={
        "description": "Its calls run inside the orchestrator's step, not by chord on its "
                       "queue: an in-process module that declares itself local, named in "
                       "AGENTQ_LOCAL_MODULES (docs/api-modules.md). A registered module "
                       "never is."})
    signed = fields.Boolean(required=True)
    static = fields.Boolean(required=True)
    permission = fields.String(allow_none=True)
    requires_approval = fields.Raw(metadata={"oneOf": [
        {"type": "boolean"}, {"type": "array", "items": {"type": "string"}}]})
    timeout_s = fields.Float(allow_none=True)
    is_global = fields.Boolean(data_key="global", required=True, metadata={
        "description": "Offered to every tenant; else only to the tenant `tenant_id`."})
    tenant_id = fields.String(allow_none=True, required=True)
    health = fields.Nested(ModuleHealthSchema, required=True)
    tools = fields.List(fields.Nested(ModuleToolSchema), required=True)


class ModulePageSchema(Schema):
    data = fields.List(fields.Nested(ModuleSchema), required=True)

