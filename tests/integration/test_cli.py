"""`agentq submit` and `agentq jobs show` as a person runs them: subprocesses talking HTTP to
the real stack."""
from __future__ import annotations

import json

import pytest

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import uid
from tests.support.cli_run import agentq

pytestmark = pytest.mark.integration


def test_submit_wait_prints_the_events_on_stderr_and_only_the_answer_on_stdout(
        stack, admin_key, script):
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("It is 42.")])
    result = agentq(stack, "submit", f"{marker} what is 6*7?", "--wait",
                    "--user", uid("u"), "--channel", uid("c"),
                    "--url", stack.base, "--key", admin_key)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "It is 42.\n"
    progress = result.stderr
    for expected in ("· turn 1", "calls math.evaluate", "→ math.evaluate",
                     '"expression": "6*7"', "← math.evaluate ok", "· turn 2", "answers",
                     "· completed (end_turn)"):
        assert expected in progress, progress
    assert progress.index("→ math.evaluate") < progress.index("← math.evaluate") \
        < progress.index("· completed")


def test_submit_prints_the_job_id_and_jobs_show_prints_the_job_and_its_events(
        stack, admin_key, script, client):
    marker = script([text("shown")])
    env = {"AGENTQ_URL": stack.base, "AGENTQ_API_KEY": admin_key}
    submitted = agentq(stack, "submit", f"{marker} hello", "--user", uid("u"),
                       "--channel", uid("c"), env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert client.wait(job_id)["status"] == "completed"

    shown = agentq(stack, "jobs", "show", job_id, env=env)
    assert shown.returncode == 0, shown.stderr
    head, _, events = shown.stdout.partition("\nevents (")
    job = json.loads(head)
    assert job["id"] == job_id and job["response"]["content"] == "shown"
    assert "· turn 1" in events and "· completed (end_turn)" in events

    as_json = json.loads(agentq(stack, "jobs", "show", job_id, "--json", env=env).stdout)
    assert as_json["job"]["id"] == job_id
    assert [e["type"] for e in as_json["events"]][-1] == "job_end"


def test_the_dev_key_file_and_port_are_the_defaults(stack, admin_key, script, tmp_path):
    (tmp_path / "dev-key").write_text(admin_key + "\n")
    marker = script([text("from the dev key")])
    result = agentq(stack, "submit", f"{marker} hi", "--wait", "--user", uid("u"),
                    "--channel", uid("c"),
                    env={"AGENTQ_HOME": str(tmp_path), "PORT": str(stack.port)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "from the dev key\n"


def test_api_errors_are_reported_not_raised(stack):
    result = agentq(stack, "jobs", "show", "no-such-job", "--url", stack.base, "--key", "wrong")
    assert result.returncode == 1
    assert "401 unauthorized" in result.stderr and "Traceback" not in result.stderr
