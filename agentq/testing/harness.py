"""A whole job in one process: the real Stepper and tool execution on a database of the
test's, the model a script (`ScriptedModel`), the effects handled by `agentq.runner`'s
in-process runner instead of Celery. No broker, no worker, no HTTP.

    h = Harness.create(tmp_path, text("4"))          # a fresh SQLite database in tmp_path
    job_id = h.submit("What is 2+2?")
    h.drive(job_id)
    assert h.job(job_id).response["content"] == "4"
    h.assert_done()                                   # every scripted reply was asked for

See docs/testing.md for the whole kit (this harness, the scripted OpenAI-compatible server in
`agentq.testing.scripted_llm`, your own tools and personas).
"""
from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, cast

from sqlalchemy import select, update

from agentq import migrate
from agentq.config import Settings
from agentq.db import session_factory, session_scope, utcnow
from agentq.llm.types import LLMReply, ToolCallRequest, ToolSpec
from agentq.loop import uow
from agentq.loop.effects import Effect
from agentq.loop.identity import Incoming
from agentq.loop.step import Stepper
from agentq.loop.submit import Submission, create_job
from agentq.loop.sweeper import sweep
from agentq.models import Job, User
from agentq.runner import InProcessRunner
from agentq.tools.manifest import ToolModule
from agentq.tools.registry import ToolRegistry, discover

if TYPE_CHECKING:  # the router's module imports the provider SDKs
    from agentq.llm.router import LLMRouter

MODEL = "gpt-4o-mini"
"""The model a scripted reply says it came from (agentq's default model)."""
ScriptedReply = LLMReply | BaseException | Callable[[], LLMReply]
"""A reply in a `ScriptedModel`'s script: returned, raised, or called for the reply."""


def text(content: str, input_tokens: int = 10, output_tokens: int = 5) -> LLMReply:
    """A reply in text: the turn ends with it."""
    return LLMReply(content, (), "end_turn", MODEL, input_tokens, output_tokens)


def calls(*requests: tuple[str, dict[str, Any] | None], content: str = "") -> LLMReply:
    """A reply that calls tools: `calls(("math.evaluate", {"expression": "2+2"}))`."""
    return LLMReply(content, tuple(ToolCallRequest(f"call_{i}", name, args)
                                   for i, (name, args) in enumerate(requests)),
                    "tool_use", MODEL, 10, 5)


class UnexpectedModelCall(AssertionError):
    """The model was asked more often than the script says."""


class ScriptedModel:
    """The model, as the Stepper calls it (`chat`): answers from a list of replies in order,
    raises the exceptions in it (a `ProviderError`, say), calls the callables in it (something
    that happens while the model thinks; their value is the reply). A call after the last
    reply raises `UnexpectedModelCall`; `forever` answers every call the same way.
    `requests` records what each call was given: messages, tool names, model, max_tokens."""

    def __init__(self, *replies: ScriptedReply,
                 forever: LLMReply | None = None):
        self.replies = list(replies)
        self.forever = forever
        self.requests: list[dict[str, Any]] = []

    def chat(self, messages: list[dict[str, Any]], tools: list[ToolSpec],
             model: str | None = None, max_tokens: int | None = None,
             on_delta: Callable[[str, int], None] | None = None) -> LLMReply:
        """As `LLMRouter.chat` answers (`on_delta` is not called: a scripted reply comes
        whole)."""
        self.requests.append({"messages": messages, "tools": [t.name for t in tools],
                              "model": model, "max_tokens": max_tokens})
        if self.forever is not None:
            return self.forever
        if not self.replies:
            raise UnexpectedModelCall(f"unexpected model call #{len(self.requests)}: the "
                                      f"script has no reply left")
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            return reply()
        return reply

    def done(self) -> bool:
        return not self.replies

    def assert_done(self) -> None:
        """Every scripted reply was asked for."""
        if self.replies:
            raise AssertionError(f"the scripted model has {len(self.replies)} unused "
                                 f"replies: {self.replies!r}")


class Harness:
    """One deployment in this process: `settings`, `sessions`, the tool `registry`, the
    `stepper`, and the `runner` installed as the process's dispatcher (every unit of work's
    effects go to it). Build it with `create` (a database made and migrated for it) or from
    settings whose database is migrated already."""

    def __init__(self, settings: Settings, modules: Iterable[ToolModule] | None,
                 router: ScriptedModel | Any):
        self.settings = settings
        self.router = router
        self.registry = ToolRegistry(settings, modules)
        self.sessions = session_factory(settings)
        # the Stepper is typed with the router it has in production; a test's model answers
        # the same calls (chat; embed where memory search is on), not being one
        self.stepper = Stepper(settings, cast("LLMRouter", router), self.registry,
                               self.sessions)
        self.runner = InProcessRunner(self.stepper, settings)
        self.previous_dispatcher = uow.set_dispatcher(self.runner)

    @classmethod
    def create(cls, home: str | Path, *replies: ScriptedReply, forever: LLMReply | None = None,
               env: Mapping[str, str] | None = None,
               modules: Iterable[ToolModule] | None = None,
               tool_packages: Iterable[str] = ()) -> "Harness":
        """A harness on a database in `home` (SQLite there, unless `env` names
        AGENTQ_DATABASE_URL), migrated first; the model answers `replies`. Tools: `modules`,
        or the modules of agentq's own `tool_workers` and of each of `tool_packages` (a
        package of tool modules, as AGENTQ_TOOL_PACKAGES names them)."""
        settings = Settings.from_env({"AGENTQ_HOME": str(home), **(env or {})})
        migrate.upgrade(settings)
        if modules is None:
            modules = [m for package in ("tool_workers", *tool_packages)
                       for m in discover(package)]
        return cls(settings, modules, ScriptedModel(*replies, forever=forever))

    def close(self) -> None:
        """Give the process its dispatcher back."""
        uow.set_dispatcher(self.previous_dispatcher)

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def assert_done(self) -> None:
        self.router.assert_done()

    def add_persona(self, name: str = "persona", **fields: Any) -> str:
        """A persona of the default tenant, made as `POST /v1/personas` makes it (`fields`:
        that body's, e.g. `system_prompt=`, `allowed_modules=[...]`, `limits={...}`); returns
        its id, for `submit(..., persona_id=...)`."""
        from agentq.admin import create_persona
        from agentq.tenants import find_tenant
        with session_scope(self.settings) as session:
            persona = create_persona(session, find_tenant(session, None).id,
                                     {"name": name, **fields})
            return str(persona.id)

    def submit(self, content: str = "What is 2+2?", user: str = "u-1",
               thread: str | None = None, **fields: Any) -> str:
        """A new job (`fields`: the rest of a `Submission`, `persona_id=` say); its first
        step is queued on the runner, not run (a test may run it by hand)."""
        if isinstance(fields.get("persona_id"), str):
            fields["persona_id"] = uuid.UUID(fields["persona_id"])
        with uow.UnitOfWork(self.sessions) as unit:
            job = create_job(unit, self.settings,
                             Submission(Incoming("test", user, "chan-1", thread), content,
                                        **fields))
            return str(job.id)

    def drive(self, job_id: str, limit: int = 20) -> list[Effect]:
        """Run the job to its end, each effect handled as the workers would; returns the
        effects its steps sent. Fails when the job has not ended after `limit` steps' worth
        of effects."""
        before = len(self.runner.sent)
        self.stepper.run(job_id, 0, "start")
        self.runner.run_until_idle(limit=4 * limit)
        if job_id not in self.runner.ended:
            raise AssertionError(f"the job {job_id} did not end")
        return self.runner.sent[before:]

    def sent_by(self, work: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Effect]:
        """Call `work`; the effects its units of work sent (not run: the test runs them)."""
        before = len(self.runner.sent)
        work(*args, **kwargs)
        return self.runner.sent[before:]

    def sweep(self) -> list[Effect]:
        """One pass of the sweeper; the effects it sent."""
        return self.sent_by(sweep, self.settings, self.sessions)

    def backdate(self, job_id: str, seconds: float = 60) -> None:
        """The job made its last progress `seconds` ago: the sweeper's deadlines run out
        without a test waiting for them."""
        with self.sessions() as session, session.begin():
            session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
                last_progress_at=utcnow() - timedelta(seconds=seconds)))

    def job(self, job_id: str) -> Job:
        with self.sessions() as session:
            return session.get_one(Job, uuid.UUID(job_id))

    def rows(self, model, job_id: str, order_by=None) -> list:
        """The job's rows of `model` (Message, ToolCall, TokenLog, JobEvent, …)."""
        with self.sessions() as session:
            query = select(model).where(model.job_id == uuid.UUID(job_id))
            if order_by is not None:
                query = query.order_by(order_by)
            return list(session.execute(query).scalars().all())

    def user_of(self, job_id: str) -> User:
        with self.sessions() as session:
            return session.get_one(User, self.job(job_id).user_id)
