"""The in-process floor: the same turns and the same Postgres writes as agentq's stack, made
by plain function calls in one process — no HTTP API, no broker, no worker hand-offs.

`create_job` (what POST /v1/messages does), then `Stepper.run` for each step and
`execute_tool_call` for each tool call, in order, with the real router (the openai SDK)
against the same model server. What the stack takes beyond this is its machinery.
"""
from __future__ import annotations

import os
import time
import uuid

from agentq.config import Settings


class Floor:
    def __init__(self, settings: Settings, model_base_url: str):
        # The router reads the SDK's own variables from this process's environment.
        os.environ["OPENAI_BASE_URL"] = model_base_url
        os.environ["OPENAI_API_KEY"] = "sk-bench"
        from agentq.db import session_factory
        from agentq.llm.router import LLMRouter
        from agentq.loop.step import Stepper
        from agentq.tools.registry import get_registry
        self.settings = settings
        self.sessions = session_factory(settings)
        self.registry = get_registry(settings)
        self.router = LLMRouter(settings)
        self.stepper = Stepper(settings, self.router, self.registry, self.sessions)

    def run_job(self, content: str, user: str, channel: str) -> dict:
        """One job from submit to its end; returns its id, status and times."""
        from agentq.db import session_scope
        from agentq.loop.execute import execute_tool_call
        from agentq.loop.identity import Incoming
        from agentq.loop import submit as submit_mod
        DispatchTools, JobEnded, NextStep = _effect_types()
        t0 = time.time()
        sub = submit_mod.Submission(incoming=Incoming("api", user, channel), content=content)
        with session_scope(self.settings) as session:
            if hasattr(submit_mod, "submit"):  # what POST /v1/messages does
                submitted = submit_mod.submit(session, self.settings, sub)
                submitted.events.flush(session)
                job_id, effects = str(submitted.job.id), list(submitted.effects)
                announce = submitted.events.announce
            else:
                job_id = str(submit_mod.create_job(session, self.settings, sub).id)
                effects, announce = [NextStep(job_id, 0, "start")], None
        if announce is not None:
            announce()
        status = None
        while effects:
            following = []
            for effect in effects:
                if isinstance(effect, NextStep):
                    following += self.stepper.run(effect.job_id, effect.iteration, effect.cause)
                elif isinstance(effect, DispatchTools):
                    for tool_use_id, _queue, _limit in effect.calls:
                        execute_tool_call(tool_use_id, self.settings, self.registry,
                                          self.sessions)
                    following += self.stepper.run(effect.job_id, effect.iteration, "callback")
                elif isinstance(effect, JobEnded):
                    status = effect.status
            effects = following
        return {"id": job_id, "status": status, "submitted": t0, "finished": time.time()}

    def close(self) -> None:
        self.router.close()


def _effect_types():
    try:
        from agentq.loop.effects import DispatchTools, JobEnded, NextStep
    except ImportError:  # before the effects had their own module
        from agentq.loop.effects import DispatchTools, JobEnded, NextStep
    return DispatchTools, JobEnded, NextStep


def new_ids() -> tuple[str, str]:
    return f"floor-u-{uuid.uuid4().hex[:10]}", f"floor-c-{uuid.uuid4().hex[:10]}"
