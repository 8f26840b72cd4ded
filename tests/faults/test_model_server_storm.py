"""The fault suite's model server in a storm (benchmarks/llm_server.py, POST /config
{"storm": ...}): the share of calls it fails, the four kinds in turn, and the end of the
storm. No clock margins: a storm long enough to outlast the test, then ended by config."""
from __future__ import annotations

import pytest
import requests

from benchmarks.llm_server import STORM_CYCLE, BenchLLM


@pytest.fixture
def llm():
    server = BenchLLM().start()
    yield server
    server.stop()


def _chat(llm: BenchLLM, content: str = "What is 6*7?", tools=("math-evaluate",)):
    return requests.post(f"{llm.base_url}/chat/completions", timeout=30, json={
        "model": "m", "messages": [{"role": "user", "content": content}],
        "tools": [{"type": "function", "function": {"name": t}} for t in tools]})


def test_a_storm_fails_its_share_of_calls_with_each_kind_then_ends(llm):
    root = llm.base_url[:-3]
    answer = requests.post(f"{root}/config", timeout=10, json={"storm": {
        "seconds": 3600, "share": 0.8, "hang_s": 0.2, "retry_after_s": 7}})
    assert answer.status_code == 200 and answer.json()["storm"] is True
    replies = [_chat(llm) for _ in range(STORM_CYCLE)]
    codes = [r.status_code for r in replies]
    # 4 answered as usual, 4 answered late (the hangs)
    assert codes.count(200) == STORM_CYCLE - round(0.8 * STORM_CYCLE) + 4
    assert codes.count(429) == 8 and codes.count(500) == 4
    assert sorted(r.headers.get("retry-after") or "" for r in replies
                  if r.status_code == 429) == [""] * 4 + ["7"] * 4
    assert llm.stats()["storm"] == {"429_retry_after": 4, "429": 4, "500": 4, "hang": 4}
    # ended: every call answered
    assert requests.post(f"{root}/config", json={"storm": None}, timeout=10).json()[
        "storm"] is False
    assert {_chat(llm).status_code for _ in range(STORM_CYCLE)} == {200}


def test_a_bad_storm_config_is_a_400_and_changes_nothing(llm):
    root = llm.base_url[:-3]
    for bad in ({"storm": {"seconds": "x"}}, {"storm": {"seconds": 5, "share": 2}},
                {"storm": "loud"}, {"storm": {}}):
        assert requests.post(f"{root}/config", json=bad, timeout=10).status_code == 400, bad
    assert _chat(llm).status_code == 200


def test_the_job_mix_markers_pick_their_tool(llm):
    tools = ("math-evaluate", "files-create_document", "code-run_python")
    doc = _chat(llm, "Write it down. tool=create_document", tools).json()
    code = _chat(llm, "Slowly. tool=run_python:2", tools).json()
    plain = _chat(llm, "What is 6*7?", tools).json()
    name = lambda body: body["choices"][0]["message"]["tool_calls"][0]["function"]  # noqa: E731
    assert name(doc)["name"] == "files-create_document"
    assert name(code)["name"] == "code-run_python" and "sleep(2.0)" in name(code)["arguments"]
    assert name(plain)["name"] == "math-evaluate"
