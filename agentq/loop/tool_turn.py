"""A tool turn: the model's calls planned (step 7, `RunTools`) and their results collected
by the step after them (step 3 of `agentq.loop.step`).

Planning writes one `tool_calls` row per call, keyed by a tool_use_id stable per (job,
turn, position), so a persist that runs twice cannot make a second call. A call already
answered (`decide` rejected it) is stored failed; a call that needs a person's approval is
held (`agentq.loop.approvals`); the rest go out as one `DispatchTools` effect. A turn with
nothing to run sends its next step at once.

Local tools (DESIGN 1.2): the calls of a local module (`ToolRegistry.is_local`) are not
sent. The plan hands them back (`LocalTurn`) and, once its transaction has committed, the
step runs them itself (`run_local`), each as a tool task would (`execute_tool_call`: the
same checks, lease, stored result and events, so a re-driven turn runs again only a call
whose result was not committed), then sends the turn's other calls by chord. A turn whose
calls were all local goes on to its next step in the same task: no message, no broker hop.

Collecting turns the results, in call order, into tool_result messages; what the step does
with calls still pending is decided by `rules.after_tools`.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import bindparam, select

from agentq import agents
from agentq.db import insert_all, utcnow
from agentq.llm.types import LLMReply
from agentq.loop import approvals, replay, rules
from agentq.loop import uow as units
from agentq.loop.busy import CANCELLED_TOOL_RESULT
from agentq.loop.claim import SeenCall
from agentq.loop.context import StoredMessage, TurnMessages
from agentq.loop.decision import PlannedCall
from agentq.loop.effects import Cause, DispatchTools, Effect, NextStep
from agentq.loop.execute import execute_tool_call, turn_pending
from agentq.loop.lifecycle import (
    ReplayMode,
    ToolCallStatus,
    read_results,
    run_tools,
    wait_for_children,
)
from agentq.loop.store import append_after, append_unread
from agentq.loop.turn import Wired
from agentq.loop.uow import UnitOfWork
from agentq.models import Conversation, Job, ToolCall
from agentq.prepared import deferred_writes
from agentq.tools.result import ToolResult

log = logging.getLogger(__name__)
TOOL_LOST_RESULT = ToolResult.failed(
    "tool_task_failed", "The tool task ended without a result (its worker was lost or it hit "
    "its hard time limit).").to_record()
_TURN_CALLS = (select(ToolCall).where(ToolCall.job_id == bindparam("job_id"),
                                      ToolCall.iteration == bindparam("iteration"))
               .order_by(ToolCall.position))
"""A turn's calls, in call order (the step after its tools collects their results)."""


@dataclass(frozen=True)
class LocalTurn:
    """A planned turn with local calls, for the step to run once the plan has committed."""
    job_id: str
    turn: int
    calls: tuple[str, ...]
    """The local calls' tool_use_ids, in call order."""
    remote: DispatchTools | None
    """The turn's other calls, sent by chord after the local ones have run (the chord's
    callback then finds every result in)."""
    held: bool
    """Some calls wait for a person's approval: the approval's dispatch ends the turn."""


class ToolTurns:
    """The tool turns of one Stepper's jobs (its wiring read from it at each call)."""

    def __init__(self, step: Wired):
        self.step = step

    def limit(self, name: str) -> float:
        """A call's time limit in seconds: its tool's, or the default for a name no tool
        has (the call is answered with an error without running)."""
        registry = self.step.registry
        return (registry.time_limit_for(name) if name in registry.tools
                else self.step.settings.tool_time_limit_s)

    def queue_now(self, call: ToolCall) -> str:
        """Where a call sent again goes: its tool's queue in this deployment as it is now
        (a module made local or slow since the call was planned), or the one it was
        planned for when no tool of that name is offered now."""
        registry = self.step.registry
        return registry.queue_for(call.name) if call.name in registry.tools else call.queue

    # -- step 7: the calls planned ------------------------------------------------------
    def plan(self, uow: UnitOfWork, job: Job, turn_no: int, reply: LLMReply,
             calls: Sequence[PlannedCall], content: str, now: datetime,
             persona_tools: list[str] | None) -> LocalTurn | None:
        """The calls stored and sent, held or answered; `persona_tools`: those the job's
        persona holds for a person's approval. With local calls, nothing is sent here:
        the `LocalTurn` returned is for the step to run after the commit."""
        session, registry = uow.session, self.step.registry
        rows: list[tuple[str, str, str | None]] = []
        if content:
            rows.append(("assistant", content, reply.model))
        dispatch: list[tuple[str, str, float]] = []
        local: list[str] = []
        held: list[ToolCall] = []
        records: list[ToolCall] = []
        for position, call in enumerate(calls):
            tool_use_id = tool_use_id_of(job.id, turn_no, position)
            queue = registry.queue_for(call.name) if call.name in registry.tools else ""
            record = ToolCall(job_id=job.id, iteration=turn_no, position=position,
                              tool_use_id=tool_use_id, provider_call_id=call.provider_call_id,
                              name=call.name, arguments=call.arguments, queue=queue,
                              created_at=now)
            if call.error is not None:
                record.status, record.finished_at = ToolCallStatus.FAILED, now
                record.result = ToolResult(ok=False, error=call.error).to_record()
                # rejected before it ran (no tool_execution_start): its arguments go here
                uow.event(job.id, "tool_execution_end", tool_use_id=tool_use_id,
                          name=call.name, ok=False, error=call.error["code"],
                          arguments=(call.arguments if call.arguments is not None
                                     else call.raw_arguments))
            elif approvals.needs_approval(registry, call.name, persona_tools):
                held.append(record)
            else:
                in_step = registry.is_local(call.name.partition(".")[0])
                if in_step:
                    local.append(tool_use_id)
                else:
                    dispatch.append((tool_use_id, queue, self.limit(call.name)))
                uow.event(job.id, "tool_execution_start", tool_use_id=tool_use_id,
                          name=call.name, arguments=call.arguments, queue=queue,
                          idempotent=getattr(registry.tools.get(call.name),
                                             "idempotent", False),
                          **({"local": True} if in_step else {}))
            records.append(record)
            rows.append(("tool_call", json.dumps({"name": call.name,
                                                  "arguments": call.arguments,
                                                  "tool_use_id": tool_use_id}), reply.model))
        # not flushed: the job's row then goes with its events; nothing is read from the
        # INSERT or the messages' append: both go with the commit
        with deferred_writes(session):
            insert_all(session, records)
        append_unread(session, job.conversation_id, job.id, rows, now)
        run_tools(job)
        remote = DispatchTools(str(job.id), turn_no, tuple(dispatch)) if dispatch else None
        if remote is not None and not local:
            uow.effect(remote)
        for record in held:  # they wait for a person; the job holds no worker meanwhile
            approvals.hold(uow, job, record, approvals.deadline(
                registry, self.step.settings, record.name, now))
        if local:
            return LocalTurn(str(job.id), turn_no, tuple(local), remote, bool(held))
        if not dispatch and not held:
            uow.effect(NextStep(str(job.id), turn_no, "continue"))
        return None

    # -- after step 7's commit: the local calls run -------------------------------------
    def run_local(self, turn: LocalTurn) -> tuple[list[Effect], int | None]:
        """Run a turn's local calls here, one after another, each bounded by its limit
        (`ToolRegistry.time_limit_for`); then send its other calls by chord. Returns the
        effects sent and, when every call of the turn has its result, the iteration of
        the next step, which the caller runs itself (the same task: no message sent)."""
        step = self.step
        job_id = uuid.UUID(turn.job_id)
        for tool_use_id in turn.calls:
            outcome = execute_tool_call(tool_use_id, step.settings, step.registry,
                                        step.sessions, join=False)
            log.info("local tool call ran in the step",
                     extra={"job_id": turn.job_id, "tool_use_id": tool_use_id,
                            "status": outcome.status})
        if turn.remote is not None:  # the chord's callback collects the turn
            return ([turn.remote] if units.send([turn.remote]) else []), None
        if turn.held and turn_pending(step.sessions, job_id, turn.turn):
            return [], None  # a held call's dispatch, once approved, collects the turn
        return [], turn.turn

    # -- step 3: the results collected --------------------------------------------------
    def collect(self, uow: UnitOfWork, job: Job, conversation: Conversation,
                cause: Cause, seen: list[SeenCall] | None = None,
                messages: TurnMessages | None = None) -> rules.AfterTools:
        """Tool results of the last turn → tool_result messages, in call order (`Collect`);
        or the step ends here: the job waits for its sub-agents or another dispatch, or
        the lost calls of a re-driven turn go out again (a `DispatchTools` effect).
        `seen`: the turn's calls as the step's claim read them; used when every result
        was in (the usual case), else the calls are read here. `messages`: the turn's
        messages as the claim read them; the results' are added to the job's own."""
        session = uow.session
        calls: Sequence[ToolCall | SeenCall]
        if seen and job.replay_mode != ReplayMode.RECORDED and not any(
                c.status == ToolCallStatus.PENDING for c in seen):
            calls, pending = seen, []
        else:
            calls = session.execute(_TURN_CALLS, {"job_id": job.id,
                                                  "iteration": job.iteration}).scalars().all()
            pending = [c for c in calls if c.status == ToolCallStatus.PENDING]
        cancelled = job.cancel_requested_at is not None
        after = rules.after_tools(
            pending=bool(pending), cancelled=cancelled, cause=cause,
            children_running=(bool(pending) and not cancelled
                              and agents.awaits_children(session, pending)),
            split_turn=any(c.held if isinstance(c, SeenCall)
                           else c.approval_expires_at is not None for c in calls))
        match after:
            case rules.AwaitChildren():
                # its sub-agents still run: the last one's end sends this step again
                wait_for_children(job)
            case rules.AwaitDispatch():
                pass  # another dispatch of this turn (an approved call) runs
            case rules.Redispatch():
                log.warning("re-dispatching lost tool calls",
                            extra={"job_id": str(job.id), "count": len(pending)})
                uow.effect(DispatchTools(str(job.id), job.iteration, tuple(
                    (c.tool_use_id, self.queue_now(c), self.limit(c.name)) for c in pending)))
            case rules.Collect():
                written = self._collect(uow, job, conversation, calls, pending,
                                        after.cancelled)
                if messages is not None:
                    messages[0].extend(written)
        return after

    def _collect(self, uow: UnitOfWork, job: Job, conversation: Conversation,
                 calls: Sequence[ToolCall | SeenCall], pending: Sequence[ToolCall],
                 cancelled: bool) -> list[StoredMessage]:
        """The results' messages, as written."""
        now = utcnow()
        for call in pending:
            record: dict[str, Any] = CANCELLED_TOOL_RESULT if cancelled else TOOL_LOST_RESULT
            call.status = ToolCallStatus.CANCELLED if cancelled else ToolCallStatus.FAILED
            call.result, call.finished_at = record, now
            uow.event(job.id, "tool_execution_end", tool_use_id=call.tool_use_id,
                      name=call.name, ok=False, error=record["error"]["code"])
        # sent with the transaction's next statement (`store.append_after`)
        written = append_after(uow.session, conversation, job.id, [
            ("tool_result", json.dumps({"name": c.name, "tool_use_id": c.tool_use_id,
                                        **(c.result or {})}), None)
            for c in calls], now)
        read_results(job)
        if job.replay_mode == ReplayMode.RECORDED:
            read = [c for c in calls if isinstance(c, ToolCall)]  # a replay reads its calls
            for diverged in replay.divergences(uow.session, job, read):
                uow.event(job.id, "replay_diverged", **diverged)
        uow.event(job.id, "turn_end", turn=job.iteration,
                  tool_results=[{"tool_use_id": c.tool_use_id, "name": c.name,
                                 "ok": bool((c.result or {}).get("ok"))} for c in calls])
        return written


def tool_use_id_of(job_id: uuid.UUID, turn: int, position: int) -> str:
    """Stable per (job, turn, position): a duplicated persist cannot make a second call."""
    return "tool_" + uuid.uuid5(job_id, f"{turn}:{position}").hex[:24]
