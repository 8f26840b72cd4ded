"""A turn in flight: what the step's first transaction hands to the model call, and what
every part of a step (`agentq.loop.step`, `.turn_context`, `.compaction`, `.recall`,
`.endings`, `.provider_wait`) shares.

The parts do not copy the step's wiring: they read it from the step (`Wired`) at each call,
so a test that swaps a Stepper's router, sessions or hooks swaps them for every part.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agentq.config import Settings
from agentq.hooks import Hooks
from agentq.llm.types import LLMReply, ToolSpec
from agentq.loop import context
from agentq.loop.compaction_plan import Compaction
from agentq.loop.lifecycle import LIVE_STATUSES
from agentq.models import Job
from agentq.tools.registry import ToolRegistry

if TYPE_CHECKING:  # the router is passed in; its module imports the provider SDKs
    from agentq.llm.router import LLMRouter


class Wired(Protocol):
    """What the parts of a step read from it (a `Stepper` is one)."""
    settings: Settings
    router: LLMRouter
    registry: ToolRegistry
    sessions: sessionmaker[Session]
    hooks: Hooks


@dataclass
class Turn:
    """What the claim transaction hands to the model call."""
    messages: list[dict[str, Any]]
    tools: list[ToolSpec]
    model: str
    max_tokens: int | None
    recorded: LLMReply | None = None
    """A recorded replay's answer for this turn: no provider is called, nothing billed."""
    layers: context.Layers | None = None
    budget: int = 0
    stub_before: int | None = None
    compaction: Compaction | None = None
    summary_version: int = 0
    resumed: bool = False
    """The turn was announced by an earlier run of its step (its provider was waited for)."""
    recall_user: uuid.UUID | None = None
    """Set when the user has memories: the top matches for the question join the context."""
    recall_key: uuid.UUID | None = None
    """The job's API key: a non-admin key recalls only its own conversations' memories."""
    stream: bool = False
    """Stream the reply: message_delta events through the hub as the text arrives."""
    turn: int = 0
    conversation_id: uuid.UUID | None = None
    backlog_end: int = 0
    """Messages up to this seq are left out of the history read: unsummarised, a backlog."""
    rounds: int = 0
    """Compaction rounds (summary calls) made in this step."""
    compacted_by: str | None = None
    """A custom compaction strategy (AGENTQ_COMPACTION_STRATEGY) compacted this turn: it
    compacts each assembly of it again, and fitting the window is its business."""
    job_id: str | None = None
    approval_tools: list[str] | None = None
    """The tools the job's persona holds for a person's approval (read with the persona by
    the step's first transaction: a tool turn's persist does not read the persona again)."""

    @property
    def built(self) -> context.Layers:
        """The turn's context layers (set by the step's first transaction before any part
        that reads them runs)."""
        if self.layers is None:
            raise RuntimeError("the turn's context was not built")
        return self.layers


def leased(session: Session, job_id: str, iteration: int, owner: str) -> Job | None:
    """The job, if it is still live at `iteration` under this step's lease."""
    return session.execute(
        select(Job).where(Job.id == uuid.UUID(job_id), Job.iteration == iteration,
                          Job.step_owner == owner, Job.status.in_(LIVE_STATUSES))
    ).scalar_one_or_none()


def hook_ctx(job: Job, turn: int) -> dict[str, Any]:
    """What every hook hears of the job and its turn."""
    return {"job_id": str(job.id), "conversation_id": str(job.conversation_id),
            "user_id": str(job.user_id), "turn": turn}
