"""Settings: every environment variable agentq reads, each with a default and a line of
documentation, read once into one frozen object.

The names in DESIGN.md's table are a public contract; the others are ours to add. How
each is parsed and bounded: `agentq.config.environment`; database URLs:
`agentq.config.urls`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from agentq.config import environment
from agentq.config.front import FrontLimits
from agentq.config.quotas import Quotas
from agentq.llm.catalogue import ModelEntry


@dataclass(frozen=True)
class Settings:
    # --- storage and transport -------------------------------------------------------
    database_url: str
    """AGENTQ_DATABASE_URL: SQLAlchemy URL; default an embedded SQLite file in AGENTQ_HOME.
    Any Postgres spelling (`postgresql://`, `postgres://`, `postgresql+psycopg://`,
    `postgresql+psycopg2://`) runs on psycopg2, the driver agentq installs."""
    broker_url: str
    """AGENTQ_BROKER_URL: Celery broker; default `memory://` (in-process broker and worker)."""
    result_backend_url: str
    """AGENTQ_RESULT_BACKEND_URL: Celery result backend (chords); follows a Redis broker;
    a SQLite file in AGENTQ_HOME with the embedded broker."""
    home: Path
    """AGENTQ_HOME: where the embedded defaults keep their files; default ./.agentq."""
    tool_join: str = "chord"
    """AGENTQ_TOOL_JOIN: how a turn's tool calls join into the next step: `chord` (a Celery
    chord on the Redis result backend, with an error callback) or `database` (the tool task
    that stores the last result enqueues the step). Default: chord with a Redis backend,
    database otherwise (Celery's chords do not join in an in-process worker)."""

    # --- the model ------------------------------------------------------------------
    model: str = "gpt-4o-mini"
    """AGENTQ_MODEL: default model when the persona names none."""
    fallback_models: tuple[str, ...] = ()
    """AGENTQ_FALLBACK_MODELS: comma-separated models tried, in order, when the first fails."""
    models: Mapping[str, "ModelEntry"] = field(default_factory=dict)
    """AGENTQ_MODELS: the model catalogue, JSON or a JSON file: {name: {base_url,
    api_key_env?, context_window?, quirks?}} (`agentq.llm.catalogue`); a model not in it
    goes to OPENAI_BASE_URL."""
    llm_timeout_s: float = 30.0
    """AGENTQ_LLM_TIMEOUT_S: one model call's timeout."""
    llm_retries: int = 3
    """AGENTQ_LLM_RETRIES: retries of one model on 429, 5xx, timeouts, connection errors."""
    llm_retry_base_s: float = 0.5
    """AGENTQ_LLM_RETRY_BASE_S: first backoff; doubles each retry, with full jitter."""
    llm_retry_max_s: float = 8.0
    """AGENTQ_LLM_RETRY_MAX_S: the longest single backoff."""

    provider_wait_s: float = 1800.0
    """AGENTQ_PROVIDER_WAIT_S: how long a job waits (`waiting_for: provider`) while every
    model of its chain keeps failing with transient errors, before it ends failed with
    `provider_unavailable`."""
    provider_retry_base_s: float = 5.0
    """AGENTQ_PROVIDER_RETRY_BASE_S: first delay before a waiting job's next attempt;
    doubles each attempt, with jitter; a longer `Retry-After` wins."""
    provider_retry_max_s: float = 300.0
    """AGENTQ_PROVIDER_RETRY_MAX_S: the longest delay between a waiting job's attempts."""
    provider_max_concurrency: int = 0
    """AGENTQ_PROVIDER_MAX_CONCURRENCY: model calls in flight to one provider (host), across
    every orchestrator process (Redis); 0: no limit."""
    provider_rate_per_s: int = 0
    """AGENTQ_PROVIDER_RATE_PER_S: model calls started per second to one provider, across
    every process; 0: no limit."""
    provider_breaker_failures: int = 20
    """AGENTQ_PROVIDER_BREAKER_FAILURES: transient failures of one provider within
    AGENTQ_PROVIDER_BREAKER_WINDOW_S that open its circuit (no calls; jobs park); 0: none."""
    provider_breaker_window_s: float = 10.0
    """AGENTQ_PROVIDER_BREAKER_WINDOW_S: the window those failures are counted in."""
    provider_breaker_open_s: float = 15.0
    """AGENTQ_PROVIDER_BREAKER_OPEN_S: how long an open circuit stays open before it lets
    one probe call through (half-open); the probe's success closes it."""

    max_tokens_per_request: int | None = None
    """AGENTQ_MAX_TOKENS_PER_REQUEST: a cap on any model call's output tokens, under the
    persona's own (local models ramble)."""
    tokenizer: str | None = None
    """AGENTQ_TOKENIZER: a .gguf whose tokenizer counts tokens when a server sends no usage."""
    temperature: float | None = None
    """AGENTQ_TEMPERATURE: sampling temperature sent with every model call (0..2); unset:
    the server's default. The local model runs at 0 (greedy)."""
    tool_results_as: str = "tool"
    """AGENTQ_TOOL_RESULTS_AS: how a tool's result reaches the model: `tool` (a role-`tool`
    message, the API's own form) or `user` (a user message naming the tool: for servers
    whose chat template drops role-`tool` messages, as llama.cpp's chatml-function-calling
    does). The local model uses `user`."""
    answer_after_tools: bool = False
    """AGENTQ_ANSWER_AFTER_TOOLS: 1 offers no tools on the model call right after a turn
    whose tool calls all succeeded, so the model answers from their results (small models
    otherwise call the tool again and again). The local model uses 1."""
    embedding_model: str = "text-embedding-3-small"
    """AGENTQ_EMBEDDING_MODEL: the model POST /v1/embed uses."""

    # --- the loop -------------------------------------------------------------------
    max_iterations: int = 10
    """AGENTQ_MAX_ITERATIONS: model calls one job may make (1..200)."""
    guest_monthly_tokens: int = 5000
    """AGENTQ_GUEST_MONTHLY_TOKENS: a new guest's monthly token budget."""
    budget_period_days: int = 30
    """AGENTQ_BUDGET_PERIOD_DAYS: length of a budget period."""
    tool_result_max_chars: int = 8000
    """AGENTQ_TOOL_RESULT_MAX_CHARS: a tool result longer than this is cut with a marker."""
    context_max_tokens: int = 6000
    """AGENTQ_CONTEXT_MAX_TOKENS: token budget of the history window sent to the model."""
    history_max_messages: int = 200
    """AGENTQ_HISTORY_MAX_MESSAGES: most messages a turn reads from the history."""
    context_window: int | None = None
    """AGENTQ_CONTEXT_WINDOW: the model's context window in tokens, for every model; unset:
    the per-model table (`agentq.loop.context.MODEL_CONTEXT_WINDOWS`), then
    AGENTQ_MODEL_CONTEXT_WINDOWS."""
    model_context_windows: Mapping[str, int] = field(default_factory=dict)
    """AGENTQ_MODEL_CONTEXT_WINDOWS: `model=tokens,...` overriding the per-model table."""
    compaction_threshold: float = 0.8
    """AGENTQ_COMPACTION_THRESHOLD: share of the context window past which a turn's context
    is compacted (old tool results pruned to stubs, then older turns summarised)."""
    compaction_keep_turns: int = 2
    """AGENTQ_COMPACTION_KEEP_TURNS: newest in-run turns never pruned nor summarised."""
    max_seconds: float | None = None
    """AGENTQ_MAX_SECONDS: wall time one job may run (unset: no limit); caps request limits."""
    max_job_tokens: int | None = None
    """AGENTQ_MAX_JOB_TOKENS: tokens (input + output) one job may use (unset: no limit);
    caps request limits."""
    hooks_enabled: bool = True
    """AGENTQ_HOOKS: 0 disables the `agentq.hooks` entry points."""
    compaction_strategy: str = "default"
    """AGENTQ_COMPACTION_STRATEGY: the entry point of group `agentq.compaction` that compacts
    a context past the threshold (`agentq.hooks`); `default`: prune-then-summarise."""
    default_guest_modules: tuple[str, ...] = ("math", "time", "files", "code", "memory")
    """AGENTQ_DEFAULT_MODULES: modules offered when no persona applies."""
    default_system_prompt: str = (
        "You are a helpful assistant. Use the tools offered when they help; "
        "answer plainly when they do not."
    )
    """AGENTQ_SYSTEM_PROMPT: system prompt when no persona applies."""

    # --- tools ----------------------------------------------------------------------
    tool_packages: tuple[str, ...] = ("tool_workers",)
    """AGENTQ_TOOL_PACKAGES: comma-separated packages whose subpackages are tool modules."""
    slow_modules: tuple[str, ...] = ("code",)
    """AGENTQ_SLOW_MODULES: modules that run on tools.slow.<module> with the slow limits."""
    local_modules: tuple[str, ...] = ()
    """AGENTQ_LOCAL_MODULES: in-process modules that declare themselves local (`math`,
    `time`) whose calls run inside the orchestrator's step, the next model call following
    in the same task (DESIGN 1.2, "Local tools"); unset: none, every call goes by chord to
    its module's queue."""
    local_tool_time_limit_s: float = 5.0
    """AGENTQ_LOCAL_TOOL_TIME_LIMIT_S: the most one attempt of a local call may take (its
    tool's own limit when lower); past it the call is answered `tool_timeout`."""
    tool_time_limit_s: float = 30.0
    """AGENTQ_TOOL_TIME_LIMIT_S: default time limit of one tool attempt."""
    slow_tool_time_limit_s: float = 120.0
    """AGENTQ_SLOW_TOOL_TIME_LIMIT_S: default time limit of one attempt of a slow tool."""
    tool_modules: tuple = ()
    """AGENTQ_TOOL_MODULES: external modules of a static deployment, `name=url` comma-
    separated (`name=mcp+http://…` for an MCP server); a module's secret in
    AGENTQ_MODULE_SECRET_<NAME>; slow when named in AGENTQ_SLOW_MODULES."""
    module_allow_private: bool = False
    """AGENTQ_MODULE_ALLOW_PRIVATE: 1 lets tool modules be on private/loopback addresses."""
    module_allow_commands: bool = False
    """AGENTQ_MODULE_ALLOW_COMMANDS: 1 lets `POST /v1/modules` register an MCP server by a
    command (run on every tools worker); off, only `agentq modules add --command` (an
    operator on the machine) may."""
    module_manifest_ttl_s: float = 3600.0
    """AGENTQ_MODULE_MANIFEST_TTL_S: how long a module's manifest stays cached in Redis."""
    module_sync_s: float = 2.0
    """AGENTQ_MODULE_SYNC_S: how often a process reads the module list and cache again."""
    module_retry_s: float = 30.0
    """AGENTQ_MODULE_RETRY_S: how often an unhealthy module is probed (its manifest fetched)."""
    module_fetch_timeout_s: float = 10.0
    """AGENTQ_MODULE_FETCH_TIMEOUT_S: timeout of fetching a module's manifest."""

    # --- durability -----------------------------------------------------------------
    step_deadline_s: float = 300.0
    """AGENTQ_STEP_DEADLINE_S: a job not advanced for this long is re-driven by the sweeper."""
    sweep_interval_s: float = 30.0
    """AGENTQ_SWEEP_INTERVAL_S: how often the sweeper runs."""
    approval_timeout_s: float = 86400.0
    """AGENTQ_APPROVAL_TIMEOUT_S: how long a tool call waits for a person's approval before
    it is denied, unless its manifest says otherwise."""
    max_agent_depth: int = 3
    """AGENTQ_MAX_AGENT_DEPTH: how deep sub-agents nest (`agents.delegate`): a job this many
    levels below a top-level job gets a tool error when it delegates."""
    memory_idle_s: float = 3600.0
    """AGENTQ_MEMORY_IDLE_S: a conversation with no job running and no message for this
    long is summarised into a memory of its user (once per new messages)."""
    memory_ef_search: int = 100
    """AGENTQ_MEMORY_EF_SEARCH: on pgvector, the HNSW search's candidate list (`hnsw.ef_search`,
    pgvector's default 40, at most 1,000): larger finds more of the exact nearest memories
    and costs more (docs/benchmarks.md, "4b. Memory recall": 72% of the exact top 5 at 40,
    92% at 100, 96% at 200 with 1,000,000 memories)."""
    memory_digest_interval_s: float = 60.0
    """AGENTQ_MEMORY_DIGEST_INTERVAL_S: how often beat looks for such conversations."""
    memory_digest_batch: int = 20
    """AGENTQ_MEMORY_DIGEST_BATCH: most conversations summarised per look."""
    schedule_interval_s: float = 1.0
    """AGENTQ_SCHEDULE_INTERVAL_S: how often beat looks for due schedules (the most a
    firing can be late by, besides the queue)."""
    max_redrives: int = 3
    """AGENTQ_MAX_REDRIVES: times one step may be taken by a worker and crash (its lease
    runs out without progress) before the job ends failed. A re-drive no worker took is
    never counted: a job does not fail because nothing consumed its message."""
    redrive_backoff_max_s: float = 300.0
    """AGENTQ_REDRIVE_BACKOFF_MAX_S: the longest wait between re-drives nobody took (the
    wait starts at the step deadline and doubles)."""
    result_expires_s: int = 2 * 24 * 3600
    """AGENTQ_RESULT_EXPIRES_S: how long the result backend keeps task results (>= a day)."""
    database_ride_out_s: float = 8.0
    """AGENTQ_DATABASE_RIDE_OUT_S: how long a submit (POST /v1/messages, /v1/continue)
    waits inside the request for a database that is away (a restart, a failover) before
    answering 503 with Retry-After; 0 answers 503 at once."""

    # --- webhooks -------------------------------------------------------------------
    webhook_secrets: tuple[str, ...] = ()
    """AGENTQ_WEBHOOK_SECRET: `whsec_…` secrets, space-separated for rotation (all sign)."""
    webhook_allow_private: bool = False
    """AGENTQ_WEBHOOK_ALLOW_PRIVATE: 1 lets callbacks reach private/loopback addresses."""
    webhook_timeout_s: float = 15.0
    """AGENTQ_WEBHOOK_TIMEOUT_S: one delivery attempt's timeout."""
    webhook_retry_schedule_s: tuple[float, ...] = (5, 30, 120, 600, 1800, 3600, 7200, 14400,
                                                   28800, 43200)
    """AGENTQ_WEBHOOK_RETRY_SCHEDULE_S: delays before each retry (default: about a day)."""
    webhook_overdue_s: float = 60.0
    """AGENTQ_WEBHOOK_OVERDUE_S: a pending delivery this late was not picked up (a lost
    message, a retry too far off for a countdown): the sweeper enqueues it again."""

    # --- attachments ----------------------------------------------------------------------
    attachment_max_bytes: int = 10 * 1024 * 1024
    """AGENTQ_ATTACHMENT_MAX_BYTES: an attachment fetched from its URL may be this large."""
    attachment_timeout_s: float = 15.0
    """AGENTQ_ATTACHMENT_TIMEOUT_S: one attachment fetch's timeout (each network phase)."""
    attachment_allow_private: bool = False
    """AGENTQ_ATTACHMENT_ALLOW_PRIVATE: 1 lets attachment URLs reach private/loopback
    addresses (the same SSRF guard as webhooks)."""

    # --- batches ----------------------------------------------------------------------
    batch_max_concurrency: int = 50
    """AGENTQ_BATCH_MAX_CONCURRENCY: a batch's jobs running at once, unless it says less."""

    # --- tenant quotas -----------------------------------------------------------------
    quotas: Quotas = field(default_factory=Quotas)
    """AGENTQ_QUOTA_*: every tenant's quotas and rate limits unless an operator sets its own
    (`agentq.config.quotas.Quotas`, one field per variable)."""

    # --- the web front's limits (api/limits.py, gunicorn.conf.py; docs/security.md) ------
    front: FrontLimits = field(default_factory=FrontLimits)
    """AGENTQ_MAX_BODY_BYTES, AGENTQ_MAX_JSON_DEPTH, AGENTQ_MAX_HEADER_BYTES,
    AGENTQ_HEADER_TIMEOUT_S, AGENTQ_BODY_TIMEOUT_S, AGENTQ_WEB_CONNECTIONS: what one request
    and one web worker may take (`agentq.config.front.FrontLimits`, a field per variable)."""

    # --- processes ------------------------------------------------------------------
    orchestrator_concurrency: int = 1000
    """AGENTQ_ORCHESTRATOR_CONCURRENCY: greenlets (or threads) per orchestrator process (model
    calls in flight): 1 to 20,000 on gevent, to 5,000 on threads (agentq.config.pool)."""
    orchestrator_pool: str = "threads"
    """AGENTQ_ORCHESTRATOR_POOL: the Celery pool of `agentq worker orchestrator`, `threads`
    or `gevent` (one thread, a greenlet per task; psycopg2 made cooperative by psycogreen:
    tasks/pools.py; gevent and psycogreen are among agentq's requirements). Why threads stay
    the default: agentq.config.pool. The embedded worker of `agentq dev`/`run` keeps its
    threads."""
    tools_concurrency: int = 8
    """AGENTQ_TOOLS_CONCURRENCY: threads per fast tools process."""
    slow_tools_concurrency: int = 2
    """AGENTQ_SLOW_TOOLS_CONCURRENCY: processes per slow tools worker."""
    db_pool_size: int = 30
    """AGENTQ_DB_POOL_SIZE: the most database connections a process holds; each is kept once
    opened (a thread past the limit waits for one)."""
    db_pool_timeout_s: float = 30.0
    """AGENTQ_DB_POOL_TIMEOUT_S: how long a unit of work waits for one of those connections
    before it is taken for the database being unreachable (a step retries, a submit rides
    it out). `agentq worker orchestrator` sets it, unless given, to half the step deadline
    (agentq.config.pool.connection_wait_s): its slots outnumber its connections by design,
    and a step queued on the pool is waiting its turn, not failing."""
    db_prepare_threshold: int = 2
    """AGENTQ_DB_PREPARE_THRESHOLD: on Postgres, a statement a connection runs this many times
    is prepared there (parsed and planned once, agentq/prepared.py); 0 never prepares (set it
    behind PgBouncer in transaction mode)."""
    public_url: str = "http://localhost:5000"
    """AGENTQ_PUBLIC_URL: the API's address as clients see it (file URLs)."""
    port: int = 5000
    """PORT: the web process's port (Procfile convention)."""
    log_level: str = "INFO"
    """AGENTQ_LOG_LEVEL: log level of every process. Celery's line for each task received
    and succeeded is written only at DEBUG (agentq.logs.PER_TASK)."""
    metrics_token: str | None = None
    """AGENTQ_METRICS_TOKEN: when set, `GET /metrics` needs `Authorization: Bearer <it>`."""

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url.startswith("memory://")

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """The settings `env` (the process's environment when None) gives."""
        return cls(**environment.read(env, cls))


_settings: Settings | None = None


def get_settings() -> Settings:
    """The process's settings, read from the environment on first use."""
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


def set_settings(settings: Settings | None) -> None:
    """Replace the process's settings (tests, the embedded runner)."""
    global _settings
    _settings = settings
