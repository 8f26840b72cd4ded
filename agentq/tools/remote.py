"""Tool modules from outside: HTTP modules (seed 003: `GET /manifest`, `POST /execute`) and
MCP servers (agentq.tools.mcp), registered by the admin API / `agentq modules add` (rows of
`tool_modules`) or statically by AGENTQ_TOOL_MODULES.

A module's manifest is fetched through the webhooks' SSRF guard, checked by the same
`define_module` as an in-process manifest, and cached in Redis for an hour
(AGENTQ_MODULE_MANIFEST_TTL_S): every process reads the cache, and only one of them (a Redis
lock) fetches when it is missing or stale. A module whose manifest cannot be fetched, or that
does not answer a call, is unhealthy: its tools are not offered until a probe (every
AGENTQ_MODULE_RETRY_S) fetches its manifest again. The failure is cached like a manifest:
one process probes at that interval (the lock), every other reads the result.

A call is `POST <url>/execute` with `{tool, arguments, context, tool_use_id, time_limit_s}`,
signed per Standard Webhooks with the module's secret (`webhook-id` is the tool_use_id, the
call's idempotency key); the answer is `{ok, result | error}`. Whatever goes wrong (an error,
a timeout, a 5xx, an answer that is not that shape) is a ToolError: data for the model.

Secrets are never logged nor returned; errors name the module, never the secret.
"""
from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, cast

from agentq.config import Settings
from agentq.config.urls import shown_url
from agentq.errors import ManifestError, ValidationFailed
from agentq.tools.manifest import NAME_RE, ToolContext, ToolModule, define_module
from agentq.tools.module_http import call_http, fetch_http_manifest
from agentq.tools.specs import (
    KINDS,
    ModuleSpec,
    ModuleUnavailable,
    check_defaults,
)
from agentq.webhooks import urls

log = logging.getLogger(__name__)

KEY_PREFIX = "agentq:modules:"
LOCK_S = 30


# --- registration checks ------------------------------------------------------------------

def check_spec(spec: ModuleSpec, settings: Settings,
               taken: AbstractSet[str] = frozenset()) -> None:
    """Raise ValidationFailed naming the field to fix."""
    if not NAME_RE.fullmatch(spec.name or ""):
        raise ValidationFailed({"name": ["Must match [a-z][a-z0-9_]{0,30}."]},
                               "The module name is not valid.")
    if spec.name in taken:
        raise ValidationFailed({"name": ["An in-process module has this name."]},
                               f"The module name {spec.name!r} is taken.")
    if spec.kind not in KINDS:
        raise ValidationFailed({"kind": [f"Must be one of {list(KINDS)}."]},
                               "The module kind is not valid.")
    if spec.kind == "http" and not spec.url:
        raise ValidationFailed({"url": ["An HTTP module needs a url."]}, "url is missing.")
    if spec.kind == "mcp" and bool(spec.url) == bool(spec.command):
        raise ValidationFailed({"url": ["An MCP module needs a url or a command, not both."]},
                               "An MCP module needs either url or command.")
    if spec.url:
        urls.check_callback_url(spec.url, settings.module_allow_private, field_name="url")
    if spec.secret is not None:
        from agentq.webhooks.signing import check_module_secret
        check_module_secret(spec.secret)
    check_defaults(spec.name, spec.permission, spec.requires_approval, spec.timeout_s)


def check_approval_names(spec: ModuleSpec, module: ToolModule) -> None:
    """Every tool that requires_approval names is one of the module's."""
    if not isinstance(spec.requires_approval, tuple):
        return
    names = {t.name for t in module.tools} | {t.name.partition(".")[2] for t in module.tools}
    unknown = [t for t in spec.requires_approval if t not in names]
    if unknown:
        raise ValidationFailed(
            {"requires_approval": [f"No such tool in the module: {', '.join(unknown)}; it "
                                   f"has {', '.join(sorted(t.name for t in module.tools))}."]},
            "requires_approval names a tool the module does not have.")


# --- the shared cache ---------------------------------------------------------------------

_versions_read: contextvars.ContextVar[dict[int, int] | None] = contextvars.ContextVar(
    "module_versions_read", default=None)


@contextmanager
def one_version_read() -> Iterator[None]:
    """Within this block (one Celery task's run: tasks.base), the module version is read
    from Redis once, at the first look, not at every look: a step looks at the registry
    about ten times (tools offered, each call's queue and time limit, approvals) and a tool
    call about five, each a Redis round trip that was ~4% of the orchestrator's and the
    tools worker's CPU. A change made by another process is seen by the next task (or
    AGENTQ_MODULE_SYNC_S after the last re-read, as before); one made by this task
    (`Store.bump`) at its next look."""
    token = _versions_read.set({})
    try:
        yield
    finally:
        _versions_read.reset(token)


class Store:
    """Manifests (with a TTL), health and fetch locks: in Redis when there is one, else in
    this process (the embedded broker: one process)."""

    def __init__(self, redis_url: str | None):
        self._local: dict[str, tuple[float | None, str]] = {}
        self._lock = threading.Lock()
        self._redis = None
        if redis_url:
            import redis
            self._redis = redis.Redis.from_url(redis_url, socket_timeout=5)

    def get(self, key: str) -> Any:
        if self._redis is not None:
            # redis-py types a sync client's answers as sync-or-async (its ResponseT)
            raw: bytes | str | None = cast("bytes | None", self._redis.get(KEY_PREFIX + key))
        else:
            with self._lock:
                expires, raw = self._local.get(key, (None, None))
                if expires is not None and expires < time.time():
                    self._local.pop(key, None)
                    raw = None
        return json.loads(raw) if raw else None

    def set(self, key: str, value: Any, ttl_s: float | None = None) -> None:
        raw = json.dumps(value)
        if self._redis is not None:
            self._redis.set(KEY_PREFIX + key, raw, ex=int(ttl_s) if ttl_s else None)
        else:
            with self._lock:
                self._local[key] = (time.time() + ttl_s if ttl_s else None, raw)

    def delete(self, *keys: str) -> None:
        if self._redis is not None:
            self._redis.delete(*(KEY_PREFIX + k for k in keys))
        else:
            with self._lock:
                for k in keys:
                    self._local.pop(k, None)

    def try_lock(self, key: str, ttl_s: float = LOCK_S) -> bool:
        if self._redis is not None:
            return bool(self._redis.set(KEY_PREFIX + key, "1", nx=True, ex=int(ttl_s)))
        with self._lock:
            expires, _ = self._local.get(key, (None, None))
            if expires is not None and expires > time.time():
                return False
            self._local[key] = (time.time() + ttl_s, "1")
            return True

    def incr(self, key: str) -> int:
        if self._redis is not None:
            return int(cast(int, self._redis.incr(KEY_PREFIX + key)))
        with self._lock:
            value = int(self._local.get(key, (None, "0"))[1]) + 1
            self._local[key] = (None, str(value))
            return value

    def version(self) -> int:
        """Bumped whenever a module is added, removed, refreshed or changes health: every
        process sees the change at its next look (inside `one_version_read`, its next
        task), not AGENTQ_MODULE_SYNC_S later."""
        read = _versions_read.get()
        if read is not None and id(self) in read:
            return read[id(self)]
        if self._redis is not None:
            version = int(cast("bytes | None", self._redis.get(KEY_PREFIX + "version")) or 0)
        else:
            with self._lock:
                version = int(self._local.get("version", (None, "0"))[1])
        if read is not None:
            read[id(self)] = version
        return version

    def bump(self) -> None:
        self.incr("version")
        read = _versions_read.get()
        if read is not None:  # this task's own change: seen at its next look
            read.pop(id(self), None)


def redis_url_of(settings: Settings) -> str | None:
    for url in (settings.broker_url, settings.result_backend_url):
        if url.startswith(("redis://", "rediss://")):
            return url
    return None


def build_module(spec: ModuleSpec, manifest: Any,
                 function_for: Callable[[ModuleSpec, str, str], Callable]) -> ToolModule:
    """The manifest, checked by the rules of in-process manifests (define_module), with a
    function per tool that calls the module (by the server's own name for MCP)."""
    if not isinstance(manifest, dict):
        raise ManifestError(spec.name, "the manifest must be a JSON object")
    remote_names: dict[str, str] = {}
    if spec.kind == "mcp":
        from agentq.tools.mcp import MCP_NAMES_KEY
        manifest = dict(manifest)
        remote_names = manifest.pop(MCP_NAMES_KEY, None) or {}
    if manifest.get("module") != spec.name:
        raise ManifestError(spec.name, f"the manifest names module {manifest.get('module')!r}; "
                                       f"it must be {spec.name!r}, the registered name")
    if "local" in manifest:  # its calls cross the network: never run in the step
        raise ManifestError(spec.name, "'local' is not a manifest key of a remote module: "
                                       "only an in-process module may run in the step")
    tools = manifest.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            if isinstance(tool, dict) and "function" in tool:
                raise ManifestError(spec.name, f"tools[{i}]: 'function' is not a manifest "
                                               "key of a remote module")
        manifest = {**manifest, "tools": [
            {**with_defaults(spec, t),
             "function": function_for(spec, str(t.get("name")),
                                      remote_names.get(str(t.get("name")),
                                                       str(t.get("name"))))}
            if isinstance(t, dict) else t for t in tools]}
    module = define_module(manifest)
    if spec.slow and not module.slow:
        module = ToolModule(name=module.name, description=module.description,
                            tools=module.tools, slow=True, time_limit_s=module.time_limit_s)
    return module


def with_defaults(spec: ModuleSpec, tool: dict[str, Any]) -> dict[str, Any]:
    """A manifest's tool with the registration's defaults: for an MCP server (which has no
    permission, approval nor limit of its own) they are the tool's; for an HTTP module they
    fill in what its manifest does not say."""
    out = dict(tool)
    mcp = spec.kind == "mcp"
    if spec.permission is not None and (mcp or "permission" not in out):
        out["permission"] = spec.permission
    if spec.gated(str(out.get("name"))) and (mcp or "requires_approval" not in out):
        out["requires_approval"] = True
    if spec.timeout_s is not None and (mcp or "time_limit_s" not in out):
        out["time_limit_s"] = spec.timeout_s
    return out


# --- the modules this process knows --------------------------------------------------------

@dataclass
class Known:
    spec: ModuleSpec
    module: ToolModule | None
    health: dict[str, Any]


class RemoteModules:
    """The registered modules and their cached manifests, as this process sees them; read
    again at most every AGENTQ_MODULE_SYNC_S."""

    def __init__(self, settings: Settings, store: Store | None = None,
                 load_rows: Callable[[], list[ModuleSpec]] | None = None):
        self.settings = settings
        self.store = store or Store(redis_url_of(settings))
        self._load_rows = load_rows or self._rows_from_db
        self._loaded = threading.Condition()
        self._loading = False
        self._known: dict[str, Known] = {}
        self._synced_at = 0.0
        self._version = -1

    # which modules exist
    def _rows_from_db(self) -> list[ModuleSpec]:
        from sqlalchemy import select

        from agentq.db import session_factory
        from agentq.models import ToolModuleRow
        with session_factory(self.settings)() as session:
            rows = session.execute(select(ToolModuleRow)).scalars().all()
            return [spec_of(row) for row in rows]

    def _specs(self) -> tuple[list[ModuleSpec], bool]:
        """(the modules configured and registered, whether the table was read). Unread (no
        database yet, as for the CLI before migrate; the database away; no free pooled
        connection): the configured ones only."""
        by_name = {s.name: s for s in self.settings.tool_modules}
        read = True
        try:
            for spec in self._load_rows():
                by_name.setdefault(spec.name, spec)
        except Exception as exc:  # noqa: BLE001 - logged by _unread; the last view stands
            read = False
            self._unread(exc)
        return sorted(by_name.values(), key=lambda s: s.name), read

    UNREAD_LOG_S = 30.0
    """A database that stays away is told once in this many seconds per process, not at
    every look (a wrong URL made every request and step log it: ~12 lines a second)."""
    _unread_logged_at = float("-inf")
    """When this process last said so (time.monotonic())."""

    def _unread(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._unread_logged_at < self.UNREAD_LOG_S:
            return
        self._unread_logged_at = now
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines()
                 or [type(exc).__name__])[0]
        where = shown_url(self.settings.database_url)  # its password masked
        log.warning(f"tool modules not read: the database at {where} did not answer "
                    f"({first[:300]}); said again in {self.UNREAD_LOG_S:g} s if it still "
                    f"does not", extra={"error": type(exc).__name__, "database": where})

    def known(self, force: bool = False) -> dict[str, Known]:
        """The modules as this process sees them. One thread re-reads them when due (a
        fetch may take AGENTQ_MODULE_FETCH_TIMEOUT_S); the others keep the last view
        meanwhile, but for the very first one, which they wait for. Redis away: the last
        view."""
        try:  # not under the lock: Redis may take its time to answer, or not answer
            version = self.store.version()
        except Exception as exc:  # noqa: BLE001 - Redis away: the broker is too; keep what we know
            log.warning("tool modules not re-read", extra={"error": type(exc).__name__})
            with self._loaded:
                return dict(self._known)
        with self._loaded:
            due = force or version != self._version or \
                time.monotonic() - self._synced_at >= self.settings.module_sync_s
            if not due:
                return dict(self._known)
            if self._loading:
                if self._version == -1:  # never read yet: wait for the first reading
                    self._loaded.wait_for(lambda: not self._loading, timeout=60)
                return dict(self._known)
            self._loading = True
        known, read = self._known, True
        try:
            specs, read = self._specs()
            if read or not known:  # unread: the last view, if there is one, stands
                known = {s.name: self._load(s) for s in specs}
        except Exception as exc:  # noqa: BLE001 - Redis away mid-way: keep the last view, try again later
            log.warning("tool modules not re-read", extra={"error": type(exc).__name__})
        finally:
            with self._loaded:
                self._known = known
                if read:  # else read again at the next look, not AGENTQ_MODULE_SYNC_S later
                    self._synced_at = time.monotonic()
                    self._version = version
                self._loading = False
                self._loaded.notify_all()
        return dict(known)

    def healthy_modules(self) -> list[ToolModule]:
        return [k.module for k in self.known().values()
                if k.module is not None and k.health.get("status") == "ok"]

    # the cache
    def _cached(self, spec: ModuleSpec) -> tuple[dict | None, dict]:
        return (self.store.get(f"{spec.name}:manifest"),
                self.store.get(f"{spec.name}:health") or {})

    def probe_due(self, cached: dict | None, health: dict) -> bool:
        """Whether the module's manifest is to be fetched now: an unhealthy module once
        AGENTQ_MODULE_RETRY_S has passed since its last probe (its failure is cached: it is
        not probed at every look, nor when its manifest is gone); any other module when no
        manifest is cached (never fetched, or its hour ran out)."""
        if health.get("status") == "unhealthy":
            return time.time() - float(health.get("checked_at") or 0) >= \
                self.settings.module_retry_s
        return cached is None

    def _load(self, spec: ModuleSpec) -> Known:
        cached, health = self._cached(spec)
        # one process probes (a Redis lock); it reads the cache again under the lock, so
        # one that read it just before another's probe ended does not probe once more
        if self.probe_due(cached, health) and self.store.try_lock(f"{spec.name}:lock"):
            try:
                cached, health = self._cached(spec)
                if self.probe_due(cached, health):
                    cached, health = self.refresh(spec)
            finally:
                self.store.delete(f"{spec.name}:lock")
        module = None
        if cached is not None:
            try:
                module = build_module(spec, cached["manifest"], self._function_for)
            except ManifestError as exc:
                health = {"status": "unhealthy", "error": exc.message,
                          "checked_at": time.time()}
        return Known(spec, module, health or {"status": "unknown"})

    def fetch(self, spec: ModuleSpec) -> dict[str, Any]:
        """The module's manifest, checked; raise ManifestError saying what to fix."""
        if spec.kind == "mcp":
            from agentq.tools import mcp
            manifest = mcp.manifest_of(spec, self.settings)
        else:
            manifest = fetch_http_manifest(spec, self.settings)
        build_module(spec, manifest, self._function_for)
        return manifest

    def refresh(self, spec: ModuleSpec) -> tuple[dict | None, dict]:
        """Fetch now and cache; a failure marks the module unhealthy (and keeps no old
        manifest: its tools are hidden)."""
        try:
            manifest = self.fetch(spec)
        except ManifestError as exc:
            before = self.store.get(f"{spec.name}:health") or {}
            health = {"status": "unhealthy", "error": exc.message, "checked_at": time.time()}
            self.store.set(f"{spec.name}:health", health)
            self.store.delete(f"{spec.name}:manifest")
            if (before.get("status"), before.get("error")) != ("unhealthy", exc.message):
                # a change the other processes must see now; the same failure again is
                # not (a bump would make each of them read everything again)
                self.store.bump()
                log.warning("tool module unhealthy", extra={"tool_module": spec.name,
                                                            "error": exc.message})
            else:
                log.info("tool module still unhealthy", extra={"tool_module": spec.name,
                                                               "error": exc.message})
            return None, health
        cached, health = self.cache(spec, manifest)
        log.info("tool module manifest fetched", extra={"tool_module": spec.name,
                                                        "tools": len(manifest["tools"])})
        return cached, health

    def cache(self, spec: ModuleSpec, manifest: dict) -> tuple[dict, dict]:
        """Keep a fetched, checked manifest for the hour; the module is healthy."""
        now = time.time()
        cached = {"manifest": manifest, "fetched_at": now}
        self.store.set(f"{spec.name}:manifest", cached, self.settings.module_manifest_ttl_s)
        self.store.incr(f"{spec.name}:fetches")
        health = {"status": "ok", "error": None, "checked_at": now}
        self.store.set(f"{spec.name}:health", health)
        self.store.bump()
        return cached, health

    def forget(self, name: str) -> None:
        self.store.delete(f"{name}:manifest", f"{name}:health", f"{name}:lock")
        self.store.bump()

    def mark_unhealthy(self, name: str, error: str) -> None:
        log.warning("tool module unreachable", extra={"tool_module": name, "error": error})
        self.store.set(f"{name}:health", {"status": "unhealthy", "error": error,
                                          "checked_at": time.time()})
        self.store.bump()

    def _function_for(self, spec: ModuleSpec, name: str, remote_name: str) -> Callable:
        settings = self.settings

        def call(arguments: dict, ctx: ToolContext) -> Any:
            limit_s = ctx.extra.get("time_limit_s") or settings.tool_time_limit_s
            if spec.kind == "mcp":
                from agentq.tools import mcp
                try:
                    return mcp.call(spec, remote_name, arguments, limit_s, settings)
                except ModuleUnavailable as exc:
                    self.mark_unhealthy(spec.name, exc.message)
                    raise
            return call_http(spec, name, arguments, ctx, limit_s, settings,
                             lambda error: self.mark_unhealthy(spec.name, error))
        return call


def spec_of(row) -> ModuleSpec:
    defaults = getattr(row, "defaults", None) or {}
    approval = defaults.get("requires_approval") or False
    return ModuleSpec(name=row.name, kind=row.kind, url=row.url,
                      command=tuple(row.command) if row.command else None, slow=row.slow,
                      secret=row.secret, permission=defaults.get("permission"),
                      requires_approval=tuple(approval) if isinstance(approval, list)
                      else bool(approval),
                      timeout_s=defaults.get("timeout_s"),
                      tenant_id=str(row.tenant_id) if row.tenant_id else None)


def tools_of(module: ToolModule | None) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "parameters": t.parameters,
             "permission": t.permission} for t in (module.tools if module else ())]


def module_object(known: Known) -> dict[str, Any]:
    """A module as GET /v1/modules shows it: never its secret."""
    return {**known.spec.public(),
            "health": {"status": known.health.get("status", "unknown"),
                       "error": known.health.get("error"),
                       "checked_at": known.health.get("checked_at")},
            "tools": tools_of(known.module)}
