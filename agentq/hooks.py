"""Hooks (seed 001's callbacks): Python entry points in group `agentq.hooks`, loaded once
per orchestrator process.

An entry point names an object (an instance, a class made with no arguments, or a module)
with any of:

    before_turn(ctx)        -> None/True: go on; False, a reason string, or {"stop": reason}:
                               end the job (finish_reason `hook`)
    after_turn(ctx)         after a model reply is stored
    on_error(ctx)           a model call failed
    before_compaction(ctx)  -> False skips this compaction
    after_compaction(ctx)   a compaction ended: strategy, messages_before, messages_after,
                            tokens_before, tokens_after
    after_loop(ctx)         the job ended: status, finish_reason, turns, usage
                            {input_tokens, output_tokens, cost_estimate} (the whole loop's)

`ctx` is a dict (job_id, conversation_id, user_id, turn, and what the moment adds). A hook
that raises is logged and ignored: it never fails a job.

Compaction strategies come the same way, from group `agentq.compaction`: the entry point
named by AGENTQ_COMPACTION_STRATEGY (`default`: the built-in prune-then-summarise, no entry
point) names an object (or a class made with no arguments) with

    compact(ctx) -> list of messages   ctx: job_id, turn, messages (the context as it would
                                       be sent: [{role, content, ...}]), tokens (its
                                       estimate), budget (the tokens the model's window
                                       leaves for it), threshold

called when the context passes the compaction threshold, instead of the built-in one; what
it returns is sent. One that raises, or returns no list of messages, leaves the built-in
compaction to run.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

log = logging.getLogger(__name__)

GROUP = "agentq.hooks"
NAMES = ("before_turn", "after_turn", "on_error", "before_compaction", "after_compaction",
         "after_loop")
STRATEGY_GROUP = "agentq.compaction"
DEFAULT_STRATEGY = "default"


def load_strategy(name: str) -> Any | None:
    """The compaction strategy named `name` in group `agentq.compaction` (None: the
    built-in one); a ConfigError when no installed package provides it."""
    from agentq.errors import ConfigError
    if not name or name == DEFAULT_STRATEGY:
        return None
    found = [e for e in metadata.entry_points(group=STRATEGY_GROUP) if e.name == name]
    if not found:
        raise ConfigError("AGENTQ_COMPACTION_STRATEGY",
                          f"no installed package provides {name!r} in group "
                          f"{STRATEGY_GROUP} (or use {DEFAULT_STRATEGY})")
    target = found[0].load()
    if inspect.isclass(target):
        target = target()
    if not callable(getattr(target, "compact", None)):
        raise ConfigError("AGENTQ_COMPACTION_STRATEGY",
                          f"{name!r} has no compact(ctx) method")
    log.info("compaction strategy loaded", extra={"strategy": name})
    return target


def compact_with(strategy: Any, name: str, ctx: dict[str, Any]) -> list[dict[str, Any]] | None:
    """`strategy.compact(ctx)`: the messages it gave; None when it raised or gave no list of
    messages (the built-in compaction then runs). A strategy's bug never fails a job."""
    try:
        out = strategy.compact(ctx)
    except Exception:  # noqa: BLE001 - a strategy's bug never fails a job
        log.exception("compaction strategy failed",
                      extra={"job_id": ctx.get("job_id"), "strategy": name})
        return None
    if not isinstance(out, list) or not out or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in out):
        log.error("compaction strategy gave no list of messages",
                  extra={"job_id": ctx.get("job_id"), "strategy": name})
        return None
    return out


@dataclass
class Hooks:
    loaded: list[tuple[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, enabled: bool = True) -> "Hooks":
        hooks = cls()
        if not enabled:
            return hooks
        for entry in metadata.entry_points(group=GROUP):
            try:
                target = entry.load()
                if inspect.isclass(target):
                    target = target()
            except Exception:
                log.exception("hook failed to load", extra={"hook": entry.name})
                continue
            hooks.loaded.append((entry.name, target))
            log.info("hook loaded", extra={"hook": entry.name,
                                           "callbacks": [n for n in NAMES
                                                         if callable(getattr(target, n, None))]})
        return hooks

    def _call(self, name: str, ctx: dict[str, Any]) -> list[tuple[str, Any]]:
        out = []
        for hook_name, target in self.loaded:
            fn = getattr(target, name, None)
            if not callable(fn):
                continue
            try:
                out.append((hook_name, fn(dict(ctx))))
            except Exception:
                log.exception("hook failed", extra={"hook": hook_name, "callback": name,
                                                    "job_id": ctx.get("job_id")})
        return out

    def before_turn(self, ctx: dict[str, Any]) -> tuple[str, str] | None:
        """(hook name, reason) of the first hook that stops the job, else None."""
        for hook_name, result in self._call("before_turn", ctx):
            if result is False:
                return hook_name, f"Stopped by hook {hook_name}."
            if isinstance(result, str) and result:
                return hook_name, result
            if isinstance(result, dict) and result.get("stop"):
                return hook_name, str(result["stop"])
        return None

    def before_compaction(self, ctx: dict[str, Any]) -> bool:
        return all(result is not False for _, result in self._call("before_compaction", ctx))

    def after_turn(self, ctx: dict[str, Any]) -> None:
        self._call("after_turn", ctx)

    def on_error(self, ctx: dict[str, Any]) -> None:
        self._call("on_error", ctx)

    def after_compaction(self, ctx: dict[str, Any]) -> None:
        self._call("after_compaction", ctx)

    def after_loop(self, ctx: dict[str, Any]) -> None:
        self._call("after_loop", ctx)
