"""The job's state machine as a table: every state × every transition either leads where the
table below says or is refused with `IllegalTransition`; the named transitions move a job
row through it; the state columns store the strings they always did."""
from __future__ import annotations

import itertools
import uuid
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa

from agentq.errors import IllegalTransition
from agentq.loop import lifecycle
from agentq.loop.lifecycle import JobState, Transition, next_state
from agentq.loop.states import (
    JOB_STATUSES,
    JobStatus,
    Phase,
    ReplayMode,
    ToolCallStatus,
    WaitingFor,
)
from agentq.models import Conversation, Job, ToolCall

Q, R, W = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.WAITING
C, F, X = JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED
LLM, TOOLS = Phase.LLM, Phase.TOOLS
ANY_PHASE = (LLM, TOOLS)
NOW = datetime(2026, 11, 27, tzinfo=timezone.utc)

# (transition, from status, from waiting_for, from phases) → (to status, to waiting_for);
# the phase is kept, except where a row names the phase it leads to. Written out by hand,
# from the lifecycle's diagram, not computed from `next_state`.
ALLOWED: dict[tuple[Transition, JobStatus, WaitingFor | None, Phase], JobState] = {}


def _allow(transition: Transition, status: JobStatus, waiting: WaitingFor | None,
           to_status: JobStatus, to_waiting: WaitingFor | None,
           phases: tuple[Phase, ...] = ANY_PHASE, to_phase: Phase | None = None) -> None:
    for phase in phases:
        ALLOWED[(transition, status, waiting, phase)] = JobState(
            to_status, to_waiting, to_phase or phase)


for wait in (WaitingFor.CONVERSATION, WaitingFor.BATCH, WaitingFor.QUOTA):
    _allow(Transition.ADMIT, Q, wait, Q, None)
_allow(Transition.QUEUE_BEHIND, Q, WaitingFor.BATCH, Q, WaitingFor.CONVERSATION)
_allow(Transition.HOLD_FOR_QUOTA, Q, None, Q, WaitingFor.QUOTA)
_allow(Transition.START, Q, None, R, None)
_allow(Transition.WAIT_FOR_PROVIDER, R, None, R, WaitingFor.PROVIDER)
_allow(Transition.RESUME_FROM_PROVIDER, R, WaitingFor.PROVIDER, R, None)
_allow(Transition.WAIT_FOR_APPROVAL, R, None, W, WaitingFor.APPROVAL)
_allow(Transition.WAIT_FOR_APPROVAL, W, WaitingFor.APPROVAL, W, WaitingFor.APPROVAL)
_allow(Transition.WAIT_FOR_CHILDREN, Q, None, W, WaitingFor.CHILDREN)
_allow(Transition.WAIT_FOR_CHILDREN, R, None, W, WaitingFor.CHILDREN)
_allow(Transition.RESUME, W, WaitingFor.APPROVAL, R, None)
_allow(Transition.RESUME, W, WaitingFor.CHILDREN, R, None)
_allow(Transition.RUN_TOOLS, R, None, R, None, (LLM,), TOOLS)
_allow(Transition.READ_RESULTS, R, None, R, None, (TOOLS,), LLM)
for end, ended in ((Transition.COMPLETE, C), (Transition.FAIL, F), (Transition.CANCEL, X)):
    for status in (Q, R, W):
        for wait in (None, *WaitingFor):
            _allow(end, status, wait, ended, wait)  # the end keeps what it waited for

STATES = list(itertools.product(JobStatus, (None, *WaitingFor), Phase))


def test_the_table_covers_every_status_and_every_transition():
    assert {s.value for s in JobStatus} == set(JOB_STATUSES)
    assert {t for t, *_ in ALLOWED} == set(Transition)
    assert len(STATES) * len(Transition) == 6 * 7 * 2 * 14


@pytest.mark.parametrize("transition", list(Transition))
def test_each_state_goes_where_the_table_says_or_is_refused(transition):
    for status, waiting, phase in STATES:
        expected = ALLOWED.get((transition, status, waiting, phase))
        if expected is None:
            with pytest.raises(IllegalTransition) as refused:
                next_state(JobState(status, waiting, phase), transition)
            assert (refused.value.transition, refused.value.status,
                    refused.value.waiting_for, refused.value.phase) == (
                transition.value, status.value, waiting.value if waiting else None,
                phase.value)
            assert refused.value.code == "illegal_transition"
        else:
            assert next_state(JobState(status, waiting, phase), transition) == expected, (
                transition, status, waiting, phase)


def test_an_ended_job_never_moves_again():
    for status in (C, F, X):
        for transition in Transition:
            for waiting in (None, *WaitingFor):
                with pytest.raises(IllegalTransition):
                    next_state(JobState(status, waiting, LLM), transition)


def _job(**state) -> Job:
    return lifecycle.new_job(tenant_id=uuid.uuid4(), conversation_id=uuid.uuid4(),
                             user_id=uuid.uuid4(), content="hi", now=NOW, **state)


def test_the_named_transitions_walk_a_job_through_its_life():
    job = _job(waiting_for=WaitingFor.BATCH)
    assert (job.status, job.waiting_for, job.phase) == (Q, WaitingFor.BATCH, LLM)
    lifecycle.queue_behind(job)
    lifecycle.admit(job, NOW)
    lifecycle.start(job, NOW)
    assert (job.status, job.waiting_for, job.started_at) == (R, None, NOW)
    lifecycle.wait_for_provider(job)
    assert job.waiting_for == WaitingFor.PROVIDER
    lifecycle.resume_from_provider(job)
    lifecycle.run_tools(job)
    assert job.phase == TOOLS
    lifecycle.wait_for_approval(job)
    lifecycle.wait_for_approval(job)  # a second call of the turn held
    assert (job.status, job.waiting_for) == (W, WaitingFor.APPROVAL)
    lifecycle.resume(job, NOW)
    lifecycle.read_results(job)
    assert (job.status, job.waiting_for, job.phase) == (R, None, LLM)


def test_a_refused_transition_names_the_job_and_changes_nothing():
    job = _job()
    with pytest.raises(IllegalTransition) as refused:
        lifecycle.resume(job, NOW)  # a queued job waits for no person
    assert refused.value.details["job_id"] == str(job.id)
    assert (job.status, job.waiting_for, job.phase) == (Q, None, LLM)


def test_a_conversation_is_taken_only_when_free():
    job, other = _job(), _job()
    conversation = Conversation(id=uuid.uuid4(), active_job_id=None)
    lifecycle.take_conversation(conversation, job)
    lifecycle.take_conversation(conversation, job)  # its owner already
    assert conversation.active_job_id == job.id
    with pytest.raises(IllegalTransition):
        lifecycle.take_conversation(conversation, other)
    assert conversation.active_job_id == job.id


def test_the_state_columns_store_the_strings_they_always_did():
    """Enum-typed columns, VARCHAR(16) as before: a row written as a string reads back as
    the member, and a member is written as its string."""
    engine = sa.create_engine("sqlite://")
    table = Job.__table__
    calls = ToolCall.__table__
    for column in (table.c.status, table.c.phase, table.c.waiting_for, table.c.replay_mode,
                   calls.c.status):
        assert str(column.type.compile(dialect=engine.dialect)) == "VARCHAR(16)"
        assert not any(isinstance(c, sa.CheckConstraint) for c in column.table.constraints
                       if column.name in str(getattr(c, "sqltext", "")))
    processor = table.c.status.type.bind_processor(engine.dialect)
    result = table.c.status.type.result_processor(engine.dialect, None)
    for member in JobStatus:
        stored = processor(member) if processor else member
        assert stored == member.value and type(stored) is str
        assert result(member.value) is member
    for kind, column in ((Phase, table.c.phase), (WaitingFor, table.c.waiting_for),
                         (ReplayMode, table.c.replay_mode), (ToolCallStatus, calls.c.status)):
        assert column.type.enums == [m.value for m in kind]
