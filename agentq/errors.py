"""One tree of errors, with fields, not only messages.

`AgentqError` is the root. `ClientError`s are rendered by the API as
`{"error": {"code", "message", "details"}}` with their `status`; everything else that reaches
the API boundary is a 500 with a generic message (the details go to the log).
"""
from __future__ import annotations

from typing import Any


class AgentqError(Exception):
    code = "internal_error"

    def __init__(self, message: str, **details: Any):
        super().__init__(message)
        self.message = message
        self.details = details


class ConfigError(AgentqError):
    code = "config_error"

    def __init__(self, variable: str, problem: str):
        super().__init__(f"{variable}: {problem}", variable=variable)
        self.variable = variable


class IllegalTransition(AgentqError):
    """A job was moved in a way its lifecycle's table does not allow
    (`agentq.loop.lifecycle.next_state`): a bug in our code, never the user's."""
    code = "illegal_transition"

    def __init__(self, transition: str, status: str, waiting_for: str | None, phase: str,
                 **details: Any):
        super().__init__(f"a job cannot {transition} from status {status}, waiting_for "
                         f"{waiting_for}, phase {phase}", transition=transition,
                         status=status, waiting_for=waiting_for, phase=phase, **details)
        self.transition, self.status = transition, status
        self.waiting_for, self.phase = waiting_for, phase


class ManifestError(AgentqError):
    """A tool module's manifest is wrong; raised at import, says what to fix."""
    code = "manifest_error"

    def __init__(self, module: str, problem: str):
        super().__init__(f"tool module {module!r}: {problem}", module=module)
        self.module = module


# --- client errors (4xx at the API boundary) -------------------------------------------

class ClientError(AgentqError):
    status = 400
    code = "bad_request"


class ValidationFailed(ClientError):
    status = 422
    code = "validation_error"

    def __init__(self, fields: dict[str, Any], message: str = "The request is not valid.",
                 **extra: Any):
        super().__init__(message, fields=fields, **extra)
        self.fields = fields


class Unauthorized(ClientError):
    status = 401
    code = "unauthorized"


class Forbidden(ClientError):
    status = 403
    code = "forbidden"


class NotFound(ClientError):
    status = 404
    code = "not_found"

    def __init__(self, kind: str, ident: str):
        super().__init__(f"No {kind} with id {ident}.", kind=kind, id=ident)


class Conflict(ClientError):
    status = 409
    code = "conflict"


class QuotaExceeded(ClientError):
    """A tenant's quota (agentq.tenants.Quotas) would be passed by this request."""
    status = 422
    code = "quota_exceeded"

    def __init__(self, quota: str, limit: int, used: int):
        super().__init__(f"This tenant's {quota} quota is {limit}, and {used} are in use.",
                         quota=quota, limit=limit, used=used)


class BadJson(ClientError):
    """A body (or a JSONL line) that is not JSON, or is nested deeper than allowed."""
    status = 400
    code = "bad_json"


class BadEncoding(ClientError):
    """A body (or a JSONL line) that is not valid UTF-8: refused, never stored with
    replacement characters."""
    status = 400
    code = "bad_encoding"


class UnknownQueryParameter(ClientError):
    status = 400
    code = "unknown_query_parameter"

    def __init__(self, names: list[str], allowed: list[str]):
        super().__init__(f"This route does not take the query parameter(s) "
                         f"{', '.join(names)}.", parameters=names, allowed=allowed)


class PayloadTooLarge(ClientError):
    status = 413
    code = "payload_too_large"

    def __init__(self, size: int, limit: int):
        super().__init__(f"The body is {size} bytes; the limit is {limit}.", size=size,
                         limit=limit)


class HeaderTooLarge(ClientError):
    status = 431
    code = "header_too_large"

    def __init__(self, name: str, size: int, limit: int):
        super().__init__(f"Header {name} is {size} bytes; the limit is {limit}.", header=name,
                         size=size, limit=limit)


class UnsupportedMediaType(ClientError):
    status = 415
    code = "unsupported_media_type"


# --- loop errors: end a job, never a worker --------------------------------------------

class JobError(AgentqError):
    code = "job_error"


class BudgetExceeded(JobError):
    code = "budget_exceeded"

    def __init__(self, used: int, limit: int):
        super().__init__(f"Monthly token budget used up: {used} of {limit} tokens.",
                         used=used, limit=limit)
        self.used, self.limit = used, limit


class ProviderError(JobError):
    """Every model in the chain failed.

    `transient` is True when every model's last failure was one that may pass by itself
    (429, 5xx, a timeout, a connection error, a provider's circuit open): the job then waits
    for the provider instead of failing. `retry_after_s` is the longest `Retry-After` (or the
    circuit's time left) among those failures, if any said."""
    code = "provider_error"

    def __init__(self, message: str, attempts: list[dict[str, Any]] | None = None, *,
                 transient: bool = False, retry_after_s: float | None = None):
        super().__init__(message, attempts=attempts or [])
        self.attempts = attempts or []
        self.transient = transient
        self.retry_after_s = retry_after_s


class ProviderTimeout(ProviderError):
    code = "provider_timeout"

    def __init__(self, timeout_s: float, model: str):
        super().__init__(f"Model {model} did not answer within {timeout_s:g} s.",
                         transient=True)
        self.timeout_s, self.model = timeout_s, model


class ProviderUnavailable(ProviderError):
    """The provider kept failing with transient errors for the whole wait window."""
    code = "provider_unavailable"


# --- tool errors: data for the model, not exceptions for us --------------------------

class ToolError(AgentqError):
    """Raised inside tool execution; turned into ToolResult(ok=False) for the model."""
    code = "tool_error"
    retryable = True


class ToolNotFound(ToolError):
    code = "tool_not_found"
    retryable = False

    def __init__(self, name: str):
        super().__init__(f"No tool named {name!r}.", name=name)
        self.name = name


class ToolNotPermitted(ToolError):
    code = "tool_not_permitted"
    retryable = False

    def __init__(self, name: str, required: str, level: str):
        super().__init__(f"Tool {name!r} needs permission {required!r}; caller is {level!r}.",
                         name=name, required=required, level=level)


class ToolArgumentsInvalid(ToolError):
    code = "invalid_arguments"
    retryable = False

    def __init__(self, name: str, problems: list[str]):
        super().__init__(f"Invalid arguments for {name}: " + "; ".join(problems),
                         name=name, problems=problems)
        self.problems = problems


class ToolTimeout(ToolError):
    code = "tool_timeout"

    def __init__(self, name: str, timeout_s: float):
        super().__init__(f"Tool {name} did not finish within {timeout_s:g} s.",
                         name=name, timeout_s=timeout_s)
        self.timeout_s = timeout_s
