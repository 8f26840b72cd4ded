"""The health checks' answers (api/health.py): ready or not, what is down, the memory
search backend, each external tool module's health, and the backlog."""
from __future__ import annotations

from marshmallow import Schema, fields

from api.schemas.common import ErrorBodySchema


class ModuleReadinessSchema(Schema):
    kind = fields.String(required=True)
    status = fields.String(required=True, metadata={"description": "ok, unhealthy, unknown"})
    error = fields.String(allow_none=True)


class BacklogSchema(Schema):
    unclaimed_jobs = fields.Integer(allow_none=True, metadata={
        "description": "Live jobs the sweeper re-drove that no worker has taken yet (they "
                       "wait and are re-driven with backoff; null when unreadable)."})


class MemorySearchSchema(Schema):
    backend = fields.String(required=True, metadata={
        "description": "Where memories are searched, chosen at migration time: `pgvector` "
                       "(HNSW index), `exact_sql` (cosine in Postgres), `in_process` "
                       "(SQLite)."})
    hnsw_dimensions = fields.Integer(allow_none=True, metadata={
        "description": "The embedding dimensions the HNSW index serves (pgvector only)."})


class HealthSchema(Schema):
    status = fields.String(required=True)
    memory_search = fields.Nested(MemorySearchSchema, metadata={
        "description": "GET /health/ready only."})
    modules = fields.Dict(keys=fields.String(), values=fields.Nested(ModuleReadinessSchema),
                          metadata={"description": "GET /health/ready: each external tool "
                                                   "module's health (an unhealthy module's "
                                                   "tools are not offered; agentq stays "
                                                   "ready)."})
    backlog = fields.Nested(BacklogSchema, metadata={"description": "/health/ready only."})


class NotReadySchema(Schema):
    status = fields.String(required=True)
    down = fields.List(fields.String(), required=True)
    memory_search = fields.Nested(MemorySearchSchema)
    backlog = fields.Nested(BacklogSchema)
    error = fields.Nested(ErrorBodySchema, required=True)
    modules = fields.Dict(keys=fields.String(), values=fields.Nested(ModuleReadinessSchema))

