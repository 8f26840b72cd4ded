"""Memory recall for a turn: the user's memories most like the job's question join its
context (seed 000: the top RECALL_K), in the room the context kept for them.

The question's embedding is a network call, so recall runs outside the step's
transactions, after the first one built the context with `memory_reserve` kept free; a
failed embedding recalls nothing (the turn goes on without memories). The embedding is
kept per (job, question), so a step that runs again (after waiting for its provider) does
not ask for it twice.
"""
from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any, Callable

from agentq import memory
from agentq.errors import ProviderError
from agentq.loop import context
from agentq.loop.turn import Turn, Wired
from agentq.loop.uow import UnitOfWork

log = logging.getLogger(__name__)
MAX_KEPT_VECTORS = 1024
"""Question embeddings kept per process; past that the cache starts again."""


class Recall:
    """The recall of one Stepper's turns (its wiring read from it at each call)."""

    def __init__(self, step: Wired):
        self.step = step
        self._question_vectors: dict[tuple[str, str], list[float]] = {}

    def __call__(self, job_id: str, turn: Turn,
                 assemble: Callable[[Turn], list[dict[str, Any]]]) -> None:
        """The memories recalled for `turn`'s question join its layers; its messages are
        assembled again (`assemble`) when any did."""
        if turn.recall_user is None:
            return
        vector = self._vector(job_id, turn.built.question)
        if vector is None:
            return
        settings = self.step.settings
        with UnitOfWork(self.step.sessions) as uow:
            found = memory.recall(uow.session, turn.recall_user, vector,
                                  settings.embedding_model,
                                  ef_search=settings.memory_ef_search,
                                  api_key_id=memory.recall_scope(uow.session,
                                                                 turn.recall_key))
            if found:
                uow.event(uuid.UUID(job_id), "memory_recalled", count=len(found),
                          similarities=[round(score, 4) for _, score in found])
        kept = context.fit_memories([m.content for m, _ in found], turn.built.memory_reserve)
        if kept:
            turn.layers = dataclasses.replace(turn.built, memories=tuple(kept))
            turn.messages = assemble(turn)

    def _vector(self, job_id: str, question: context.StoredMessage | None
                ) -> list[float] | None:
        """The question's embedding (kept per job); None when the embedding failed."""
        text = question.content[:8000] if question is not None else ""
        key = (job_id, text)
        vector = self._question_vectors.get(key)
        if vector is None:
            try:
                vector = self.step.router.embed(text)
            except ProviderError as exc:
                log.warning("memory recall skipped: embedding failed",
                            extra={"job_id": job_id, "error": exc.message})
                return None
            if len(self._question_vectors) > MAX_KEPT_VECTORS:
                self._question_vectors.clear()
            self._question_vectors[key] = vector
        return vector

