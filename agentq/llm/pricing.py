"""What a model call cost, in USD, from a table of prices per million tokens.

A model is priced by the longest table key that its name starts with, so dated snapshots
(`gpt-4o-mini-2024-07-18`) price as their family (`gpt-4o-mini`). A `provider/` prefix
(`openai/gpt-4o`, as routers write it) is ignored when matching. Unknown models cost 0.0.

`AGENTQ_PRICES` overrides or adds entries: JSON `{"model-prefix": [input_usd_per_m,
output_usd_per_m]}`; read once per process (`reset_prices()` forgets it, for tests).
"""
from __future__ import annotations

import json
import math
import os
import threading
from typing import TYPE_CHECKING, Mapping

from agentq.errors import ConfigError

if TYPE_CHECKING:
    from agentq.config import Settings

OTHER_MODEL = "other"
"""`model_label` of a model that is neither configured nor priced."""

PRICES_ENV = "AGENTQ_PRICES"
TOKENS_PER_PRICE_UNIT = 1_000_000
COST_DECIMALS = 10

Price = tuple[float, float]
"""(input USD per 1M tokens, output USD per 1M tokens)"""

DEFAULT_PRICES_USD_PER_M: Mapping[str, Price] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o1": (15.00, 60.00),
    "o1-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "o3-mini": (1.10, 4.40),
    "o3-pro": (20.00, 80.00),
    "o4-mini": (1.10, 4.40),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-3.5-turbo": (0.50, 1.50),
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
}

_lock = threading.Lock()
_prices: dict[str, Price] | None = None


def _price(key: str, value: object) -> Price:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            or not all(math.isfinite(v) and v >= 0 for v in value)):
        raise ConfigError(PRICES_ENV, f"price of {key!r} must be [input_per_m, output_per_m], "
                                      f"two non-negative numbers; got {value!r}")
    return float(value[0]), float(value[1])


def load_prices(env: Mapping[str, str] | None = None) -> dict[str, Price]:
    """The default table with `AGENTQ_PRICES` from `env` (default os.environ) applied."""
    env = os.environ if env is None else env
    prices = {key.lower(): value for key, value in DEFAULT_PRICES_USD_PER_M.items()}
    raw = (env.get(PRICES_ENV) or "").strip()
    if not raw:
        return prices
    try:
        overrides = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(PRICES_ENV, f"not valid JSON: {exc}") from None
    if not isinstance(overrides, dict):
        raise ConfigError(PRICES_ENV, 'expected a JSON object {"model-prefix": [in, out]}')
    for key, value in overrides.items():
        if not key.strip():
            raise ConfigError(PRICES_ENV, "a model prefix is empty")
        prices[key.strip().lower()] = _price(key, value)
    return prices


def prices() -> Mapping[str, Price]:
    """The process's price table, read on first use."""
    global _prices
    if _prices is None:
        with _lock:
            if _prices is None:
                _prices = load_prices()
    return _prices


def reset_prices() -> None:
    """Forget the table so the next use reads the environment again."""
    global _prices
    with _lock:
        _prices = None


def price_for(model: str, table: Mapping[str, Price] | None = None) -> Price | None:
    """The price of `model` by longest matching prefix, or None when nothing matches."""
    table = prices() if table is None else table
    name = (model or "").strip().lower()
    candidates = {name, name.rsplit("/", 1)[-1]}
    best: str | None = None
    for key in table:
        if any(c.startswith(key) for c in candidates) and (best is None or len(key) > len(best)):
            best = key
    return table[best] if best is not None else None


def model_label(model: str | None, settings: Settings) -> str:
    """The metrics label of `model`: its name when it is configured (AGENTQ_MODEL,
    AGENTQ_FALLBACK_MODELS, AGENTQ_EMBEDDING_MODEL, the model catalogue) or a name of the
    price table, else `other`, so a name a request picked never becomes a series of its own
    (`agentq.metrics`)."""
    if not model:
        return OTHER_MODEL
    if model in (settings.model, settings.embedding_model) or \
            model in settings.fallback_models or model.lower() in prices() or \
            model in settings.models:
        return model
    return OTHER_MODEL


def estimate_cost(model: str, input_tokens: int, output_tokens: int) -> float:
    """USD cost of one call; 0.0 for a model with no price."""
    price = price_for(model)
    if price is None:
        return 0.0
    input_per_m, output_per_m = price
    cost = (max(0, input_tokens) * input_per_m
            + max(0, output_tokens) * output_per_m) / TOKENS_PER_PRICE_UNIT
    return round(cost, COST_DECIMALS)
