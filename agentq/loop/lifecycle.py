"""A job's life, in one place: the transitions of its state, how it is made, how it ends.

    queued ──start──▶ running ──end──▶ completed | failed | cancelled
      │ ▲               │  ▲
      │ │ admit         │  │ resume (approved / denied / timed out; the last child ended)
      ▼ │               ▼  │
    queued + waiting_for   waiting + waiting_for = approval | children
      conversation | batch | quota
                        running + waiting_for = provider (shown `waiting` by the API)
    and, while running, phase llm ──run_tools──▶ tools ──read_results──▶ llm

A job's state is its `status`, `waiting_for` and `phase` (the values: `agentq.loop.states`).
Each change of them is one named function here (`start`, `admit`, `wait_for_approval`, …),
and each asks `next_state`, the table of what may follow what: a transition the table does
not allow raises `IllegalTransition` (a bug in our code, never the user's). A conversation
changes hands only here too (`take_conversation`, `active_job`, `release_conversation`).

Every job is made by `new_job` (a submission, a batch line, a follow-up of late steering, a
replay, a sub-agent) and ended by `end_job`, the one writer of end state: status, finish
reason, the response object, `job_end`, the conversation handed on, the webhook's first
delivery row, the batch advanced. The stop reason maps to the end status by an exhaustive
`match`. A sub-agent's end is its parent's too (`child_ended`, in the same unit of work): the
child's answer becomes its delegate call's result and the parent goes on after its last
child (`settle`); the delegate tool that starts children is `agentq.agents`.
"""
from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence, assert_never

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnElement

from agentq.config import Settings
from agentq.db import lock_row, utcnow
from agentq.errors import IllegalTransition
from agentq.ids import new_id
from agentq.loop.busy import (
    AFTER_ANSWER,
    ANSWER_AND_RELEASE,
    CALLS_OF,
    HAND_ON,
    NEXT_AND_QUOTA_WAITERS,
    RELEASE,
    pending_inputs,
    quota_waits,
)
from agentq.loop.effects import AdmitBatch, JobEnded, NextStep, SendWebhooks
from agentq.loop.response import response_object
from agentq.loop.states import (
    ENDED,
    LIVE_STATUSES,
    NOT_ADMITTED,
    JobStatus,
    Phase,
    ReplayMode,
    StopReason,
    ToolCallStatus,
    WaitingFor,
)
from agentq.models import Conversation, Job, ToolCall
from agentq.prebuilt import prebuilt
from agentq.prepared import deferred_writes
from agentq.tenants import cached_quotas, running_count
from agentq.tools.result import ToolResult

if TYPE_CHECKING:
    from agentq.loop.uow import UnitOfWork

__all__ = ["DELEGATE", "ENDED", "EXECUTION_LIMITS", "LIVE_STATUSES", "JobState", "JobStatus",
           "Phase", "ReplayMode", "StopReason", "ToolCallStatus", "Transition", "WaitingFor",
           "active_job", "admit", "admit_quota_waiters", "child_ended", "child_result",
           "end_job", "end_status", "end_unstarted", "hand_conversation", "may_start",
           "new_job", "next_state", "queue_behind", "read_results", "record_child",
           "release_conversation", "resume", "resume_from_provider", "run_tools", "settle",
           "start", "take_conversation", "wait_for_approval", "wait_for_children",
           "wait_for_provider"]

EXECUTION_LIMITS = (StopReason.MAX_ITERATIONS, StopReason.MAX_TOKENS, StopReason.MAX_TIME)
"""Stops that end a job `completed` with "[Agent stopped: <reason>]" in its conversation."""


# --- the table -------------------------------------------------------------------------------

class JobState(NamedTuple):
    status: JobStatus
    waiting_for: WaitingFor | None
    phase: Phase


class Transition(enum.StrEnum):
    ADMIT = "admit"
    """queued, waiting for its conversation, its batch or its tenant's quota → may start."""
    QUEUE_BEHIND = "queue_behind"
    """An admitted batch line whose conversation is busy: it waits for it."""
    HOLD_FOR_QUOTA = "hold_for_quota"
    """About to start, but its tenant runs `running_jobs` jobs already."""
    START = "start"
    """Its first step: queued → running."""
    WAIT_FOR_PROVIDER = "wait_for_provider"
    RESUME_FROM_PROVIDER = "resume_from_provider"
    WAIT_FOR_APPROVAL = "wait_for_approval"
    WAIT_FOR_CHILDREN = "wait_for_children"
    RESUME = "resume"
    """A person answered every held call, or its last sub-agent ended."""
    RUN_TOOLS = "run_tools"
    """The model asked for tools: the next step collects their results."""
    READ_RESULTS = "read_results"
    """The turn's tool results are in the conversation: the next step calls the model."""
    COMPLETE = "complete"
    FAIL = "fail"
    CANCEL = "cancel"


_ENDS = {Transition.COMPLETE: JobStatus.COMPLETED, Transition.FAIL: JobStatus.FAILED,
         Transition.CANCEL: JobStatus.CANCELLED}


def next_state(state: JobState, transition: Transition) -> JobState:
    """The state `transition` leads to from `state`; `IllegalTransition` when the table has
    no such move. Pure: the one place that says what may follow what."""
    status, waiting, phase = state
    match transition:
        case Transition.ADMIT if status == JobStatus.QUEUED and waiting in NOT_ADMITTED:
            return JobState(JobStatus.QUEUED, None, phase)
        case Transition.QUEUE_BEHIND if (status == JobStatus.QUEUED
                                         and waiting == WaitingFor.BATCH):
            return JobState(JobStatus.QUEUED, WaitingFor.CONVERSATION, phase)
        case Transition.HOLD_FOR_QUOTA if status == JobStatus.QUEUED and waiting is None:
            return JobState(JobStatus.QUEUED, WaitingFor.QUOTA, phase)
        case Transition.START if status == JobStatus.QUEUED and waiting is None:
            return JobState(JobStatus.RUNNING, None, phase)
        case Transition.WAIT_FOR_PROVIDER if status == JobStatus.RUNNING and waiting is None:
            return JobState(JobStatus.RUNNING, WaitingFor.PROVIDER, phase)
        case Transition.RESUME_FROM_PROVIDER if (status == JobStatus.RUNNING
                                                 and waiting == WaitingFor.PROVIDER):
            return JobState(JobStatus.RUNNING, None, phase)
        case Transition.WAIT_FOR_APPROVAL if (
                (status == JobStatus.RUNNING and waiting is None)
                or (status == JobStatus.WAITING and waiting == WaitingFor.APPROVAL)):
            return JobState(JobStatus.WAITING, WaitingFor.APPROVAL, phase)
        case Transition.WAIT_FOR_CHILDREN if (status in (JobStatus.QUEUED, JobStatus.RUNNING)
                                              and waiting is None):
            return JobState(JobStatus.WAITING, WaitingFor.CHILDREN, phase)
        case Transition.RESUME if status == JobStatus.WAITING and waiting in (
                WaitingFor.APPROVAL, WaitingFor.CHILDREN):
            return JobState(JobStatus.RUNNING, None, phase)
        case Transition.RUN_TOOLS if (status == JobStatus.RUNNING and waiting is None
                                      and phase == Phase.LLM):
            return JobState(JobStatus.RUNNING, None, Phase.TOOLS)
        case Transition.READ_RESULTS if (status == JobStatus.RUNNING and waiting is None
                                         and phase == Phase.TOOLS):
            return JobState(JobStatus.RUNNING, None, Phase.LLM)
        case Transition.COMPLETE | Transition.FAIL | Transition.CANCEL if status not in ENDED:
            return JobState(_ENDS[transition], waiting, phase)
    raise IllegalTransition(transition.value, status.value,
                            waiting.value if waiting is not None else None, phase.value)


def state_of(job: Job) -> JobState:
    return JobState(JobStatus(job.status),
                    WaitingFor(job.waiting_for) if job.waiting_for is not None else None,
                    Phase(job.phase))


def _move(job: Job, transition: Transition) -> None:
    try:
        to = next_state(state_of(job), transition)
    except IllegalTransition as exc:
        exc.details["job_id"] = str(job.id)
        raise
    # an attribute set to its value again is not in the UPDATE (no index is touched)
    job.status, job.waiting_for, job.phase = to.status, to.waiting_for, to.phase


# --- the transitions -------------------------------------------------------------------------

def start(job: Job, now: datetime) -> None:
    """The job's first step: it runs from `now`."""
    _move(job, Transition.START)
    job.started_at = now


def admit(job: Job, now: datetime) -> None:
    """Its conversation, its batch or its tenant's quota let the queued job start."""
    _move(job, Transition.ADMIT)
    job.last_progress_at = now


def queue_behind(job: Job) -> None:
    """An admitted batch line waits for its busy conversation (it starts when handed it)."""
    _move(job, Transition.QUEUE_BEHIND)


def hold_for_quota(job: Job) -> None:
    _move(job, Transition.HOLD_FOR_QUOTA)


def wait_for_provider(job: Job) -> None:
    """Every model failed transiently: the job holds no worker until its next attempt (the
    caller sets when)."""
    _move(job, Transition.WAIT_FOR_PROVIDER)


def resume_from_provider(job: Job) -> None:
    _move(job, Transition.RESUME_FROM_PROVIDER)
    job.provider_next_attempt_at = None


def wait_for_approval(job: Job) -> None:
    """A call of the turn awaits a person: the job holds no worker meanwhile."""
    _move(job, Transition.WAIT_FOR_APPROVAL)


def wait_for_children(job: Job) -> None:
    """Its sub-agents run: the last one's end wakes it."""
    _move(job, Transition.WAIT_FOR_CHILDREN)


def resume(job: Job, now: datetime) -> None:
    """No call of the turn awaits a person, or no sub-agent of it runs, any more."""
    _move(job, Transition.RESUME)
    job.last_progress_at = now


def run_tools(job: Job) -> None:
    _move(job, Transition.RUN_TOOLS)


def read_results(job: Job) -> None:
    _move(job, Transition.READ_RESULTS)


def may_start(session: Session, job: Job, settings: Settings | None = None,
              running: int | None = None) -> bool:
    """Whether `job`, about to take its first step, fits in its tenant's running-jobs
    quota; if not it waits for it (`hold_for_quota`; the caller sends no step). Concurrent
    starts of one tenant may pass the quota by as many as race. `running`: the tenant's
    other running jobs, read by the caller (`tenants.RUNNING_NOW`); None: read here."""
    limit = cached_quotas(session, job.tenant_id, settings).running_jobs
    if running is None and limit:
        running = running_count(session, job.tenant_id, besides=job.id)
    if limit and running is not None and running >= limit:
        hold_for_quota(job)
        return False
    return True


def hand_conversation(uow: UnitOfWork, conversation: Conversation, job: Job, now: datetime,
                      settings: Settings | None = None) -> None:
    """`job`, queued for `conversation` (found free), takes it: admitted, its owner, and its
    first step sent unless its tenant's running-jobs quota holds it (`may_start`)."""
    admit(job, now)
    take_conversation(conversation, job)
    if may_start(uow.session, job, settings):
        uow.effect(NextStep(str(job.id), 0, "start"))


def admit_quota_waiters(uow: UnitOfWork, tenant_id: uuid.UUID,
                        settings: Settings | None = None, waiters: bool | None = None) -> int:
    """Start the tenant's jobs that wait for its running-jobs quota, oldest first, as many
    as there is room for now (each locked, skipping one another process is starting).
    Called when a job of the tenant ends, and by the sweeper. Returns how many.
    `waiters`: whether any waits, read by the caller in this transaction (None: read
    here)."""
    session = uow.session
    waits = quota_waits(tenant_id)
    if waiters is None:
        waiters = session.execute(select(Job.id).where(*waits).limit(1)).first() is not None
    if not waiters:
        return 0  # the usual case: one probe of a (nearly always empty) partial index
    waiting = select(Job).where(*waits)
    limit = cached_quotas(session, tenant_id, settings).running_jobs
    if limit:
        room = limit - running_count(session, tenant_id)
        if room <= 0:
            return 0
        waiting = waiting.limit(room)
    jobs = session.execute(waiting.order_by(Job.created_at, Job.id)
                           .with_for_update(skip_locked=True)).scalars().all()
    now = utcnow()
    for job in jobs:
        admit(job, now)
        uow.effect(NextStep(str(job.id), 0, "start"))
    return len(jobs)


# --- a conversation's owner ------------------------------------------------------------------

def take_conversation(conversation: Conversation, job: Job) -> None:
    """`job` owns `conversation` from now: the caller found it free (`active_job` None)."""
    if conversation.active_job_id not in (None, job.id):
        status, waiting, phase = state_of(job)
        raise IllegalTransition("take_conversation", status.value,
                                waiting.value if waiting is not None else None, phase.value,
                                job_id=str(job.id), owner=str(conversation.active_job_id))
    conversation.active_job_id = job.id


def active_job(session: Session, conversation: Conversation) -> Job | None:
    """The live job that owns the conversation, or None; a pointer left at an ended job
    (or a deleted one) is let go of here."""
    if conversation.active_job_id is None:
        return None
    job = session.get(Job, conversation.active_job_id)
    if job is None or job.status in ENDED:
        conversation.active_job_id = None
        return None
    return job


# --- making and ending -----------------------------------------------------------------------

def end_status(reason: StopReason | str) -> JobStatus:
    """The status a job ends in for `reason`: every reason named, none falls through."""
    match StopReason(reason):
        case (StopReason.END_TURN | StopReason.LENGTH | StopReason.MAX_ITERATIONS
              | StopReason.MAX_TOKENS | StopReason.MAX_TIME | StopReason.HOOK):
            return JobStatus.COMPLETED
        case StopReason.BUDGET_EXCEEDED | StopReason.ERROR:
            return JobStatus.FAILED
        case StopReason.CANCELLED:
            return JobStatus.CANCELLED
        case unreachable:
            assert_never(unreachable)


_END_BY = {JobStatus.COMPLETED: Transition.COMPLETE, JobStatus.FAILED: Transition.FAIL,
           JobStatus.CANCELLED: Transition.CANCEL}


def new_job(*, tenant_id: uuid.UUID, conversation_id: uuid.UUID, user_id: uuid.UUID,
            content: str, now: datetime, persona_id: uuid.UUID | None = None,
            api_key_id: uuid.UUID | None = None,
            attachments: list[dict[str, Any]] | None = None,
            meta: dict[str, Any] | None = None, callback_url: str | None = None,
            on_busy: str = "queue", model: str | None = None, stream: bool = False,
            limits: dict[str, Any] | None = None,
            waiting_for: WaitingFor | None = None, **extra: Any) -> Job:
    """A queued job's row with every counter at its start (the caller adds it)."""
    waiting = WaitingFor(waiting_for) if waiting_for is not None else None
    return Job(id=new_id(), tenant_id=tenant_id, status=JobStatus.QUEUED,
               conversation_id=conversation_id, user_id=user_id, persona_id=persona_id,
               api_key_id=api_key_id, content=content, attachments=attachments or [],
               meta=meta or {}, callback_url=callback_url, on_busy=on_busy, model=model,
               stream=stream, iteration=0, phase=Phase.LLM, event_seq=0, redrives=0,
               input_tokens=0, output_tokens=0, cost_estimate=0.0, waiting_for=waiting,
               created_at=now, last_progress_at=now, limits=limits or None, **extra)


def end_job(uow: "UnitOfWork", job: Job, reason: StopReason | str, content: str,
            error: dict[str, Any] | None,
            last: tuple[str, str, str | None] | None = None) -> None:
    """End a live job: the one writer of end state. In the caller's unit of work: the
    status `end_status(reason)`, the response, the conversation handed to its next job,
    `job_end`, the webhook's first delivery row; after the commit `JobEnded` (and the
    batch's `AdmitBatch`) go out. `last`: the job's last message (role, content,
    model_used), appended to its conversation as the job lets it go."""
    from agentq.webhooks.outbox import enqueue_job_event
    session = uow.session
    ended = end_status(reason)
    status, reason = ended.value, StopReason(reason).value
    if any(isinstance(o, ToolCall) for o in (*session.new, *session.dirty)):
        session.flush()  # results stored in this transaction (autoflush may be off)
    _move(job, _END_BY[ended])  # refused for a job that has ended already
    job.finish_reason = reason
    job.finished_at = utcnow()
    job.step_owner = job.step_lease_until = None
    job.error = error["message"] if error else None
    # Lock order, everywhere: a job's row, then conversations, then the rows of jobs that
    # wait for them. A batch's row is only ever locked first, in its own transaction.
    # The conversation is handed on first, so a follow-up made from late steering is named
    # (`steering_deferred`, the job's `follow_up_job_id`) before `job_end` closes streams.
    released = release_conversation(uow, job, last)
    job.response = response_object(content, error, released.calls)
    # its place in the tenant's running jobs
    admit_quota_waiters(uow, job.tenant_id, waiters=released.quota_waiters)
    uow.event(job.id, "job_end", status=status, finish_reason=reason,
              **({"follow_up_job_id": str(job.follow_up_job_id)}
                 if job.follow_up_job_id else {}))
    uow.effect(JobEnded(str(job.id), status, reason))
    if job.parent_job_id is not None:  # a sub-agent: its answer is its parent's tool result
        child_ended(uow, job)
    delivery = enqueue_job_event(session, job)  # its webhook's first delivery row
    if delivery is not None:
        uow.effect(SendWebhooks((str(delivery.id),)))
    if job.batch_id is not None:
        uow.effect(AdmitBatch(str(job.batch_id)))


def end_unstarted(session: Session, where: tuple[ColumnElement[bool], ...],
                  error: dict[str, Any], now: datetime) -> None:
    """Cancel, in one statement, jobs that never started and hold nothing: a cancelled
    batch's lines not admitted yet (thousands at once). They hold no conversation and have
    no webhook (the caller ends those with `end_job`), so no event or effect is due."""
    session.execute(update(Job).where(*where)
                    .values(status=JobStatus.CANCELLED,
                            finish_reason=StopReason.CANCELLED, finished_at=now,
                            waiting_for=None, error=error["message"],
                            response=response_object("", error, []))
                    .execution_options(synchronize_session=False))


class Released(NamedTuple):
    """What `release_conversation` read on its way."""
    calls: Sequence[Any]
    """The job's calls, the columns its response needs (`CALLS_OF`), in call order."""
    quota_waiters: bool | None
    """Whether the tenant has jobs waiting for its running-jobs quota (None: not read)."""


def release_conversation(uow: "UnitOfWork", job: Job,
                         last: tuple[str, str, str | None] | None = None) -> Released:
    """The ended job's conversation goes to the next waiting job; steering that arrived
    too late for the job's last turn becomes a follow-up job first. `last`: the job's last
    message (role, content, model_used), appended to the conversation first (on Postgres
    by the statement that lets the conversation go, `ANSWER_AND_RELEASE`, sent with the
    read after it: one round trip for both)."""
    from agentq.loop.store import (
        append_messages,
        forget_loaded,
        message_parameters,
        sync_loaded,
    )
    session = uow.session
    now = utcnow()
    waits = {"conversation_id": job.conversation_id, "tenant_id": job.tenant_id}
    # on Postgres, the last message goes with the release, sent with the read after it
    answered = last if session.get_bind().dialect.name == "postgresql" else None
    next_id: uuid.UUID | None
    if answered is not None:
        with deferred_writes(session):
            prebuilt(ANSWER_AND_RELEASE).execute(session, {
                **message_parameters(job.conversation_id, job.id, answered, now),
                "job_id": job.id})
        forget_loaded(session, Conversation, job.conversation_id, "message_seq",
                      "active_job_id", "last_active_at")
        next_id, quota_waiters, released, shown = prebuilt(AFTER_ANSWER).one(session, {
            **waits, "job_id": job.id, "now": now})
        calls: Sequence[Any] = [_Call(**call) for call in shown or ()]
        if not released:  # not the conversation's owner: only its message was written
            return Released(calls, None)
    else:
        if last is not None:
            append_messages(session, job.conversation_id, job.id, [last], now)
        calls = prebuilt(CALLS_OF).rows(session, {"job_id": job.id})
        # one statement checks that the job holds its conversation, locks the row and
        # lets go of it (a job that never held it locks nothing)
        if prebuilt(RELEASE).first(session, {"conversation_id": job.conversation_id,
                                             "job_id": job.id, "now": now}) is None:
            return Released(calls, None)
        sync_loaded(session, Conversation, job.conversation_id, active_job_id=None,
                    last_active_at=now)
        next_id = None
    late = pending_inputs(session, job.id) if job.pending_inputs else []
    if late:
        follow_up = new_job(tenant_id=job.tenant_id, conversation_id=job.conversation_id,
                            user_id=job.user_id, persona_id=job.persona_id,
                            api_key_id=job.api_key_id,
                            content="\n\n".join(i.content for i in late),
                            meta={"follow_up_of": str(job.id)},
                            callback_url=job.callback_url, model=job.model, now=now,
                            waiting_for=WaitingFor.CONVERSATION)
        session.add(follow_up)
        job.follow_up_job_id = follow_up.id
        for entry in late:
            entry.consumed_at = now
        uow.event(job.id, "steering_deferred", follow_up_job_id=str(follow_up.id),
                  inputs=len(late), input_ids=[str(i.id) for i in late])
        session.flush()
    if late or answered is None:
        # read after the lock on the conversation was taken (by the statement that let it
        # go): a job queued for it meanwhile, or the follow-up just made, is seen
        next_id, quota_waiters = prebuilt(NEXT_AND_QUOTA_WAITERS).one(session, waits)
    nxt = session.get(Job, next_id) if next_id is not None else None
    if nxt is None:
        return Released(calls, quota_waiters)
    admit(nxt, now)
    prebuilt(HAND_ON).execute(session, {"conversation_id": job.conversation_id,
                                        "next_id": nxt.id})
    sync_loaded(session, Conversation, job.conversation_id, active_job_id=nxt.id)
    if may_start(session, nxt):  # else it holds the conversation, waiting for the quota
        uow.effect(NextStep(str(nxt.id), 0, "start"))
    return Released(calls, None)  # read again: the job handed on may wait for the quota


class _Call(NamedTuple):
    """A job's call as `AFTER_ANSWER` reads it (`CALLS_OF`'s columns)."""
    name: str
    tool_use_id: str
    result: dict[str, Any] | None
    arguments: Any
    status: str


# --- a sub-agent's end, on its parent ------------------------------------------------------------

DELEGATE = "agents.delegate"
"""The tool whose call starts a sub-agent (`agentq.agents`): the call stays pending while
its child runs, and the child's end is its result."""


def child_ended(uow: UnitOfWork, child: Job) -> None:
    """In a sub-agent's end (`end_job`): its answer or error becomes its call's result, its
    tokens count in the parent's, and the parent goes on when this was its last child."""
    session = uow.session
    parent = lock_row(session, Job, child.parent_job_id)  # the child's row, then the parent's
    if parent is None:
        return
    parent.input_tokens += child.input_tokens or 0
    parent.output_tokens += child.output_tokens or 0
    parent.cost_estimate = (parent.cost_estimate or 0.0) + (child.cost_estimate or 0.0)
    if parent.status in ENDED:
        return
    # `uow.event` would take the child's `job_id` for the parent's
    uow.events.append((parent.id, "child_ended",
                       {"job_id": str(child.id), "status": child.status}))
    iteration = record_child(uow, parent, child)
    if iteration is not None:
        settle(uow, parent, iteration)


def child_result(child: Job) -> tuple[ToolCallStatus, dict[str, Any]]:
    """(the call's status, its stored result) for an ended child."""
    response = child.response or {}
    if child.status == JobStatus.COMPLETED:
        # the child's id is in the events (child_started, tool_execution_end), not here:
        # a recorded replay's child answers the same and is another job
        return ToolCallStatus.SUCCEEDED, ToolResult.success({
            "answer": response.get("content") or "",
            "finish_reason": child.finish_reason}).to_record()
    error = response.get("error") or {}
    return ToolCallStatus.FAILED, ToolResult.failed(
        f"sub_agent_{child.status}",
        f"The sub-agent {child.status}: "
        f"{error.get('message') or child.error or child.finish_reason}",
        job_id=str(child.id), finish_reason=child.finish_reason,
        cause=error.get("code")).to_record()


def record_child(uow: UnitOfWork, parent: Job, child: Job) -> int | None:
    """Store the ended child's result on its call; the call's turn, or None when the call
    had an end already (cancelled with its parent)."""
    status, record = child_result(child)
    iteration = uow.session.execute(
        update(ToolCall).where(ToolCall.tool_use_id == child.parent_tool_use_id,
                               ToolCall.status == ToolCallStatus.PENDING)
        .values(status=status, result=record, finished_at=utcnow())
        .returning(ToolCall.iteration)).scalar_one_or_none()
    if iteration is not None:
        uow.event(parent.id, "tool_execution_end", tool_use_id=child.parent_tool_use_id,
                  name=DELEGATE, ok=record["ok"],
                  error=(record["error"] or {}).get("code"), attempts=1,
                  child_job_id=str(child.id))
    return iteration


def settle(uow: UnitOfWork, parent: Job, iteration: int) -> None:
    """No delegate call of the parent's turn `iteration` pending any more: the parent runs
    again (`resume`), and with no call of the turn pending at all its next step goes out."""
    if parent.status in ENDED or parent.iteration != iteration \
            or parent.phase != Phase.TOOLS:
        return
    uow.session.flush()
    calls = uow.session.execute(select(ToolCall.name, ToolCall.status).where(
        ToolCall.job_id == parent.id, ToolCall.iteration == iteration)).all()
    if any(name == DELEGATE and status == ToolCallStatus.PENDING for name, status in calls):
        return
    if parent.status == JobStatus.WAITING and parent.waiting_for == WaitingFor.CHILDREN:
        resume(parent, utcnow())
    if parent.status == JobStatus.RUNNING and not any(
            status in (ToolCallStatus.PENDING, ToolCallStatus.AWAITING) for _, status in calls):
        uow.effect(NextStep(str(parent.id), iteration, "callback"))
