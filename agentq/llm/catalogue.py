"""The model catalogue (`AGENTQ_MODELS`): which OpenAI-compatible endpoint serves each model,
so one fallback chain can cross providers (seed 003's router).

`AGENTQ_MODELS` is JSON, or the path of a JSON file:

    {"gpt-4o-mini": {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY"},
     "llama-3.1-70b": {"base_url": "https://api.groq.com/openai/v1",
                       "api_key_env": "GROQ_API_KEY", "context_window": 131072,
                       "quirks": {"tool_results_as": "user"}}}

- `base_url` (required): the endpoint; the router's circuit breaker, concurrency and rate
  limits are kept per provider (its host and port: `agentq.llm.gate.provider_name`).
- `api_key_env`: the environment variable holding its key (unset: no key is sent, as for a
  local server; named but unset in the environment: a configuration error at start).
- `context_window`: its context window in tokens (AGENTQ_CONTEXT_WINDOW still wins).
- `quirks`: how its wire differs, each optional: `tool_results_as` (`tool` or `user`, as
  AGENTQ_TOOL_RESULTS_AS for this model) and `temperature` (a number sent to this model, or
  null for none).

A model not in the catalogue goes to `OPENAI_BASE_URL` with `OPENAI_API_KEY`, as before.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from agentq.errors import ConfigError

SETTING = "AGENTQ_MODELS"
QUIRKS = ("tool_results_as", "temperature")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    base_url: str
    api_key_env: str | None = None
    context_window: int | None = None
    quirks: Mapping[str, Any] = field(default_factory=dict)

    def api_key(self) -> str:
        """The key sent ("no-key" when the model has none: the SDK needs a string)."""
        return (os.environ.get(self.api_key_env) if self.api_key_env else None) or "no-key"

    def quirk(self, name: str, default: Any) -> Any:
        return self.quirks.get(name, default)


def parse_models(raw: str | None, env: Mapping[str, str] | None = None
                 ) -> dict[str, ModelEntry]:
    """`AGENTQ_MODELS` (JSON text, or a file holding it) → {name: ModelEntry}; a
    ConfigError naming what is wrong otherwise."""
    if raw is None or not raw.strip():
        return {}
    text = raw.strip()
    if not text.startswith(("{", "[")):
        try:
            text = Path(text).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(SETTING, f"neither JSON nor a readable file: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(SETTING, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(SETTING, "expected an object {model: {base_url, ...}}")
    env = os.environ if env is None else env
    return {name: _entry(name, spec, env) for name, spec in data.items()}


def _entry(name: str, spec: Any, env: Mapping[str, str]) -> ModelEntry:
    def bad(why: str) -> ConfigError:
        return ConfigError(SETTING, f"model {name!r}: {why}")
    if not name.strip() or len(name) > 200:
        raise bad("a model name is 1 to 200 characters")
    if not isinstance(spec, dict):
        raise bad("expected an object {base_url, api_key_env?, context_window?, quirks?}")
    unknown = set(spec) - {"base_url", "api_key_env", "context_window", "quirks"}
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)}")
    base_url = spec.get("base_url")
    parts = urlsplit(base_url) if isinstance(base_url, str) else None
    if not isinstance(base_url, str) or parts is None or \
            parts.scheme not in ("http", "https") or not parts.netloc:
        raise bad("base_url must be an http(s) URL")
    key_env = spec.get("api_key_env")
    if key_env is not None:
        if not isinstance(key_env, str) or not key_env.strip():
            raise bad("api_key_env must name an environment variable")
        if key_env not in env:
            raise bad(f"its api_key_env {key_env} is not set in the environment")
    window = spec.get("context_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 256):
        raise bad("context_window must be a whole number of tokens, at least 256")
    quirks = spec.get("quirks") or {}
    if not isinstance(quirks, dict):
        raise bad("quirks must be an object")
    unknown = set(quirks) - set(QUIRKS)
    if unknown:
        raise bad(f"unknown quirks {sorted(unknown)} (known: {', '.join(QUIRKS)})")
    if "tool_results_as" in quirks and quirks["tool_results_as"] not in ("tool", "user"):
        raise bad("quirk tool_results_as must be tool or user")
    temperature = quirks.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(
            temperature, (int, float)) or not math.isfinite(temperature)
            or not 0 <= temperature <= 2):
        raise bad("quirk temperature must be a number from 0 to 2, or null")
    return ModelEntry(name=name, base_url=base_url.rstrip("/"), api_key_env=key_env,
                      context_window=window, quirks=dict(quirks))
