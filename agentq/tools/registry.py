"""The tool registry: discovers the modules in `tool_workers/`, says which tools a caller is
offered, where each runs, and executes one call with validation, a timeout and one retry.

Where a call runs: on its module's queue (`tools.<module>`, `tools.slow.<module>`) by
chord, the default; or, for a local module (`is_local`: an in-process module that
declares itself `"local": true`, named in AGENTQ_LOCAL_MODULES), inside the orchestrator's
step (`agentq.loop.tool_turn`), bounded by AGENTQ_LOCAL_TOOL_TIME_LIMIT_S. A local call
that must be sent rather than run in the step (a person approved it, the sweeper re-drives
its turn) goes to the orchestrator's queue (`LOCAL_QUEUE`), never to a module queue: no
tools worker consumes a local module's queue.

A tool's failure is data for the model (`ToolResult(ok=False, ...)`); only a bug in our own
code escalates.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import pkgutil
import sys
import threading
import time
from collections.abc import KeysView
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Iterable

from agentq.config import Settings
from agentq.errors import (
    ConfigError,
    ManifestError,
    ToolArgumentsInvalid,
    ToolError,
    ToolNotFound,
    ToolNotPermitted,
    ToolTimeout,
)
from agentq.llm.types import ToolSpec
from agentq.tools.manifest import ToolContext, ToolDef, ToolModule, permission_rank
from agentq.tools.result import ToolResult
from agentq.tools.specs import ModuleUnavailable

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # seed 000: one automatic retry
RETRY_PAUSE_S = 0.2
MAX_STORED_RESULT_CHARS = 1_000_000
LOCAL_QUEUE = "orchestrator"
"""Where a local module's call goes when it is sent rather than run in a step: the
orchestrator's queue (tasks.names.ORCHESTRATOR_QUEUE; agentq does not import tasks), whose
workers run every task, the tool task included."""


def discover(package: str = "tool_workers") -> list[ToolModule]:
    """Import every module package under `package`; each must define MODULE."""
    pkg = importlib.import_module(package)
    modules: list[ToolModule] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"{package}.{info.name}")
        module = getattr(mod, "MODULE", None)
        if not isinstance(module, ToolModule):
            raise ManifestError(info.name, f"{package}.{info.name} must define "
                                           "MODULE = define_module({...})")
        if module.name != info.name:
            raise ManifestError(info.name, f"declares module {module.name!r}; the package "
                                           f"must be named the same")
        modules.append(module)
    return modules


class ToolRegistry:
    def __init__(self, settings: Settings, modules: Iterable[ToolModule] | None = None,
                 remote=None):
        self.settings = settings
        if modules is None:
            modules = [m for package in settings.tool_packages for m in discover(package)]
        self._local: dict[str, ToolModule] = {}
        for module in modules:
            if module.name in self._local:
                raise ManifestError(module.name, "two tool packages define this module")
            self._local[module.name] = module
        self.remote = remote
        """agentq.tools.remote.RemoteModules: HTTP modules and MCP servers, or None."""
        self._remote_key: tuple = ()
        self._in_step = local_modules(settings, self._local)
        self._build(list(self._local.values()))

    def _build(self, modules: list[ToolModule]) -> None:
        by_name = {m.name: m for m in modules}
        tools = {t.name: t for m in by_name.values() for t in m.tools}
        validators = {name: tool.validator() for name, tool in tools.items()}
        self._state = (by_name, tools, validators)  # swapped whole: readers see one state

    def _current(self):
        if self.remote is not None:
            remote = [m for m in self.remote.healthy_modules() if m.name not in self._local]
            key = tuple(id(m) for m in remote)
            if key != self._remote_key:
                self._build([*self._local.values(), *remote])
                self._remote_key = key
        return self._state

    def look(self) -> None:
        """Bring this process's view of the registered modules up to date now. A caller
        that is about to open a transaction looks first: a first (or due) reading of the
        `tool_modules` table takes a pooled connection of its own, and a thread that held
        its transaction's connection meanwhile could wait on a pool its peers have
        emptied, each of them waiting in turn for that first reading (the in-flight
        benchmark's 270 of 300 first steps timed out so: tests/unit/test_one_connection.py)."""
        self._current()

    @property
    def modules(self) -> dict[str, ToolModule]:
        return self._current()[0]

    @property
    def tools(self) -> dict[str, ToolDef]:
        return self._current()[1]

    def known_tool_names(self) -> KeysView[str]:
        """The tools of this process's last view, without looking again (cheap: metrics
        labels use it on every tool result)."""
        return self._state[1].keys()

    @property
    def local_module_names(self) -> set[str]:
        return set(self._local)

    # --- where and how long -----------------------------------------------------------
    def is_slow(self, module: str) -> bool:
        m = self.modules.get(module)
        return module in self.settings.slow_modules or bool(m and m.slow)

    def is_local(self, module: str) -> bool:
        """Whether `module`'s calls run inside the orchestrator's step (a local module)
        rather than by chord on its queue. Only an in-process module that declares itself
        local and is named in AGENTQ_LOCAL_MODULES is: never an HTTP module nor an MCP
        server (a registered module of the same name is not this process's), nor a slow
        one."""
        return module in self._in_step

    def queue_for(self, name: str) -> str:
        module = name.partition(".")[0]
        if self.is_local(module):
            return LOCAL_QUEUE
        return f"tools.slow.{module}" if self.is_slow(module) else f"tools.{module}"

    def time_limit_for(self, name: str) -> float:
        tool = self.tools[name]
        module = self.modules[tool.module]
        default = (self.settings.slow_tool_time_limit_s if self.is_slow(tool.module)
                   else self.settings.tool_time_limit_s)
        limit = tool.time_limit_s or module.time_limit_s or default
        if self.is_local(tool.module):  # it holds the step: bounded by the deployment too
            return min(limit, self.settings.local_tool_time_limit_s)
        return limit

    def queues(self, slow: bool) -> list[str]:
        """The queues of the modules offered now (a tools worker follows new ones:
        tasks.app's module watcher); a local module has none (its calls run in the
        orchestrator)."""
        return sorted(self.queue_for(t.name) for m in self.modules.values()
                      if self.is_slow(m.name) == slow and not self.is_local(m.name)
                      for t in m.tools[:1])

    def all_queues(self, slow: bool) -> list[str]:
        """queues(), and those of the registered modules not offered now (unhealthy): their
        calls already sent still run, or fail, rather than wait."""
        queues = set(self.queues(slow))
        if self.remote is not None:
            for name, known in self.remote.known().items():
                is_slow = (known.spec.slow or name in self.settings.slow_modules
                           or bool(known.module and known.module.slow))
                if is_slow == slow and name not in self._local:
                    queues.add(f"tools.slow.{name}" if slow else f"tools.{name}")
        return sorted(queues)

    # --- who may use what -------------------------------------------------------------
    def foreign_modules(self, tenant_id) -> set[str]:
        """The registered modules of tenants other than `tenant_id` (API.md 1.2: a module
        registered by a tenant admin is its tenant's alone): never offered to, run for, nor
        sent the context of a job of `tenant_id`. Global and in-process modules are
        nobody's."""
        if self.remote is None:
            return set()
        return {name for name, known in self.remote.known().items()
                if name not in self._local and not known.spec.visible_to(tenant_id)}

    def modules_for(self, tenant_id) -> dict[str, ToolModule]:
        """The modules offered now that a persona of `tenant_id` may enable."""
        foreign = self.foreign_modules(tenant_id)
        return {name: m for name, m in self.modules.items() if name not in foreign}

    def allowed_modules(self, persona_modules: list[str] | None,
                        tenant_id=None) -> tuple[str, ...]:
        """The modules a persona (None: the configured defaults) enables for a job of
        `tenant_id`: another tenant's are dropped, whatever the persona names."""
        names = (self.settings.default_guest_modules if persona_modules is None
                 else tuple(persona_modules))
        if tenant_id is None:
            return names
        foreign = self.foreign_modules(tenant_id)
        return tuple(name for name in names if name not in foreign)

    def offered(self, level: str, allowed_modules: Iterable[str]) -> list[ToolDef]:
        """Tools the caller's level allows ∩ the persona's modules, in a stable order."""
        allowed = set(allowed_modules)
        rank = permission_rank(level)
        return [t for name, t in sorted(self.tools.items())
                if t.module in allowed and permission_rank(t.permission) <= rank]

    def specs(self, tools: Iterable[ToolDef]) -> list[ToolSpec]:
        return [ToolSpec(t.name, t.description, t.parameters) for t in tools]

    def check(self, name: str, level: str, allowed_modules: Iterable[str]) -> ToolDef:
        tool = self.tools.get(name)
        if tool is None:
            module = name.partition(".")[0]
            if self.remote is not None and module in self.remote.known():
                error = ModuleUnavailable(f"Module {module} is unavailable: its tools are "
                                          "not offered now.")
                error.retryable = False
                raise error
            raise ToolNotFound(name)
        if tool.module not in set(allowed_modules):
            raise ToolNotPermitted(name, f"module {tool.module} enabled", level)
        if permission_rank(tool.permission) > permission_rank(level):
            raise ToolNotPermitted(name, tool.permission, level)
        return tool

    def validate(self, tool: ToolDef, arguments: Any) -> None:
        if not isinstance(arguments, dict):
            raise ToolArgumentsInvalid(tool.name, ["arguments must be a JSON object"])
        validator = self._state[2].get(tool.name) or tool.validator()
        errors = sorted(validator.iter_errors(arguments),
                        key=lambda e: list(e.absolute_path))
        if errors:
            raise ToolArgumentsInvalid(tool.name, [
                f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                for e in errors[:5]])

    # --- running one call -------------------------------------------------------------
    def execute(self, name: str, arguments: Any, ctx: ToolContext,
                allowed_modules: Iterable[str]) -> ToolResult:
        """Check, validate and run one call; retry once on a retryable failure."""
        try:
            # another tenant's module is not there for this job, whatever was allowed
            if name.partition(".")[0] in self.foreign_modules(ctx.tenant_id):
                raise ToolNotFound(name)
            tool = self.check(name, ctx.permission_level, allowed_modules)
            self.validate(tool, arguments)
        except ToolError as exc:
            return ToolResult.failure(exc)
        limit_s = self.time_limit_for(name)
        ctx.extra["time_limit_s"] = limit_s
        # a local call holds its step: it is bounded by one limit, a timeout not tried again
        local = self.is_local(tool.module)
        last: BaseException | None = None
        for attempt in range(1, MAX_ATTEMPTS + 1):
            started = time.monotonic()
            try:
                value = _run_with_timeout(tool, arguments, ctx, limit_s)
                _check_json(value)
                log.info("tool ok", extra={"tool": name, "attempt": attempt,
                                           "tool_use_id": ctx.tool_use_id,
                                           "ms": round((time.monotonic() - started) * 1000)})
                return ToolResult.success(value, attempt)
            except Exception as exc:  # noqa: BLE001 - a tool's failure is data, whatever it raised
                last = exc
                retryable = getattr(exc, "retryable", True) and not (
                    local and isinstance(exc, ToolTimeout))
                log.warning("tool failed", extra={"tool": name, "attempt": attempt,
                                                  "tool_use_id": ctx.tool_use_id,
                                                  "error": f"{type(exc).__name__}: {exc}",
                                                  "retryable": retryable})
                if not retryable:
                    return ToolResult.failure(exc, attempt)
                if attempt < MAX_ATTEMPTS:
                    time.sleep(RETRY_PAUSE_S)
        assert last is not None
        return ToolResult.failure(last, MAX_ATTEMPTS)


def local_modules(settings: Settings, modules: dict[str, ToolModule]) -> frozenset[str]:
    """AGENTQ_LOCAL_MODULES, each checked against the in-process modules: ConfigError for
    a name that is none of them, or one that does not declare itself local (its tools may
    have side effects or run long: they stay on their queue)."""
    for name in settings.local_modules:
        module = modules.get(name)
        if module is None:
            raise ConfigError("AGENTQ_LOCAL_MODULES",
                              f"{name!r} is not an in-process tool module (in-process: "
                              f"{', '.join(sorted(modules)) or 'none'}); a remote module "
                              "is never local")
        if not module.local or module.slow or name in settings.slow_modules:
            declared = sorted(m.name for m in modules.values() if m.local and not m.slow)
            raise ConfigError("AGENTQ_LOCAL_MODULES",
                              f"module {name!r} does not declare itself local (pure, "
                              "in-process, bounded time); modules that do: "
                              f"{', '.join(declared) or 'none'}")
    return frozenset(settings.local_modules)


def _run_with_timeout(tool: ToolDef, arguments: dict, ctx: ToolContext, limit_s: float):
    """Run in a helper thread so a stuck tool times out; the thread is left to finish.
    Under gevent (an orchestrator on AGENTQ_ORCHESTRATOR_POOL=gevent runs local calls) the
    helper is one of the hub's OS threads: a patched `threading` thread is a greenlet, and
    a tool computing in it would hold every other greenlet of the process, the timeout's
    included."""
    os_threads = _gevent_threadpool()
    if os_threads is not None:
        import gevent
        try:
            return os_threads.spawn(tool.function, arguments, ctx).get(timeout=limit_s)
        except gevent.Timeout:
            raise ToolTimeout(tool.name, limit_s) from None
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tool-{tool.module}")
    try:
        future = pool.submit(tool.function, arguments, ctx)
        try:
            return future.result(timeout=limit_s)
        except FutureTimeout:
            raise ToolTimeout(tool.name, limit_s) from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _gevent_threadpool():
    """The gevent hub's pool of OS threads when this process runs on gevent's patched
    `threading`, else None (gevent is then neither needed nor imported)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return None
    import gevent
    return gevent.get_hub().threadpool


def _check_json(value: Any) -> None:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ToolError(f"tool returned a value that is not JSON: {exc}") from None
    if len(text) > MAX_STORED_RESULT_CHARS:
        raise ToolError(f"tool result is {len(text)} chars; the limit is "
                        f"{MAX_STORED_RESULT_CHARS}")


_registry: ToolRegistry | None = None
_registry_lock = threading.Lock()


def _forget_in_child() -> None:
    """A forked child (a prefork pool process) builds a registry of its own: in the parent
    another thread may have been re-reading the modules at the fork, holding locks that no
    thread of the child would ever release (its first tool call would hang for good)."""
    global _registry, _registry_lock
    _registry, _registry_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def current_registry() -> ToolRegistry | None:
    """This process's registry if one was built, never building nor replacing one (the
    metrics labels ask: a registry made for other settings would replace the worker's)."""
    return _registry


def get_registry(settings: Settings) -> ToolRegistry:
    global _registry
    with _registry_lock:
        if _registry is None or _registry.settings is not settings:
            from agentq.tools.remote import RemoteModules
            _registry = ToolRegistry(settings, remote=RemoteModules(settings))
        return _registry
