"""The tables: SQLAlchemy 2.x typed models. Postgres in production, SQLite embedded.

Timestamps are timezone-aware UTC; ids are UUIDs. The schema itself is built only by the
Alembic history in `migrations/` (never `create_all`), and that history is checked against
these models by a test.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from agentq.column_types import TZ, JSONType, enum_column
from agentq.db import utcnow
from agentq.ids import new_id
from agentq.loop.states import (
    UNENDED_STATUSES,
    BatchStatus,
    DeliveryStatus,
    JobStatus,
    Phase,
    ReplayMode,
    ScheduleStatus,
    ToolCallStatus,
    WaitingFor,
)

MESSAGE_ROLES = ("user", "assistant", "tool_call", "tool_result")

_UNENDED_SQL = f"status IN ({', '.join(repr(s) for s in UNENDED_STATUSES)})"
_QUOTA_WAIT_SQL = f"waiting_for = '{WaitingFor.QUOTA.value}'"


class Base(DeclarativeBase):
    type_annotation_map = {datetime: TZ, dict[str, Any]: JSONType, list[Any]: JSONType}
    __table__: ClassVar[Table]
    """Every model here is mapped by `__tablename__`, so its `__table__` is a Table (the
    stubs say FromClause, which `update`, `delete` and `insert` do not take)."""


def _id() -> Mapped[uuid.UUID]:
    return mapped_column(Uuid, primary_key=True, default=new_id)


class Tenant(Base):
    """Who owns rows: every API key belongs to one, and every row a key creates or names
    carries it (agentq.tenants)."""
    __tablename__ = "tenants"
    id: Mapped[uuid.UUID] = _id()
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    quotas: Mapped[dict[str, Any] | None]
    """Quotas and rate limits set by an operator (API.md 1.2); a missing one is the
    settings' default."""
    webhook_secret: Mapped[str | None] = mapped_column(Text)
    """`whsec_…` this tenant's webhooks are signed with; None: AGENTQ_WEBHOOK_SECRET for
    the default tenant. Never logged nor returned but once, when rotated."""
    webhook_secret_previous: Mapped[str | None] = mapped_column(Text)
    """The secret before the last rotation: it signs too until
    webhook_secret_previous_until."""
    webhook_secret_previous_until: Mapped[datetime | None]
    bootstrap: Mapped[str | None] = mapped_column(Text)
    """Default context layers (agentq.loop.layers): the bootstrap text of a job whose
    persona has none of its own."""
    skills: Mapped[list[Any] | None]
    """Default skills [{name, instructions, tools}]: sent before the persona's own, less
    those the persona names again."""


class User(Base):
    __tablename__ = "users"
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    display_name: Mapped[str | None] = mapped_column(String(200))
    permission_level: Mapped[str] = mapped_column(String(16), default="guest")
    token_budget_monthly: Mapped[int | None] = mapped_column(BigInteger)
    """None = unlimited (admins, owners)."""
    tokens_used_this_month: Mapped[int] = mapped_column(BigInteger, default=0)
    budget_reset_at: Mapped[datetime]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UserPlatformLink(Base):
    __tablename__ = "user_platform_links"
    __table_args__ = (UniqueConstraint("tenant_id", "platform", "platform_user_id",
                                       name="uq_user_platform_links_identity"),)
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                               index=True)
    platform: Mapped[str] = mapped_column(String(64))
    platform_user_id: Mapped[str] = mapped_column(String(255))
    platform_username: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Persona(Base):
    __tablename__ = "personas"
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    platform: Mapped[str | None] = mapped_column(String(64))
    platform_server_id: Mapped[str | None] = mapped_column(String(255))
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    system_prompt: Mapped[str | None] = mapped_column(Text)
    allowed_modules: Mapped[list[Any] | None]
    """Module names this persona may use; None = the configured default modules."""
    default_model: Mapped[str | None] = mapped_column(String(200))
    max_tokens_per_request: Mapped[int | None] = mapped_column(Integer)
    limits: Mapped[dict[str, Any] | None]
    """Per-job limits for this persona's jobs ({max_iterations, max_tokens, max_seconds});
    a request's own limits and the settings cap them (the smaller wins)."""
    stream: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    """Stream the model's replies (message_delta events) for every job of this persona."""
    approval_tools: Mapped[list[Any] | None]
    """Tool names whose calls wait for a person's approval under this persona, besides the
    tools whose manifest says `requires_approval`."""
    bootstrap: Mapped[str | None] = mapped_column(Text)
    """Context layers (agentq.loop.layers): text sent after the system prompt."""
    skills: Mapped[list[Any] | None]
    """[{name, instructions, tools}]: each sent when all its tools are offered to the job."""
    tool_docs: Mapped[bool] = mapped_column(Boolean, default=False,
                                            server_default=text("false"))
    """Send the offered tools' documentation."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_personas_scope", "tenant_id", "platform", "platform_server_id"),
                      Index("uq_personas_one_default", "tenant_id", unique=True,
                            postgresql_where=text("is_default"),
                            sqlite_where=text("is_default")))


class Conversation(Base):
    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_idle", "last_active_at"),)
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                               index=True)
    persona_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("personas.id", ondelete="SET NULL"))
    platform: Mapped[str] = mapped_column(String(64))
    platform_channel_id: Mapped[str] = mapped_column(String(255))
    platform_thread_id: Mapped[str | None] = mapped_column(String(255))
    scope_key: Mapped[str] = mapped_column(String(700), unique=True)
    """tenant, platform, channel and thread joined: one conversation per scope in a tenant
    (NULL-safe unique; agentq.loop.identity.scope_key)."""
    message_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    """The last message's `seq` in this conversation."""
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_active_at: Mapped[datetime] = mapped_column(default=utcnow)
    is_summarized: Mapped[bool] = mapped_column(Boolean, default=False)
    memory_summarized_seq: Mapped[int] = mapped_column(BigInteger, default=0,
                                                       server_default="0")
    """The last message seq summarised into a memory once the conversation was idle
    (agentq.memory_digest)."""
    active_job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    """The job that owns this conversation now; one job runs per conversation at a time."""
    branched_from_conversation_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    """A branch's source conversation (POST /v1/conversations/<id>/branch; agentq.branches)."""
    branched_from_message_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    """A branch's point: the source's first message it does not hold."""
    active_project: Mapped[str | None] = mapped_column(Text)
    """The conversation's active project, a context layer (PATCH /v1/conversations/<id>)."""


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (UniqueConstraint("conversation_id", "seq",
                                       name="uq_messages_conversation_seq"),)
    id: Mapped[uuid.UUID] = _id()
    conversation_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"))
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer, default=0)
    model_used: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[uuid.UUID] = _id()
    name: Mapped[str] = mapped_column(String(200))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    """An admin of its tenant: its keys, personas, users, modules, webhook secret."""
    is_operator: Mapped[bool] = mapped_column(Boolean, default=False,
                                              server_default=text("false"))
    """An operator acts across tenants (the tenants' own routes); made only on the server.
    Always an admin too."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # status alone: an index holding a column a step updates (last_progress_at) makes
        # no update of the row heap-only (migration 0014)
        Index("ix_jobs_status", "status"),
        Index("ix_jobs_conversation", "conversation_id", "created_at"),
        Index("ix_jobs_batch_waiting", "batch_id", "waiting_for", "batch_index"),
        # a tenant's live jobs (its running-jobs quota counts them) and those waiting for
        # the quota: both small, and on columns a step's update never changes (0016)
        Index("ix_jobs_tenant_live", "tenant_id",
              postgresql_where=text(_UNENDED_SQL), sqlite_where=text(_UNENDED_SQL)),
        Index("ix_jobs_tenant_quota_wait", "tenant_id", "created_at",
              postgresql_where=text(_QUOTA_WAIT_SQL), sqlite_where=text(_QUOTA_WAIT_SQL)),
        # a sub-agent per `agents.delegate` call, however often the call is delivered (0020)
        Index("uq_jobs_parent_tool_use_id", "parent_tool_use_id", unique=True),
    )
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    status: Mapped[JobStatus] = mapped_column(enum_column(JobStatus), default=JobStatus.QUEUED)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    conversation_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"))
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                               index=True)
    persona_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("personas.id", ondelete="SET NULL"))
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    content: Mapped[str] = mapped_column(Text)
    attachments: Mapped[list[Any]] = mapped_column(default=list)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    callback_url: Mapped[str | None] = mapped_column(Text)
    on_busy: Mapped[str] = mapped_column(String(16), default="queue")
    model: Mapped[str | None] = mapped_column(String(200))
    """A model asked for by this job (replays); else the persona's, else the default."""
    stream: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    """Stream the model's replies as message_delta events (through the hub, not stored)."""

    iteration: Mapped[int] = mapped_column(Integer, default=0)
    """Model calls completed. A step is keyed by (job id, iteration)."""
    phase: Mapped[Phase] = mapped_column(enum_column(Phase), default=Phase.LLM)
    """What the next step does: `llm` (call the model) or `tools` (collect tool results)."""
    step_owner: Mapped[str | None] = mapped_column(String(64))
    step_lease_until: Mapped[datetime | None]
    last_progress_at: Mapped[datetime] = mapped_column(default=utcnow)
    redrives: Mapped[int] = mapped_column(Integer, default=0)
    """Re-drives by the sweeper since the step last advanced (claimed or not)."""
    claimed_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Claims of the current step that ended without progress (a worker died mid-step)."""
    redrive_after: Mapped[datetime | None]
    """A re-drive nobody claimed is sent again only after this (a growing delay)."""
    cancel_requested_at: Mapped[datetime | None]
    pending_inputs: Mapped[int] = mapped_column(Integer, default=0)
    """Steering messages waiting in job_inputs: a step reads them only when there are some."""
    event_seq: Mapped[int] = mapped_column(BigInteger, default=0)

    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_estimate: Mapped[float] = mapped_column(Float, default=0.0)
    response: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)

    waiting_for: Mapped[WaitingFor | None] = mapped_column(enum_column(WaitingFor))
    """None, or what a queued job waits for before its first step: `conversation` (another
    job owns it: on_busy queue/interrupt), `batch` (its batch's admission) or `quota` (its
    tenant's running jobs); what a running job waits for between steps: `provider` (every
    model kept failing with transient errors; shown as `status: waiting`); or what a
    `waiting` job waits for: `approval` (a person) or `children` (its sub-agents)."""
    provider_wait_since: Mapped[datetime | None]
    """When the current wait for the provider began (the first transient failure of the
    whole chain in this turn); None when not waiting."""
    provider_next_attempt_at: Mapped[datetime | None]
    """When a job waiting for its provider tries again."""
    provider_attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Failed attempts of the current wait."""
    replay_of: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    replay_mode: Mapped[ReplayMode | None] = mapped_column(enum_column(ReplayMode))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    batch_index: Mapped[int | None] = mapped_column(Integer)
    custom_id: Mapped[str | None] = mapped_column(String(255))
    limits: Mapped[dict[str, Any] | None]
    """The request's own limits ({max_iterations, max_tokens, max_seconds}), as sent."""
    limits_applied: Mapped[dict[str, Any] | None]
    """The limits that apply ({max_iterations, max_tokens, max_seconds}, None where none
    sets it): for each the smallest of the request's, the persona's and the settings', fixed
    when the job is made (agentq.loop.decision.effective_limits). None: made before they
    were recorded (its step works them out)."""
    follow_up_job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    """The job made from steering that arrived too late for this one (it runs next)."""
    parent_job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    """A sub-agent's parent job (`agents.delegate`); None for a top-level job."""
    parent_tool_use_id: Mapped[str | None] = mapped_column(String(64))
    """The parent's `agents.delegate` call this job answers: unique, so a call delivered
    twice starts one child."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class ConversationSummary(Base):
    """A conversation's compacted past: one current summary (the highest version) covering
    every message up to `through_seq`; older versions are kept for audit and replay."""
    __tablename__ = "conversation_summaries"
    __table_args__ = (UniqueConstraint("conversation_id", "version",
                                       name="uq_conversation_summaries_version"),)
    id: Mapped[uuid.UUID] = _id()
    conversation_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    content: Mapped[str] = mapped_column(Text)
    through_seq: Mapped[int] = mapped_column(BigInteger)
    messages_summarized: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    model: Mapped[str | None] = mapped_column(String(200))
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Memory(Base):
    """Something remembered about a user (seeds 000/003), with its embedding: recalled by
    exact cosine similarity over the user's memories (`agentq.memory`)."""
    __tablename__ = "memories"
    __table_args__ = (Index("ix_memories_user", "user_id", "created_at"),)
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    content: Mapped[str] = mapped_column(Text)
    embedding: Mapped[list[Any]]
    embedding_model: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(32))
    conversation_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_recalled_at: Mapped[datetime | None]


class JobEvent(Base):
    """A job's event, named by its job and its number there (`jobs.event_seq` counts them):
    an append-only row with no id of its own, one index (its key) to write."""
    __tablename__ = "job_events"
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"),
                                              primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    type: Mapped[str] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ToolCall(Base):
    __tablename__ = "tool_calls"
    __table_args__ = (Index("ix_tool_calls_job_iteration", "job_id", "iteration"),)
    id: Mapped[uuid.UUID] = _id()
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    iteration: Mapped[int] = mapped_column(Integer)
    position: Mapped[int] = mapped_column(Integer)
    tool_use_id: Mapped[str] = mapped_column(String(64), unique=True)
    provider_call_id: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(255))
    arguments: Mapped[dict[str, Any] | None]
    queue: Mapped[str] = mapped_column(String(255))
    status: Mapped[ToolCallStatus] = mapped_column(enum_column(ToolCallStatus),
                                                   default=ToolCallStatus.PENDING)
    """pending → succeeded | failed | cancelled; a call of a `requires_approval` tool starts
    `awaiting` (approval) → pending (approved) | failed (denied, timed out) | cancelled."""
    approval_expires_at: Mapped[datetime | None]
    """Set when the call was held for approval (and kept after): an awaiting call is denied
    after this (agentq.loop.approvals)."""
    result: Mapped[dict[str, Any] | None]
    """{"ok": bool, "result": ..., "error": {"code", "message"}} as the model will read it."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Deliveries that began running the tool."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    lease_until: Mapped[datetime | None]
    """While the tool runs, its worker keeps this a step deadline ahead
    (agentq.loop.leases): a copy delivered before it passes waits for the result."""
    finished_at: Mapped[datetime | None]


class TokenLog(Base):
    __tablename__ = "token_logs"
    __table_args__ = (UniqueConstraint("job_id", "iteration", name="uq_token_logs_job_turn"),)
    id: Mapped[uuid.UUID] = _id()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                               index=True)
    conversation_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    iteration: Mapped[int] = mapped_column(Integer, default=0)
    model: Mapped[str] = mapped_column(String(200))
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_estimate: Mapped[float] = mapped_column(Float, default=0.0)
    usage_estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    reply: Mapped[dict[str, Any] | None]
    """The model's reply as recorded (LLMReply.to_record), for recorded replays."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class FileRecord(Base):
    __tablename__ = "files"
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), index=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    filename: Mapped[str] = mapped_column(String(255))
    mime_type: Mapped[str | None] = mapped_column(String(255))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    minio_key: Mapped[str | None] = mapped_column(String(512))
    public_url: Mapped[str | None] = mapped_column(Text)
    content: Mapped[bytes | None] = mapped_column(LargeBinary)
    """Documents made by tools are stored here; attachments point elsewhere (url)."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobInput(Base):
    """A message for a running job: steering (seed 001), injected at its next turn."""
    __tablename__ = "job_inputs"
    __table_args__ = (Index("ix_job_inputs_pending", "job_id", "consumed_at"),)
    id: Mapped[uuid.UUID] = _id()
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    content: Mapped[str] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    consumed_at: Mapped[datetime | None]


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("tenant_id", "api_key_id", "key",
                                       name="uq_idempotency_keys_key"),)
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    api_key_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class WebhookDelivery(Base):
    """One attempt to deliver one event; `event_id` is the stable `webhook-id`."""
    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_job", "job_id", "created_at"),
                      Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
                      Index("ix_webhook_deliveries_batch", "batch_id", "created_at"))
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    event_id: Mapped[str] = mapped_column(String(64), index=True)
    event_type: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    url: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[DeliveryStatus] = mapped_column(enum_column(DeliveryStatus),
                                                   default=DeliveryStatus.PENDING)
    """pending → succeeded | failed (will retry) | gave_up."""
    status_code: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    next_attempt_at: Mapped[datetime | None]
    data: Mapped[dict[str, Any] | None]
    """What the event says besides the job object (job.approval_required: the call)."""


class Batch(Base):
    __tablename__ = "batches"
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    kind: Mapped[str] = mapped_column(String(16), default="messages")
    """messages | replay."""
    status: Mapped[BatchStatus] = mapped_column(enum_column(BatchStatus),
                                                default=BatchStatus.QUEUED)
    total: Mapped[int] = mapped_column(Integer, default=0)
    max_concurrency: Mapped[int] = mapped_column(Integer, default=50)
    callback_url: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    cancel_requested_at: Mapped[datetime | None]


class ToolModuleRow(Base):
    """An external tool module registered by URL (HTTP, seed 003) or as an MCP server
    (stdio command or streamable HTTP URL): agentq.tools.remote. Its manifest is not
    stored here but cached in Redis for an hour."""
    __tablename__ = "tool_modules"
    name: Mapped[str] = mapped_column(String(31), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    url: Mapped[str | None] = mapped_column(Text)
    command: Mapped[list[Any] | None]
    slow: Mapped[bool] = mapped_column(Boolean, default=False)
    secret: Mapped[str | None] = mapped_column(Text)
    """`whsec_…`; signs every request to the module; never logged nor returned."""
    defaults: Mapped[dict[str, Any] | None]
    """Per-module defaults for its tools: {permission?, requires_approval?, timeout_s?}."""
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    """The tenant that registered it; None: global (an operator's, or AGENTQ_TOOL_MODULES)."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


SCHEDULE_KINDS = ("once", "cron")


class Schedule(Base):
    """A message to continue a conversation with later (seed 000's scheduler): once at
    `run_at`, or on each tick of a cron expression in a time zone. Beat fires due ones
    (agentq.schedules); each firing is a row in schedule_firings."""
    __tablename__ = "schedules"
    __table_args__ = (Index("ix_schedules_due", "status", "next_run_at"),)
    id: Mapped[uuid.UUID] = _id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                                 index=True)
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    conversation_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                               index=True)
    content: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(8))
    """once | cron."""
    run_at: Mapped[datetime | None]
    cron: Mapped[str | None] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    next_run_at: Mapped[datetime | None]
    """The next tick to fire; None once it will not fire again."""
    status: Mapped[ScheduleStatus] = mapped_column(enum_column(ScheduleStatus),
                                                   default=ScheduleStatus.ACTIVE)
    created_by: Mapped[str] = mapped_column(String(16), default="api")
    """api | tool (the scheduler tool module, on the model's call)."""
    tool_use_id: Mapped[str | None] = mapped_column(String(64), unique=True)
    """The tool call that made it: a re-run of the call makes no second schedule."""
    callback_url: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    fire_count: Mapped[int] = mapped_column(Integer, default=0)
    last_fired_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    cancelled_at: Mapped[datetime | None]


class ScheduleFiring(Base):
    """One firing of a schedule: the unique (schedule, tick) makes it happen once, whichever
    beat process gets there first and however often beat restarts."""
    __tablename__ = "schedule_firings"
    __table_args__ = (UniqueConstraint("schedule_id", "fire_at",
                                       name="uq_schedule_firings_tick"),)
    id: Mapped[uuid.UUID] = _id()
    schedule_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("schedules.id", ondelete="CASCADE"))
    fire_at: Mapped[datetime]
    """The tick this firing is for (run_at, or the cron tick)."""
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    missed: Mapped[int] = mapped_column(Integer, default=0)
    """Earlier ticks skipped by the catch-up policy (fire once, for the latest)."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
