"""The in-process floor: the same turns and the same Postgres writes as agentq's stack, made
by plain function calls in one process — no HTTP API, no broker, no worker hand-offs.

`submit` (what POST /v1/messages does), then `Stepper.run` for each step and
`execute_tool_call` for each tool call, in order (the in-process runner, `agentq.runner`),
with the real router (the openai SDK) against the same model server. What the stack takes
beyond this is its machinery.
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
        """One job from submit to its end; returns its id, status and times. Its effects
        run in this process, in order (`agentq.runner`), as a worker would run them."""
        from agentq.loop.identity import Incoming
        from agentq.loop.submit import Submission, submit
        from agentq.loop.uow import UnitOfWork
        from agentq.runner import InProcessRunner
        runner = InProcessRunner(self.stepper, self.settings)
        t0 = time.time()
        with runner.installed():
            with UnitOfWork(self.sessions) as uow:  # what POST /v1/messages does
                job_id = str(submit(uow, self.settings, Submission(
                    incoming=Incoming("api", user, channel), content=content)).job.id)
            runner.run_until_idle()
        return {"id": job_id, "status": runner.ended.get(job_id), "submitted": t0,
                "finished": time.time()}

    def close(self) -> None:
        self.router.close()


def new_ids() -> tuple[str, str]:
    return f"floor-u-{uuid.uuid4().hex[:10]}", f"floor-c-{uuid.uuid4().hex[:10]}"
