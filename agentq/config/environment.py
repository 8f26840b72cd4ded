"""The environment read into Settings' fields: each AGENTQ_* variable parsed, bounded and
refused with a ConfigError naming it (`Settings.from_env` calls `read`)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from agentq.config import pool
from agentq.config.front import FrontLimits
from agentq.config.quotas import QUOTA_NAMES, Quotas
from agentq.config.urls import check_database_url, normalize_database_url, shown_url
from agentq.errors import ConfigError
from agentq.llm.catalogue import parse_models
from agentq.tools.specs import ModuleSpec, parse_static

if TYPE_CHECKING:
    from agentq.config import Settings

MAX_ITERATIONS_CEILING = 200  # seed 002's guard: no configuration may go past it


def home(env: Mapping[str, str]) -> Path:
    """AGENTQ_HOME, or ./.agentq."""
    return Path(env.get("AGENTQ_HOME") or Path.cwd() / ".agentq")


def read(environ: Mapping[str, str] | None, defaults: type[Settings]) -> dict[str, Any]:
    """Settings' fields from `environ` (the process's environment when None); a variable
    unset or empty takes its field's default, read from `defaults`."""
    env = dict(os.environ if environ is None else environ)
    home_dir = home(env)
    database_url = normalize_database_url(check_database_url(
        env.get("AGENTQ_DATABASE_URL") or f"sqlite:///{home_dir / 'agentq.db'}"))
    broker_url = env.get("AGENTQ_BROKER_URL") or "memory://"
    backend = env.get("AGENTQ_RESULT_BACKEND_URL") or _backend_for(broker_url, home_dir,
                                                                   database_url)

    def num(name: str, default, kind=int, lo=None, hi=None):
        raw = env.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(name, f"expected a {kind.__name__}, got {raw!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = (f"from {lo} to {hi}" if lo is not None and hi is not None
                      else f"at least {lo}" if lo is not None else f"at most {hi}")
            raise ConfigError(name, f"must be {bounds}, got {raw}")
        return value

    def names(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        raw = env.get(name)
        if raw is None:
            return default
        return tuple(p.strip() for p in raw.split(",") if p.strip())

    orchestrator_pool = _choice(env, "AGENTQ_ORCHESTRATOR_POOL", pool.POOLS)
    tool_join = env.get("AGENTQ_TOOL_JOIN") or (
        "chord" if backend.startswith(("redis://", "rediss://")) else "database")
    if tool_join not in ("chord", "database"):
        raise ConfigError("AGENTQ_TOOL_JOIN", f"expected chord or database, got {tool_join!r}")
    return dict(
        database_url=database_url,
        tool_join=tool_join,
        broker_url=broker_url,
        result_backend_url=backend,
        home=home_dir,
        model=env.get("AGENTQ_MODEL") or defaults.model,
        fallback_models=names("AGENTQ_FALLBACK_MODELS", ()),
        models=parse_models(env.get("AGENTQ_MODELS"), env),
        llm_timeout_s=num("AGENTQ_LLM_TIMEOUT_S", defaults.llm_timeout_s, float, 0.1),
        llm_retries=num("AGENTQ_LLM_RETRIES", defaults.llm_retries, int, 0, 10),
        llm_retry_base_s=num("AGENTQ_LLM_RETRY_BASE_S", defaults.llm_retry_base_s, float, 0),
        llm_retry_max_s=num("AGENTQ_LLM_RETRY_MAX_S", defaults.llm_retry_max_s, float, 0),
        provider_wait_s=num("AGENTQ_PROVIDER_WAIT_S", defaults.provider_wait_s, float, 0),
        provider_retry_base_s=num("AGENTQ_PROVIDER_RETRY_BASE_S",
                                  defaults.provider_retry_base_s, float, 0.01),
        provider_retry_max_s=num("AGENTQ_PROVIDER_RETRY_MAX_S", defaults.provider_retry_max_s,
                                 float, 0.01),
        provider_max_concurrency=num("AGENTQ_PROVIDER_MAX_CONCURRENCY",
                                     defaults.provider_max_concurrency, int, 0),
        provider_rate_per_s=num("AGENTQ_PROVIDER_RATE_PER_S", defaults.provider_rate_per_s,
                                int, 0),
        provider_breaker_failures=num("AGENTQ_PROVIDER_BREAKER_FAILURES",
                                      defaults.provider_breaker_failures, int, 0),
        provider_breaker_window_s=num("AGENTQ_PROVIDER_BREAKER_WINDOW_S",
                                      defaults.provider_breaker_window_s, float, 0.1),
        provider_breaker_open_s=num("AGENTQ_PROVIDER_BREAKER_OPEN_S",
                                    defaults.provider_breaker_open_s, float, 0.1),
        max_tokens_per_request=num("AGENTQ_MAX_TOKENS_PER_REQUEST", None, int, 1),
        tokenizer=env.get("AGENTQ_TOKENIZER") or None,
        temperature=num("AGENTQ_TEMPERATURE", None, float, 0, 2),
        tool_results_as=_choice(env, "AGENTQ_TOOL_RESULTS_AS", ("tool", "user")),
        answer_after_tools=_flag(env, "AGENTQ_ANSWER_AFTER_TOOLS"),
        embedding_model=env.get("AGENTQ_EMBEDDING_MODEL") or defaults.embedding_model,
        max_iterations=num("AGENTQ_MAX_ITERATIONS", defaults.max_iterations, int, 1,
                           MAX_ITERATIONS_CEILING),
        guest_monthly_tokens=num("AGENTQ_GUEST_MONTHLY_TOKENS", defaults.guest_monthly_tokens,
                                 int, 0),
        budget_period_days=num("AGENTQ_BUDGET_PERIOD_DAYS", defaults.budget_period_days, int, 1),
        tool_result_max_chars=num("AGENTQ_TOOL_RESULT_MAX_CHARS",
                                  defaults.tool_result_max_chars, int, 100),
        context_max_tokens=num("AGENTQ_CONTEXT_MAX_TOKENS", defaults.context_max_tokens, int, 100),
        history_max_messages=num("AGENTQ_HISTORY_MAX_MESSAGES", defaults.history_max_messages,
                                 int, 1),
        context_window=num("AGENTQ_CONTEXT_WINDOW", None, int, 256),
        model_context_windows=_windows(env.get("AGENTQ_MODEL_CONTEXT_WINDOWS")),
        compaction_threshold=num("AGENTQ_COMPACTION_THRESHOLD", defaults.compaction_threshold,
                                 float, 0.1, 1.0),
        compaction_keep_turns=num("AGENTQ_COMPACTION_KEEP_TURNS",
                                  defaults.compaction_keep_turns, int, 1, 100),
        max_seconds=num("AGENTQ_MAX_SECONDS", None, float, 0.1),
        max_job_tokens=num("AGENTQ_MAX_JOB_TOKENS", None, int, 1),
        hooks_enabled=(env.get("AGENTQ_HOOKS") or "1").lower() not in ("0", "false", "no"),
        compaction_strategy=(env.get("AGENTQ_COMPACTION_STRATEGY") or "default").strip(),
        default_guest_modules=names("AGENTQ_DEFAULT_MODULES", defaults.default_guest_modules),
        default_system_prompt=env.get("AGENTQ_SYSTEM_PROMPT") or defaults.default_system_prompt,
        tool_packages=names("AGENTQ_TOOL_PACKAGES", defaults.tool_packages),
        webhook_secrets=tuple((env.get("AGENTQ_WEBHOOK_SECRET") or "").split()),
        webhook_allow_private=(env.get("AGENTQ_WEBHOOK_ALLOW_PRIVATE") or "0").lower()
        in ("1", "true", "yes"),
        webhook_timeout_s=num("AGENTQ_WEBHOOK_TIMEOUT_S", defaults.webhook_timeout_s, float,
                              0.1),
        webhook_retry_schedule_s=_delays(env.get("AGENTQ_WEBHOOK_RETRY_SCHEDULE_S"),
                                         defaults.webhook_retry_schedule_s),
        webhook_overdue_s=num("AGENTQ_WEBHOOK_OVERDUE_S", defaults.webhook_overdue_s, float, 1),
        attachment_max_bytes=num("AGENTQ_ATTACHMENT_MAX_BYTES", defaults.attachment_max_bytes,
                                 int, 1),
        attachment_timeout_s=num("AGENTQ_ATTACHMENT_TIMEOUT_S", defaults.attachment_timeout_s,
                                 float, 0.1),
        attachment_allow_private=(env.get("AGENTQ_ATTACHMENT_ALLOW_PRIVATE") or "0").lower()
        in ("1", "true", "yes"),
        batch_max_concurrency=num("AGENTQ_BATCH_MAX_CONCURRENCY",
                                  defaults.batch_max_concurrency, int, 1, 10000),
        quotas=Quotas(**{
            name: num(f"AGENTQ_QUOTA_{name.upper()}", getattr(Quotas, name), int, 0)
            for name in QUOTA_NAMES}),
        front=FrontLimits(
            max_body_bytes=num("AGENTQ_MAX_BODY_BYTES", FrontLimits.max_body_bytes, int,
                               1024),
            max_json_depth=num("AGENTQ_MAX_JSON_DEPTH", FrontLimits.max_json_depth, int, 2,
                               200),
            max_header_bytes=num("AGENTQ_MAX_HEADER_BYTES", FrontLimits.max_header_bytes,
                                 int, 256, 60000),
            header_timeout_s=num("AGENTQ_HEADER_TIMEOUT_S", FrontLimits.header_timeout_s,
                                 int, 1, 3600),
            body_timeout_s=num("AGENTQ_BODY_TIMEOUT_S", FrontLimits.body_timeout_s, float,
                               0.1),
            web_connections=num("AGENTQ_WEB_CONNECTIONS", FrontLimits.web_connections, int,
                                16, 1_000_000)),
        slow_modules=names("AGENTQ_SLOW_MODULES", defaults.slow_modules),
        local_modules=_local_modules(env, names("AGENTQ_LOCAL_MODULES",
                                                defaults.local_modules),
                                     names("AGENTQ_SLOW_MODULES", defaults.slow_modules)),
        local_tool_time_limit_s=num("AGENTQ_LOCAL_TOOL_TIME_LIMIT_S",
                                    defaults.local_tool_time_limit_s, float, 0.1, 300),
        tool_modules=_static_modules(env),
        module_allow_private=(env.get("AGENTQ_MODULE_ALLOW_PRIVATE") or "0").lower()
        in ("1", "true", "yes"),
        module_allow_commands=(env.get("AGENTQ_MODULE_ALLOW_COMMANDS") or "0").lower()
        in ("1", "true", "yes"),
        module_manifest_ttl_s=num("AGENTQ_MODULE_MANIFEST_TTL_S",
                                  defaults.module_manifest_ttl_s, float, 1),
        module_sync_s=num("AGENTQ_MODULE_SYNC_S", defaults.module_sync_s, float, 0),
        module_retry_s=num("AGENTQ_MODULE_RETRY_S", defaults.module_retry_s, float, 0),
        module_fetch_timeout_s=num("AGENTQ_MODULE_FETCH_TIMEOUT_S",
                                   defaults.module_fetch_timeout_s, float, 0.1),
        tool_time_limit_s=num("AGENTQ_TOOL_TIME_LIMIT_S", defaults.tool_time_limit_s, float, 0.1),
        slow_tool_time_limit_s=num("AGENTQ_SLOW_TOOL_TIME_LIMIT_S",
                                   defaults.slow_tool_time_limit_s, float, 0.1),
        step_deadline_s=num("AGENTQ_STEP_DEADLINE_S", defaults.step_deadline_s, float, 1),
        sweep_interval_s=num("AGENTQ_SWEEP_INTERVAL_S", defaults.sweep_interval_s, float, 0.5),
        approval_timeout_s=num("AGENTQ_APPROVAL_TIMEOUT_S", defaults.approval_timeout_s,
                               float, 0.1),
        max_agent_depth=num("AGENTQ_MAX_AGENT_DEPTH", defaults.max_agent_depth, int, 0, 100),
        memory_idle_s=num("AGENTQ_MEMORY_IDLE_S", defaults.memory_idle_s, float, 0.1),
        memory_digest_interval_s=num("AGENTQ_MEMORY_DIGEST_INTERVAL_S",
                                     defaults.memory_digest_interval_s, float, 0.1),
        memory_ef_search=num("AGENTQ_MEMORY_EF_SEARCH", defaults.memory_ef_search, int, 1, 1000),
        memory_digest_batch=num("AGENTQ_MEMORY_DIGEST_BATCH", defaults.memory_digest_batch,
                                int, 1, 1000),
        schedule_interval_s=num("AGENTQ_SCHEDULE_INTERVAL_S", defaults.schedule_interval_s,
                                float, 0.1),
        max_redrives=num("AGENTQ_MAX_REDRIVES", defaults.max_redrives, int, 0, 100),
        redrive_backoff_max_s=num("AGENTQ_REDRIVE_BACKOFF_MAX_S",
                                  defaults.redrive_backoff_max_s, float, 1),
        result_expires_s=num("AGENTQ_RESULT_EXPIRES_S", defaults.result_expires_s, int, 86400),
        database_ride_out_s=num("AGENTQ_DATABASE_RIDE_OUT_S", defaults.database_ride_out_s,
                                float, 0, 60),
        orchestrator_concurrency=num("AGENTQ_ORCHESTRATOR_CONCURRENCY",
                                     defaults.orchestrator_concurrency, int, 1,
                                     pool.MAX_CONCURRENCY[orchestrator_pool]),
        orchestrator_pool=orchestrator_pool,
        tools_concurrency=num("AGENTQ_TOOLS_CONCURRENCY", defaults.tools_concurrency, int, 1),
        slow_tools_concurrency=num("AGENTQ_SLOW_TOOLS_CONCURRENCY",
                                   defaults.slow_tools_concurrency, int, 1),
        db_pool_size=num("AGENTQ_DB_POOL_SIZE", defaults.db_pool_size, int, 1),
        db_pool_timeout_s=num("AGENTQ_DB_POOL_TIMEOUT_S", defaults.db_pool_timeout_s, float,
                              0.1),
        db_prepare_threshold=num("AGENTQ_DB_PREPARE_THRESHOLD", defaults.db_prepare_threshold,
                                 int, 0),
        public_url=(env.get("AGENTQ_PUBLIC_URL")
                    or f"http://localhost:{env.get('PORT') or 5000}").rstrip("/"),
        port=num("PORT", defaults.port, int, 1, 65535),
        log_level=(env.get("AGENTQ_LOG_LEVEL") or defaults.log_level).upper(),
        metrics_token=env.get("AGENTQ_METRICS_TOKEN") or None,
    )


def typed_database_url(env: Mapping[str, str] | None = None) -> str:
    """AGENTQ_DATABASE_URL as the user typed it (password masked), or the embedded SQLite
    file's URL when it is unset: what messages name, rather than the driver's spelling."""
    env = os.environ if env is None else env
    return shown_url(env.get("AGENTQ_DATABASE_URL")
                     or f"sqlite:///{home(dict(env)) / 'agentq.db'}")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """`env[name]`, one of `choices` (the first when unset)."""
    value = (env.get(name) or choices[0]).strip().lower()
    if value not in choices:
        raise ConfigError(name, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = (env.get(name) or "0").strip().lower()
    if value not in ("0", "1", "true", "false", "yes", "no"):
        raise ConfigError(name, f"expected 1 or 0, got {value!r}")
    return value in ("1", "true", "yes")


def _local_modules(env: Mapping[str, str], local: tuple[str, ...],
                   slow: tuple[str, ...]) -> tuple[str, ...]:
    """AGENTQ_LOCAL_MODULES, refused here when a name cannot be local whatever the modules
    are: a slow module, or a remote one of AGENTQ_TOOL_MODULES (its calls cross the
    network). Whether each is an in-process module that declares itself local is checked
    when the registry discovers them (`agentq.tools.registry`)."""
    remote = {spec.name for spec in _static_modules(env)}
    for name in local:
        if name in slow:
            raise ConfigError("AGENTQ_LOCAL_MODULES",
                              f"{name!r} is slow (AGENTQ_SLOW_MODULES): a local module's "
                              "calls run in the orchestrator's step, in bounded time")
        if name in remote:
            raise ConfigError("AGENTQ_LOCAL_MODULES",
                              f"{name!r} is a remote module (AGENTQ_TOOL_MODULES): only an "
                              "in-process module may run in the step")
    return local


def _static_modules(env: Mapping[str, str]) -> tuple[ModuleSpec, ...]:
    return parse_static(env.get("AGENTQ_TOOL_MODULES"), dict(env))


def _windows(raw: str | None) -> dict[str, int]:
    """`model=tokens,...` → {model: tokens}."""
    out: dict[str, int] = {}
    for part in (raw or "").split(","):
        if not part.strip():
            continue
        model, sep, tokens = part.rpartition("=")
        try:
            value = int(tokens)
        except ValueError:
            value = 0
        if not sep or not model.strip() or value < 256:
            raise ConfigError("AGENTQ_MODEL_CONTEXT_WINDOWS",
                              f"expected model=tokens (tokens >= 256), got {part.strip()!r}")
        out[model.strip()] = value
    return out


def _delays(raw: str | None, default: tuple[float, ...]) -> tuple[float, ...]:
    if raw is None or not raw.strip():
        return default
    try:
        delays = tuple(float(p) for p in raw.split(",") if p.strip())
    except ValueError:
        raise ConfigError("AGENTQ_WEBHOOK_RETRY_SCHEDULE_S",
                          f"expected comma-separated seconds, got {raw!r}") from None
    if any(d < 0 for d in delays):
        raise ConfigError("AGENTQ_WEBHOOK_RETRY_SCHEDULE_S", "delays must not be negative")
    return delays


def _backend_for(broker_url: str, home: Path, database_url: str = "") -> str:
    if broker_url.startswith(("redis://", "rediss://")):
        return broker_url
    if broker_url.startswith("memory://"):
        # Not cache+memory://: Celery keeps one backend per thread, and an in-memory cache
        # per thread loses chord counts between the worker's threads.
        return f"db+sqlite:///{home / 'results.db'}"  # kept for task states; not for joins
    if broker_url.startswith(("amqp://", "amqps://", "pyamqp://")) and database_url:
        # RabbitMQ without AGENTQ_RESULT_BACKEND_URL: the database. Tool calls then join in
        # Postgres (AGENTQ_TOOL_JOIN=database, the default for a backend that is not Redis)
        # and no task result is stored; a Redis backend adds chords, pushed events and one
        # rate limit across web processes (docs/deploying.md).
        return f"db+{database_url}"
    # RabbitMQ and others: chords need a backend that counts; Postgres through SQLAlchemy
    # would work, but Redis is what DESIGN names; make the operator choose.
    raise ConfigError("AGENTQ_RESULT_BACKEND_URL",
                      f"set it explicitly for broker {broker_url.split('://')[0]}://")


