"""A step's compare-and-sets on its job's row (steps 1 and 7 of `agentq.loop.step`), built
once, their parameters per call.

  claim    the job is live, still at iteration k, and no other step holds its lease (nor,
           waiting for its provider, is it before its next attempt): this step's lease is
           taken, and what the step needs is read with it (`Who`): on Postgres in the
           same statement.
  advance  iteration k → k+1 under this step's lease, the model call's usage added; on
           Postgres its token log and its user's charge written by the same statement.

A duplicated or stale message claims nothing; a step whose lease was lost advances nothing.
"""
from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Integer,
    Select,
    SQLColumnExpression,
    Update,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql.selectable import ExecutableReturnsRows

from agentq import memory
from agentq.db import utcnow
from agentq.loop.context import StoredMessage, TurnMessages
from agentq.loop.lifecycle import LIVE_STATUSES, Phase, WaitingFor
from agentq.loop.store import json_object, with_usage
from agentq.models import (
    Conversation,
    ConversationSummary,
    Job,
    Message,
    Persona,
    Tenant,
    ToolCall,
    User,
)

PROVIDER_EARLY_TOLERANCE_S = 2.0
"""A delayed step may claim its job this much before the job's next attempt time (clocks
of workers and of the process that parked it differ a little)."""
_V = TypeVar("_V")


def _param(name: str, column: ColumnElement[_V]) -> BindParameter[_V]:
    return bindparam(name, type_=column.type)


_jobs = Job.__table__


def _loading(core_update: Update) -> ExecutableReturnsRows:
    """`core_update` (an `UPDATE … RETURNING` every column of jobs) loading the job it
    changed as the session's Job, current (populate_existing). An ORM-enabled UPDATE
    (`update(Job)…returning(Job)`) does the same through the ORM's bulk-update machinery,
    which cost about twice the CPU (0.24 against 0.11 ms a claim above a bare transaction,
    1,000 claims each on Postgres: docs/benchmarks.md, the third pass)."""
    return (select(Job).from_statement(core_update.returning(*_jobs.c))
            .execution_options(populate_existing=True))


_CLAIMING = (
    update(_jobs).where(
        _jobs.c.id == bindparam("job_id"), _jobs.c.iteration == bindparam("at_iteration"),
        _jobs.c.status.in_(LIVE_STATUSES),
        or_(_jobs.c.step_lease_until.is_(None),
            _jobs.c.step_lease_until < _param("now", _jobs.c.step_lease_until)),
        # a job waiting for its provider is not tried before its time (a duplicate or
        # stray message claims nothing), unless it is to be cancelled
        or_(_jobs.c.waiting_for.is_distinct_from(WaitingFor.PROVIDER),
            _jobs.c.provider_next_attempt_at.is_(None),
            _jobs.c.provider_next_attempt_at <= _param("early", _jobs.c.provider_next_attempt_at),
            _jobs.c.cancel_requested_at.is_not(None)))
    .values(step_owner=bindparam("owner"),
            step_lease_until=_param("lease_until", _jobs.c.step_lease_until),
            last_progress_at=_param("now", _jobs.c.last_progress_at), redrive_after=None))
_CLAIM = _loading(_CLAIMING)
"""Step 1, the claim: compare-and-set on the job row (built once; its parameters per call)."""

_ADVANCING = (
    update(_jobs).where(_jobs.c.id == bindparam("job_id"),
                        _jobs.c.iteration == bindparam("at_iteration"),
                        _jobs.c.step_owner == bindparam("owner"),
                        _jobs.c.status.in_(LIVE_STATUSES))
    .values(iteration=bindparam("turn_no"), step_owner=None, step_lease_until=None,
            last_progress_at=_param("now", _jobs.c.last_progress_at), redrives=0,
            waiting_for=None, provider_wait_since=None, provider_next_attempt_at=None,
            provider_attempts=0, claimed_attempts=0, redrive_after=None,
            input_tokens=_jobs.c.input_tokens + _param("add_input", _jobs.c.input_tokens),
            output_tokens=_jobs.c.output_tokens + _param("add_output", _jobs.c.output_tokens),
            cost_estimate=_jobs.c.cost_estimate + _param("cost", _jobs.c.cost_estimate)))
ADVANCE = _loading(_ADVANCING)
"""Step 7, the persist's compare-and-set: iteration k → k+1 under this step's lease, the
call's usage added."""
ADVANCE_WITH_USAGE = {
    charged: select(Job).from_statement(with_usage(_ADVANCING, charged))
    .execution_options(populate_existing=True) for charged in (True, False)}
"""`ADVANCE` with the call's token log and its user's charge in one statement (Postgres;
`agentq.loop.store.with_usage`): when the compare-and-set fails, nothing is written."""

_versions = aliased(ConversationSummary)


def _who(job: type[Job] | None) -> Select[Any]:
    """Who, where, as whom, whether the user has memories, the conversation's current
    summary (its highest version; None before the first) and the tenant's default context
    layers: of the job whose ids are bound (`job` None), or of `job`'s row (an entity),
    which comes first."""
    who = (User, Conversation, Persona, memory.has_memories_clause(User.id),
           ConversationSummary, Tenant.bootstrap, Tenant.skills)
    conversation_id: SQLColumnExpression[uuid.UUID]
    persona_id: SQLColumnExpression[uuid.UUID | None]
    if job is None:
        query = (select(*who).select_from(User).where(User.id == bindparam("user_id")))
        conversation_id, persona_id = bindparam("conversation_id"), bindparam("persona_id")
    else:
        query = select(job, *who).select_from(job).join(User, User.id == job.user_id)
        conversation_id, persona_id = job.conversation_id, job.persona_id
    return (query.join(Tenant, Tenant.id == User.tenant_id)
            .join(Conversation, Conversation.id == conversation_id)
            .outerjoin(Persona, Persona.id == persona_id)
            .outerjoin(ConversationSummary, ConversationSummary.id == (
                select(_versions.id).where(_versions.conversation_id == Conversation.id)
                .order_by(_versions.version.desc()).limit(1).scalar_subquery())))


_WHO = _who(None)
"""Who, where, as whom, whether the user has memories, the conversation's current
summary and the tenant's default context layers: one round trip (SQLite, after the
claim)."""


class SeenCall(NamedTuple):
    """A call of the turn a job's tools ran, as its step's claim read it (`Who.calls`)."""
    name: str
    tool_use_id: str
    result: dict[str, Any] | None
    status: str
    position: int
    iteration: int
    held: bool
    """It waited for a person's approval (its `approval_expires_at` set)."""


class Who(NamedTuple):
    """`_WHO`'s row: what a step reads with its claim."""
    user: User
    conversation: Conversation
    persona: Persona | None
    has_memories: bool
    summary: ConversationSummary | None
    """The conversation's current summary; None before the first."""
    bootstrap: str | None
    """The tenant's default context layers (`agentq.loop.layers.TenantLayers`)."""
    skills: list[Any] | None
    calls: list[SeenCall] | None = None
    """When the job's tools ran (its phase `tools`): the calls of its turn, in call order,
    as the claim's statement saw them (its snapshot may predate a result committed while
    it waited for the job's row: a call seen pending is read again). None: not read."""
    context: TurnMessages | None = None
    """The job's messages (its question and those after the conversation's summary) and
    the history before its question, as the claim read them (`_turn_messages`); on the
    job's first step no messages of its own and the history before the conversation's next
    seq. None: not read (another dialect, or the claim was not asked for them)."""


def _turn_calls(job: type[Job]) -> ColumnElement[Any]:
    """The calls of `job`'s turn, when its tools ran, as one JSON array in call order (a
    scalar subquery: the claim's one row stays one row)."""
    call = json_object(
        ("name", ToolCall.name), ("tool_use_id", ToolCall.tool_use_id),
        ("result", ToolCall.result), ("status", ToolCall.status),
        ("position", ToolCall.position), ("iteration", ToolCall.iteration),
        ("held", ToolCall.approval_expires_at.is_not(None)))
    return (select(func.json_agg(aggregate_order_by(call, ToolCall.position)))
            .where(ToolCall.job_id == job.id, ToolCall.iteration == job.iteration,
                   job.phase == Phase.TOOLS)
            .scalar_subquery().label("turn_calls"))


def _turn_messages(job: type[Job]) -> ColumnElement[Any]:
    """What a turn's context is built from, read with the claim (`Who.context`): one JSON
    array of two, `[own, history]`, each of [seq, role, content, token_count] rows oldest
    first. `own`: the job's question (its first message) and its messages after the
    conversation's summary (the summary joined by `_who`); `history`: the `history`
    messages (a bound limit) before its question, or before the conversation's next seq
    when it has none yet. `agentq.loop.turn_context._OWN_AND_HISTORY` reads the same
    after the claim. NULL when `history` is bound NULL: not read.

    The claim's snapshot reads them. A conversation's messages are written by the job
    that holds it, one step at a time under the job's lease, and a step is sent only after
    the commit of what came before it: nothing this claim could have waited for (a row
    lock of the job's: a cancel, a lease renewal) writes the conversation's messages."""
    through = func.coalesce(ConversationSummary.through_seq, 0)
    mine, first, before = (aliased(Message, name=name) for name in ("mine", "first", "before"))
    own = (select(func.json_agg(aggregate_order_by(
        func.json_build_array(mine.seq, mine.role, mine.content, mine.token_count),
        mine.seq)))
        .where(mine.job_id == job.id, or_(mine.seq > through, mine.role == "user"))
        .scalar_subquery())
    # the history before the question: a range of seqs (a conversation's are gap-free),
    # read on (conversation_id, seq); its bounds are the claimed row's
    top = func.coalesce(
        select(func.min(first.seq)).where(first.job_id == job.id).correlate(job)
        .scalar_subquery(),
        Conversation.message_seq + 1)
    # typed in the SQL: a NULL bound for it is otherwise of no type Postgres can infer,
    # and the statement could not be prepared (`agentq.prepared`)
    limit = cast(bindparam("history", type_=Integer), Integer)
    history = (select(func.json_agg(aggregate_order_by(func.json_build_array(
        before.seq, before.role, before.content, before.token_count), before.seq)))
        .where(before.conversation_id == job.conversation_id, before.seq < top,
               before.seq >= top - limit)
        .scalar_subquery())
    empty: ColumnElement[Any] = literal_column("'[]'::json")
    return case((limit.is_(None), None),
                else_=func.json_build_array(func.coalesce(own, empty),
                                            func.coalesce(history, empty))
                ).label("turn_messages")


_claimed = aliased(Job, _CLAIMING.returning(*_jobs.c).cte("claimed"))
_CLAIM_WHO = (_who(_claimed).add_columns(_turn_calls(_claimed), _turn_messages(_claimed))
              .execution_options(populate_existing=True))
"""The claim, `_WHO`, the turn's calls and its messages in one statement (Postgres): the
compare-and-set as a data-modifying CTE returning the job's row, joined to its user,
conversation, persona, summary and tenant. No row when the claim fails; the job loaded
current."""


def claim(session: Session, job_id: uuid.UUID, iteration: int, owner: str,
          lease_s: float, history: int | None = None) -> tuple[Job, Who] | None:
    """Step 1: the claim, a lease of `lease_s` for `owner`, and what the step reads with it
    (`Who`): on Postgres one statement (`_CLAIM_WHO`), elsewhere the claim, then the read.
    `history`: the turn's messages are read too, with that many before its question
    (`Who.context`, Postgres). None: not claimed."""
    now = utcnow()
    params = {
        "job_id": job_id, "at_iteration": iteration, "now": now,
        "early": now + timedelta(seconds=PROVIDER_EARLY_TOLERANCE_S), "owner": owner,
        "lease_until": now + timedelta(seconds=lease_s), "history": history}
    if session.get_bind().dialect.name == "postgresql":
        row = session.execute(_CLAIM_WHO, params).one_or_none()
        if row is None:
            return None
        calls, messages = row[-2:]
        return row[0], Who._make([
            *row[1:-2], None if calls is None else [SeenCall(**call) for call in calls],
            None if messages is None else tuple(
                [StoredMessage(*m) for m in part] for part in messages)])
    job: Job | None = session.execute(_CLAIM, params).scalar_one_or_none()
    if job is None:
        return None
    return job, Who(*session.execute(_WHO, {
        "user_id": job.user_id, "conversation_id": job.conversation_id,
        "persona_id": job.persona_id}).one())
