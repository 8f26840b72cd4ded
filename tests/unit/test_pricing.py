import pytest

from agentq.errors import ConfigError
from agentq.llm import pricing
from agentq.llm.pricing import estimate_cost, load_prices, price_for


@pytest.fixture(autouse=True)
def fresh_prices(monkeypatch):
    monkeypatch.delenv("AGENTQ_PRICES", raising=False)
    pricing.reset_prices()
    yield
    pricing.reset_prices()


def test_known_models():
    assert estimate_cost("gpt-4o", 1_000_000, 0) == pytest.approx(2.50)
    assert estimate_cost("gpt-4o", 0, 1_000_000) == pytest.approx(10.00)
    expected = (1000 * 0.15 + 500 * 0.60) / 1e6
    assert estimate_cost("gpt-4o-mini", 1000, 500) == pytest.approx(expected)


@pytest.mark.parametrize("model, family", [
    ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
    ("gpt-4o-2024-08-06", "gpt-4o"),
    ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini"),
    ("gpt-4.1-nano", "gpt-4.1-nano"),
    ("gpt-4.1-2025-04-14", "gpt-4.1"),
    ("o3-2025-04-16", "o3"),
    ("o3-mini", "o3-mini"),
    ("o4-mini-2025-04-16", "o4-mini"),
    ("gpt-3.5-turbo-0125", "gpt-3.5-turbo"),
    ("GPT-4o", "gpt-4o"),
    ("openai/gpt-4o-mini", "gpt-4o-mini"),
])
def test_longest_prefix_wins(model, family):
    assert price_for(model) == pricing.DEFAULT_PRICES_USD_PER_M[family]


def test_unknown_model_costs_nothing():
    assert price_for("llama-3-70b") is None
    assert estimate_cost("llama-3-70b", 10_000, 10_000) == 0.0
    assert estimate_cost("", 10, 10) == 0.0


def test_negative_tokens_count_as_zero():
    assert estimate_cost("gpt-4o", -5, -5) == 0.0


def test_env_overrides_and_adds(monkeypatch):
    monkeypatch.setenv("AGENTQ_PRICES", '{"gpt-4o": [1, 2], "llama": [0.5, 0.5]}')
    pricing.reset_prices()
    assert estimate_cost("gpt-4o-2024-08-06", 1_000_000, 1_000_000) == pytest.approx(3.0)
    assert estimate_cost("gpt-4o-mini", 1_000_000, 0) == pytest.approx(0.15)  # longer prefix
    assert estimate_cost("llama-3-70b", 2_000_000, 0) == pytest.approx(1.0)


def test_env_is_read_once(monkeypatch):
    assert estimate_cost("llama", 1_000_000, 0) == 0.0
    monkeypatch.setenv("AGENTQ_PRICES", '{"llama": [1, 1]}')
    assert estimate_cost("llama", 1_000_000, 0) == 0.0
    pricing.reset_prices()
    assert estimate_cost("llama", 1_000_000, 0) == pytest.approx(1.0)


@pytest.mark.parametrize("raw", [
    "{not json", "[1, 2]", '{"m": [1]}', '{"m": "cheap"}', '{"m": [1, -2]}', '{"m": [true, 1]}',
    '{"": [1, 1]}',
])
def test_bad_env_is_a_config_error(raw):
    with pytest.raises(ConfigError) as info:
        load_prices({"AGENTQ_PRICES": raw})
    assert info.value.variable == "AGENTQ_PRICES"


def test_bad_env_fails_on_first_use(monkeypatch):
    monkeypatch.setenv("AGENTQ_PRICES", "{oops")
    pricing.reset_prices()
    with pytest.raises(ConfigError):
        estimate_cost("gpt-4o", 1, 1)


def test_empty_env_means_defaults():
    assert load_prices({"AGENTQ_PRICES": "  "}) == load_prices({})
