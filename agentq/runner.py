"""The in-process effect runner: a dispatcher (`agentq.loop.uow`) that handles every effect in
this process, without a broker.

The unit tests drive jobs with it (a scripted model, a SQLite or Postgres database) and the
floor benchmark measures the same writes with it (`benchmarks/floor.py`). Production, the
API, the CLI and embedded mode send Celery messages instead (`tasks.dispatch`; embedded mode
on kombu's in-memory transport, so that it behaves as production does).

    runner = InProcessRunner(stepper, settings)
    with runner.installed():
        with UnitOfWork(sessions) as uow:
            job = create_job(uow, settings, submission)   # NextStep queued, not run
        runner.run_until_idle()                           # the job runs to its end
    runner.ended[str(job.id)]                             # "completed"

Effects are queued when a unit of work commits and run by `run_until_idle`, one at a time
in order, so a test sees each step's effects (`sent`) before the next step runs. A step
delayed for its provider (`NextStep.not_before`) waits in `delayed` until `run_delayed()`.
Without a stepper the runner only records (`sent`): the default in the unit tests, where a
test that never drives a job still commits effects somewhere.
"""
from __future__ import annotations

import contextlib
import uuid
from collections import deque
from typing import Iterator, Sequence, assert_never

from agentq.loop import uow as units
from agentq.loop.effects import (
    AdmitBatch,
    BatchEnded,
    DispatchTools,
    Effect,
    JobEnded,
    NextStep,
    RevokeTools,
    SendWebhooks,
)


class InProcessRunner:
    def __init__(self, stepper=None, settings=None, *, deliver_webhooks: bool = False):
        self.stepper = stepper
        self.settings = settings
        self.deliver_webhooks = deliver_webhooks
        self.queue: deque[Effect] = deque()
        self.delayed: list[NextStep] = []
        self.sent: list[Effect] = []
        """Every effect dispatched to this runner, in order."""
        self.ended: dict[str, str] = {}
        """Job id → end status, from `JobEnded`."""
        self.batches_ended: dict[str, str] = {}
        self.webhooks: list[str] = []
        """Delivery ids handed over by `SendWebhooks` (attempted if `deliver_webhooks`)."""
        self.revoked: set[str] = set()

    # -- the dispatcher ------------------------------------------------------------------
    def __call__(self, effects: Sequence[Effect]) -> None:
        self.sent.extend(effects)
        self.queue.extend(effects)

    @contextlib.contextmanager
    def installed(self) -> Iterator["InProcessRunner"]:
        """This runner as the process's dispatcher, the previous one restored after."""
        previous = units.set_dispatcher(self)
        try:
            yield self
        finally:
            units.set_dispatcher(previous)

    # -- running -------------------------------------------------------------------------
    def run_until_idle(self, limit: int = 10_000) -> int:
        """Handle queued effects (and those they cause) until none is left; returns how
        many were handled. `limit` stops a job that would loop for ever."""
        handled = 0
        while self.queue:
            if handled >= limit:
                raise RuntimeError(f"still busy after {limit} effects: {list(self.queue)[:5]}")
            self.handle(self.queue.popleft())
            handled += 1
        return handled

    def run_delayed(self) -> int:
        """Run the steps that were delayed for their provider, now."""
        delayed, self.delayed = self.delayed, []
        for step in delayed:
            self._step(step.job_id, step.iteration, step.cause)
        return len(delayed) + self.run_until_idle()

    def handle(self, effect: Effect) -> None:
        """One effect, as a worker's task would handle it: the registered tool modules'
        version read once for it (`one_version_read`, as every task does)."""
        from agentq.tools.remote import one_version_read
        with one_version_read():
            self._handle(effect)

    def _handle(self, effect: Effect) -> None:
        match effect:
            case NextStep(not_before=not_before) if not_before is not None:
                self.delayed.append(effect)
            case NextStep(job_id=job_id, iteration=iteration, cause=cause):
                self._step(job_id, iteration, cause)
            case DispatchTools(job_id=job_id, iteration=iteration, calls=calls):
                self._tools(job_id, iteration, calls)
            case JobEnded(job_id=job_id, status=status):
                self.ended[job_id] = status
            case SendWebhooks(delivery_ids=ids):
                self.webhooks.extend(ids)
                if self.deliver_webhooks:
                    from agentq.webhooks.delivery import attempt_delivery
                    for delivery_id in ids:
                        attempt_delivery(delivery_id)
            case AdmitBatch(batch_id=batch_id):
                from agentq.batches import advance
                advance(self._stepper().sessions, uuid.UUID(batch_id))
            case BatchEnded(batch_id=batch_id, status=status):
                self.batches_ended[batch_id] = status
            case RevokeTools(tool_use_ids=ids):
                self.revoked |= set(ids)
            case _:
                assert_never(effect)

    def _stepper(self):
        if self.stepper is None:
            raise RuntimeError("this runner only records effects (it was made without a "
                               "stepper)")
        return self.stepper

    def _step(self, job_id: str, iteration: int, cause: str) -> None:
        stepper = self._stepper()
        try:
            stepper.run(job_id, iteration, cause)
        except Exception as exc:  # noqa: BLE001 - what the orchestrator task does with a bug in a step
            stepper.fail(job_id, exc)

    def _tools(self, job_id: str, iteration: int,
               calls: tuple[tuple[str, str, float], ...]) -> None:
        """The chord, in order: each call not revoked runs, then the callback step (with
        tool_join=database the call storing the turn's last result sends it instead)."""
        from agentq.loop.execute import execute_tool_call
        stepper = self._stepper()
        settings = self.settings or stepper.settings
        for tool_use_id, _queue, _limit_s in calls:
            if tool_use_id not in self.revoked:
                execute_tool_call(tool_use_id, settings, stepper.registry, stepper.sessions)
        if settings.tool_join != "database":
            self._step(job_id, iteration, "callback")
