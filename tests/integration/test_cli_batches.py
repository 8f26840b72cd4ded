"""`agentq batch …` and `agentq replay …` as a person runs them, against the real stack."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from agentq.testing.scripted_llm import call, error, text, tool_calls
from tests.support.api import uid
from tests.support.cli_run import agentq

pytestmark = pytest.mark.integration


def test_batch_submit_wait_then_results_in_request_order(stack, admin_key, script, tmp_path):
    marker = script([text("batched")] * 3)
    lines = [{"platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
              "content": f"{marker} line {i}", "custom_id": f"c-{i}"} for i in range(3)]
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    env = {"AGENTQ_URL": stack.base, "AGENTQ_API_KEY": admin_key}
    submitted = agentq(stack, "batch", "submit", str(path), "--wait", env=env)
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    assert "3/3 done, 0 failed" in submitted.stderr
    results = agentq(stack, "batch", "results", batch_id, env=env)
    rows = [json.loads(line) for line in results.stdout.splitlines()]
    assert [r["custom_id"] for r in rows] == ["c-0", "c-1", "c-2"]
    assert {r["response"]["content"] for r in rows} == {"batched"}


def test_a_bad_batch_file_is_refused_naming_the_line(stack, admin_key, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"platform": "api", "platform_user_id": "u", "platform_channel_id": "c",'
                    ' "content": "ok"}\n{"platform": "api"}\n')
    result = agentq(stack, "batch", "submit", str(path), "--url", stack.base,
                    "--key", admin_key)
    assert result.returncode != 0
    assert "422" in result.stderr and '"line": 2' in result.stderr


def test_replay_prints_how_the_answer_changed(stack, admin_key, script, client):
    marker = script([text("before"), text("after", expect_model="other-model")])
    original = client.wait(client.submit(f"{marker} hi")["id"])
    result = agentq(stack, "replay", original["id"], "--mode", "live", "--model",
                    "other-model", "--url", stack.base, "--key", admin_key)
    assert result.returncode == 0, result.stderr
    assert "changed" in result.stdout
    assert "before: [completed] before" in result.stdout
    assert "after:  [completed] after" in result.stdout


def test_replay_failed_since_replays_the_window(stack, admin_key, script, client):
    since = datetime.now(timezone.utc).isoformat()
    marker = script([error(400), error(400),  # the model, then its fallback
                     tool_calls(call("math.evaluate", {"expression": "1"})), text("recovered")])
    failed = client.wait(client.submit(f"{marker} go")["id"])
    assert failed["status"] == "failed"
    result = agentq(stack, "replay", "--failed", "--since", since, "--mode", "live",
                    "--url", stack.base, "--key", admin_key)
    assert result.returncode == 0, result.stderr
    assert "replaying 1 failed job(s)" in result.stderr
    assert f"{failed['id']} →" in result.stdout and "after:  [completed] recovered" in \
        result.stdout
