"""JSON depth is measured before the decoder runs (api/limits.py)."""
from __future__ import annotations

import json

import pytest

from agentq.errors import BadJson
from api.limits import check_depth, parse_json


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize("depth", [1, 5, 32])
def test_documents_within_the_limit_parse(depth):
    text = json.dumps({"a": json.loads(nested(depth - 1)) if depth > 1 else 1})
    assert parse_json(text, 32) == json.loads(text)


@pytest.mark.parametrize("depth", [33, 100, 1000, 100_000])
def test_deeper_documents_are_refused_before_parsing(depth):
    with pytest.raises(BadJson, match="nested deeper than 32"):
        parse_json(nested(depth), 32)
    with pytest.raises(BadJson, match="nested deeper"):
        parse_json('{"m": ' + nested(depth, '{"x": {}}') + "}", 32)


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"s": "[" * 10_000 + '\\"{' * 50, "t": ["]]]"]})
    assert parse_json(text, 4)["t"] == ["]]]"]


def test_many_shallow_values_are_not_deep():
    text = json.dumps([{"a": [1]} for _ in range(20_000)])
    check_depth(text, 3)
    with pytest.raises(BadJson):
        check_depth(text, 2)


def test_unopened_or_unclosed_brackets_are_not_json():
    with pytest.raises(BadJson, match="not JSON"):
        parse_json("[" * 50 + "}" * 50, 32)
    with pytest.raises(BadJson, match="not JSON"):
        parse_json('{"a": ', 32)
