"""A message in: resolve who and where, register attachments, and either create a job or,
when the conversation is busy, apply the message's `on_busy` policy (agentq.loop.busy).

It runs in the caller's unit of work (`agentq.loop.uow`): the job's first step goes out as an
effect after the commit, so a worker never reads a job row that is not there yet.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from agentq.config import Settings
from agentq.db import insert_new, insert_new_with, utcnow, write_changes
from agentq.errors import Conflict, NotFound
from agentq.ids import new_id
from agentq.loop.busy import (
    busy_conflict,
    lock_conversation,
    lock_job,
    request_cancel,
    steer,
)
from agentq.loop.decision import applied_limits
from agentq.loop.effects import NextStep, RevokeTools
from agentq.loop.identity import Incoming, made_here, resolve
from agentq.loop.lifecycle import (
    JobStatus,
    Phase,
    StopReason,
    WaitingFor,
    active_job,
    end_job,
    hand_conversation,
    may_start,
    new_job,
    queue_behind,
    take_conversation,
)
from agentq.loop.uow import UnitOfWork
from agentq.models import Conversation, FileRecord, Job, Persona, User
from agentq.tenants import DEFAULT_TENANT_ID, RUNNING_NOW, cached_quotas


@dataclass
class Submission:
    incoming: Incoming | None
    content: str
    attachments: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    callback_url: str | None = None
    on_busy: str = "queue"
    api_key_id: uuid.UUID | None = None
    model: str | None = None
    conversation_id: uuid.UUID | None = None
    """Set instead of `incoming` to continue an existing conversation (POST /v1/continue)."""
    persona_id: uuid.UUID | None = None
    """The persona to answer as: it becomes the conversation's (see `_resolve`)."""
    limits: dict[str, Any] | None = None
    """Per-job limits {max_iterations, max_tokens, max_seconds} (None values: no limit)."""
    stream: bool = False
    """Stream the model's replies as message_delta events."""
    tenant_id: uuid.UUID = DEFAULT_TENANT_ID
    """Whose rows these are: the API key's tenant (the CLI's embedded runs: the default).
    Users, conversations and personas are looked up in it only."""
    own_conversations: bool = False
    """A non-admin key's message: the conversation at its place is the key's own
    (`agentq.loop.identity.scope_key`), never another key's."""
    job_id: uuid.UUID | None = None
    """The new job's id, chosen by the caller (its Idempotency-Key row names it before the
    job is written); None: a new one."""


Resolved = dict[tuple[Any, ...], tuple[User, Persona | None, Conversation]]
"""A batch's cache of who and where (`submit`'s `cache`), by the place a line came from."""


@dataclass
class Submitted:
    job: Job
    """The job that answers: a new one, or the running one when the message steered it."""
    created: bool
    steering_input_id: uuid.UUID | None = None
    """When the message steered the running job: its job_inputs row."""


def submit(uow: UnitOfWork, settings: Settings, sub: Submission,
           batch_id: uuid.UUID | None = None, cache: Resolved | None = None) -> Submitted:
    """Create the job (or steer the running one); `batch_id` jobs wait for admission.

    `cache` remembers who and where across the lines of one batch, so a batch of many
    messages from a few users resolves each user and conversation once."""
    session, now = uow.session, utcnow()
    user, persona, conversation = _resolve(session, settings, sub, now, cache)
    if batch_id is not None:
        job = _new_job(session, settings, sub, user, persona, conversation, now,
                       waiting_for=WaitingFor.BATCH)
        job.batch_id = batch_id
        session.add(job)
        _keep_persona(conversation, persona)
        return Submitted(job, True)

    if made_here(session, conversation) and conversation.active_job_id is None:
        owner = None  # nobody else sees it before our commit, and this one gave it no job
    else:
        conversation, owner = lock_owner_then_conversation(session, conversation.id,
                                                           conversation.active_job_id)
    if owner is not None and sub.on_busy == "reject":
        raise busy_conflict(owner)
    if owner is not None and sub.on_busy == "steer":
        entry = steer(uow, owner, _with_attachments(session, sub, user, now), sub.metadata,
                      now)
        return Submitted(owner, False, entry.id)

    job = _new_job(session, settings, sub, user, persona, conversation, now,
                   waiting_for=WaitingFor.CONVERSATION if owner is not None else None)
    _keep_persona(conversation, persona)
    if owner is None:
        take_conversation(conversation, job)
    # the job's INSERT and the conversation's UPDATE (its row is ours: locked or made here)
    # in one statement on Postgres, with the count of the tenant's running jobs when it has
    # a quota of them; else one after the other, no flush
    quota = cached_quotas(session, job.tenant_id, settings).running_jobs
    counted = owner is None and bool(quota)
    written, running = insert_new_with(
        session, job, conversation,
        (RUNNING_NOW, {"running_tenant": job.tenant_id, "running_cap": quota})
        if counted else None)
    if not written:
        insert_new(session, job)  # first: its files and the conversation refer to it
        write_changes(session, conversation)
    if owner is None and may_start(session, job, settings, running):
        uow.effect(NextStep(str(job.id), 0, "start"))
    elif owner is not None and sub.on_busy == "interrupt":
        interrupt(uow, owner)
    return Submitted(job, True)


def _resolve(session: Session, settings: Settings, sub: Submission, now: datetime,
             cache: Resolved | None) -> tuple[User, Persona | None, Conversation]:
    """The user, persona and conversation a submission goes to.

    A conversation keeps its persona (`conversations.persona_id`): every job made on it — a
    message to its place, `/v1/continue`, a schedule's firing (a wake-up the model asked
    for with `scheduler.add_job` included), a follow-up — answers as that persona. A new
    conversation's persona is the request's `persona_id`, else the cascade's (server,
    platform, default); so is that of a conversation left without one (its persona was
    deleted). A request that names a persona answers as it, and from then on it is the
    conversation's (`_keep_persona`)."""
    if sub.conversation_id is not None:
        conversation = session.get(Conversation, sub.conversation_id)
        if conversation is None or conversation.tenant_id != sub.tenant_id:
            raise NotFound("conversation", str(sub.conversation_id))
        found = session.get(User, conversation.user_id)
        if found is None:  # deleted since (its conversations go with it)
            raise NotFound("conversation", str(sub.conversation_id))
        user = found
        persona = (session.get(Persona, conversation.persona_id)
                   if conversation.persona_id else None)
    else:
        incoming = sub.incoming
        if incoming is None:
            raise ValueError("A Submission names its conversation_id or its incoming place.")
        owner = sub.api_key_id if sub.own_conversations else None
        key = (sub.tenant_id, incoming.platform, incoming.platform_user_id,
               incoming.platform_channel_id, incoming.platform_thread_id,
               incoming.platform_server_id, owner)
        if cache is not None and key in cache:
            user, persona, conversation = cache[key]
        else:
            user, persona, conversation = resolve(session, sub.tenant_id, incoming,
                                                  settings, now, owner)
            if (conversation.persona_id is not None
                    and conversation.persona_id != (persona.id if persona else None)):
                persona = session.get(Persona, conversation.persona_id)  # it sticks
            if cache is not None:
                cache[key] = (user, persona, conversation)
    if sub.persona_id is not None:
        persona = session.get(Persona, sub.persona_id)
        if persona is None or persona.tenant_id != sub.tenant_id:
            raise NotFound("persona", str(sub.persona_id))
    return user, persona, conversation


def _keep_persona(conversation: Conversation, persona: Persona | None) -> None:
    """The persona a job was made with is its conversation's from now on (a request
    named it, or the conversation had none)."""
    if persona is not None and conversation.persona_id != persona.id:
        conversation.persona_id = persona.id


LOCK_ATTEMPTS = 5
_OWNER = (select(Conversation.active_job_id)
          .where(Conversation.id == bindparam("conversation_id")))


def lock_owner_then_conversation(session: Session, conversation_id: uuid.UUID,
                                 owner_read: uuid.UUID | None | Literal["unread"] = "unread"
                                 ) -> tuple[Conversation, Job | None]:
    """Lock the conversation's running job, then the conversation (the order a finishing
    job takes them), retrying if the owner changed in between. `owner_read`: its owner as
    this transaction read it a moment ago (the first attempt goes by it, as by its own
    read: the locked row says whether it still holds)."""
    for attempt in range(LOCK_ATTEMPTS):
        owner_id = (owner_read if attempt == 0 and owner_read != "unread"
                    else session.execute(_OWNER, {"conversation_id": conversation_id}
                                         ).scalar_one())
        # the locked job kept referenced: the session's identity map holds it only while
        # it is, and active_job finds it there rather than reading it once more
        _held = lock_job(session, owner_id) if owner_id is not None else None
        conversation = lock_conversation(session, conversation_id)
        if conversation.active_job_id == owner_id:
            return conversation, active_job(session, conversation)
    raise Conflict("The conversation changed hands too often; try again.",
                   conversation_id=str(conversation_id))


def admit(uow: UnitOfWork, job: Job) -> None:
    """A batch job's turn: it takes its conversation, or waits for it in order."""
    conversation = lock_conversation(uow.session, job.conversation_id)
    owner = active_job(uow.session, conversation)
    if owner is None:
        hand_conversation(uow, conversation, job, utcnow())
    else:
        queue_behind(job)


def interrupt(uow: UnitOfWork, owner: Job) -> None:
    """Cancel `owner`: at once if it never started, else at its next step boundary."""
    if owner.status == JobStatus.QUEUED and owner.started_at is None:
        end_job(uow, owner, StopReason.CANCELLED, "The job was cancelled before it started.",
                {"code": "cancelled", "message": "Interrupted by a new message."})
        return
    if owner.status == JobStatus.WAITING:  # for a person or its children: calls held never run
        from agentq.loop.approvals import cancel_awaiting
        cancel_awaiting(uow, owner)
    revoked = request_cancel(uow, owner)
    if revoked:
        uow.effect(RevokeTools(tuple(revoked)))
    if owner.phase == Phase.TOOLS:
        uow.effect(NextStep(str(owner.id), owner.iteration, "callback"))
    elif owner.waiting_for == WaitingFor.PROVIDER:  # parked: end it now, not at its next attempt
        uow.effect(NextStep(str(owner.id), owner.iteration, "continue"))


def cancel(uow: UnitOfWork, job: Job) -> None:
    """POST /v1/jobs/<id>/cancel on a live job."""
    if job.status == JobStatus.QUEUED and job.started_at is None:
        end_job(uow, job, StopReason.CANCELLED, "The job was cancelled.",
                {"code": "cancelled", "message": "Cancelled by request."})
        return
    interrupt(uow, job)


def _new_job(session: Session, settings: Settings, sub: Submission, user: User,
             persona: Persona | None, conversation: Conversation, now: datetime,
             waiting_for: WaitingFor | None) -> Job:
    """The job's row, not yet written (the caller writes it)."""
    asked = {k: v for k, v in (sub.limits or {}).items() if v is not None}
    job = new_job(tenant_id=sub.tenant_id, conversation_id=conversation.id,
                  user_id=user.id, persona_id=persona.id if persona else None,
                  api_key_id=sub.api_key_id, content=sub.content, meta=sub.metadata,
                  callback_url=sub.callback_url, on_busy=sub.on_busy, model=sub.model,
                  stream=sub.stream, waiting_for=waiting_for, now=now, limits=asked,
                  limits_applied=applied_limits(settings, persona.limits if persona else None,
                                                asked))
    if sub.job_id is not None:
        job.id = sub.job_id
    job.attachments = _register_attachments(session, sub.attachments, user, job.id, now)
    return job


def _register_attachments(session: Session, attachments: list[dict[str, Any]], user: User,
                          job_id: uuid.UUID | None, now: datetime) -> list[dict[str, Any]]:
    registered = []
    for att in attachments:
        record = FileRecord(id=new_id(), tenant_id=user.tenant_id, user_id=user.id,
                            job_id=job_id,
                            filename=att.get("filename") or "file",
                            mime_type=att.get("mime_type"), size_bytes=att.get("size_bytes"),
                            minio_key=att.get("minio_key"), public_url=att.get("url"),
                            created_at=now)
        session.add(record)
        registered.append({**att, "file_id": str(record.id)})
    return registered


def _with_attachments(session: Session, sub: Submission, user: User, now: datetime) -> str:
    """A steering message's text, with its attachments described as in a new message."""
    registered = _register_attachments(session, sub.attachments, user, None, now)
    return describe_attachments(sub.content, registered)


def describe_attachments(content: str, attachments: list[dict[str, Any]]) -> str:
    """The message text with its attachments listed for the model (seed 000)."""
    if not attachments:
        return content
    lines = [content, "", "[Attached files:]"]
    for att in attachments:
        lines.append(f"- {att.get('filename', 'file')} (file_id: {att.get('file_id', '')}, "
                     f"{att.get('size_bytes') or 0} bytes, {att.get('mime_type') or ''})")
    lines.append("Use files.read_document(file_id) to read a text file (page on with "
                 "offset), or name file ids in code.run_python's file_ids to find the files "
                 "in its current directory.")
    return "\n".join(lines)


def create_job(uow: UnitOfWork, settings: Settings, sub: Submission) -> Job:
    """Submit a message to a conversation that is not busy (tests, the CLI)."""
    return submit(uow, settings, sub).job
