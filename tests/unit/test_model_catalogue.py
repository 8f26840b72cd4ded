"""AGENTQ_MODELS parsed (agentq.llm.catalogue): JSON or a file; every mistake named."""
from __future__ import annotations

import json

import pytest

from agentq.config import Settings
from agentq.errors import ConfigError
from agentq.llm.catalogue import parse_models
from agentq.loop.context import context_window

GOOD = {"big": {"base_url": "https://api.example.com/v1/", "api_key_env": "EXAMPLE_KEY",
                "context_window": 131072, "quirks": {"tool_results_as": "user",
                                                     "temperature": None}},
        "local": {"base_url": "http://127.0.0.1:8080/v1"}}


def test_json_and_a_file_give_the_same_catalogue(tmp_path):
    env = {"EXAMPLE_KEY": "k"}
    from_json = parse_models(json.dumps(GOOD), env)
    path = tmp_path / "models.json"
    path.write_text(json.dumps(GOOD))
    assert parse_models(str(path), env) == from_json
    big = from_json["big"]
    assert big.base_url == "https://api.example.com/v1" and big.context_window == 131072
    assert big.quirk("tool_results_as", "tool") == "user"
    assert from_json["local"].api_key() == "no-key"
    assert parse_models(None) == {} and parse_models("  ") == {}


def test_the_catalogue_sets_a_models_context_window():
    settings = Settings.from_env({"AGENTQ_MODELS": json.dumps(GOOD), "EXAMPLE_KEY": "k"})
    assert context_window("big", settings) == 131072
    assert context_window("local", settings) == context_window("local", Settings.from_env({}))
    assert set(settings.models) == {"big", "local"}


@pytest.mark.parametrize("raw, says", [
    ("[1]", "expected an object"),
    ("{nope", "not valid JSON"),
    ("/no/such/models.json", "readable file"),
    ('{"x": 1}', "expected an object"),
    ('{"x": {}}', "base_url"),
    ('{"x": {"base_url": "ftp://h"}}', "base_url"),
    ('{"x": {"base_url": "http://h", "surprise": 1}}', "unknown keys"),
    ('{"x": {"base_url": "http://h", "api_key_env": "NOT_SET_HERE"}}', "not set"),
    ('{"x": {"base_url": "http://h", "context_window": 12}}', "context_window"),
    ('{"x": {"base_url": "http://h", "quirks": {"odd": 1}}}', "unknown quirks"),
    ('{"x": {"base_url": "http://h", "quirks": {"tool_results_as": "x"}}}', "tool_results_as"),
    ('{"x": {"base_url": "http://h", "quirks": {"temperature": 9}}}', "temperature"),
])
def test_a_bad_catalogue_is_a_configuration_error(raw, says):
    with pytest.raises(ConfigError) as caught:
        parse_models(raw, {})
    assert "AGENTQ_MODELS" in str(caught.value) and says in str(caught.value)
