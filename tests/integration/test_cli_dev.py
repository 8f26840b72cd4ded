"""`agentq dev` as a person runs it: a subprocess serving the API on the port it was given,
against the scripted model; what it prints on the terminal, and what it refuses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import uid
from tests.support.stack import ROOT, free_port

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 120


def agentq_bin() -> str:
    return str(Path(sys.executable).with_name("agentq"))


def clean_env(home: Path, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("AGENTQ_", "OPENAI_", "PROMETHEUS_", "PORT"))}
    return {**base, "AGENTQ_HOME": str(home), **env}


def test_dev_serves_on_its_port_with_file_urls_on_that_port_and_plain_request_lines(
        llm, script, tmp_path):
    port = free_port()
    env = clean_env(tmp_path, OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="sk-test")
    err_path = tmp_path / "dev.err"
    with err_path.open("w") as log:
        process = subprocess.Popen([agentq_bin(), "dev", "--port", str(port)], cwd=ROOT,
                                   env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, err_path.read_text()
            try:
                if requests.get(f"{base}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "agentq dev did not answer"
            time.sleep(0.2)
        key = (tmp_path / "dev-key").read_text().strip()
        marker = script([tool_calls(call("files.create_document",
                                         {"title": "note", "content": "hello"})),
                         text("written")])
        submitted = requests.post(f"{base}/v1/messages", timeout=30,
                                  headers={"Authorization": f"Bearer {key}"},
                                  json={"platform": "api", "platform_user_id": uid("u"),
                                        "platform_channel_id": uid("c"),
                                        "content": f"{marker} write a note"})
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        job = requests.get(f"{base}/v1/jobs/{job_id}", params={"wait": 60}, timeout=90,
                           headers={"Authorization": f"Bearer {key}"}).json()
        assert job["status"] == "completed", job
        urls = [f["url"] for f in job["response"]["files"]]
        assert urls and all(u.startswith(f"http://localhost:{port}/v1/files/") for u in urls)
        # the file URL answers on the port it names
        fetched = requests.get(urls[0].replace("localhost", "127.0.0.1"), timeout=30,
                               headers={"Authorization": f"Bearer {key}"})
        assert fetched.status_code == 200
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=60)
    err = err_path.read_text()
    # what the terminal shows: where it serves and where jobs go, then plain request lines
    assert f"agentq on http://127.0.0.1:{port}" in out
    assert f"jobs go to model gpt-4o-mini at {llm.base_url}" in out
    assert f"dashboard: http://127.0.0.1:{port}/ui (sign in with the admin key)" in out
    request_lines = [line for line in err.splitlines() if "GET /health" in line]
    assert request_lines, err
    assert "\x1b[" not in err  # not a terminal: no colour codes
    assert not any(line.lstrip().startswith("{") for line in err.splitlines()), err
    # the JSON log has the request lines too, without colour codes
    logged = [json.loads(line) for line in (tmp_path / "agentq.log").read_text().splitlines()]
    werkzeug = [r["msg"] for r in logged if r["logger"] == "werkzeug"]
    assert any("GET /health" in m for m in werkzeug)
    assert not any("\x1b" in m for m in werkzeug)


@pytest.mark.parametrize("env, says", [
    ({}, "OPENAI_BASE_URL and OPENAI_API_KEY are unset"),
    ({"OPENAI_API_KEY": "sk-test"}, "does not look like an OpenAI key"),
])
def test_dev_without_a_model_says_so_and_refuses(tmp_path, env, says):
    result = subprocess.run([agentq_bin(), "dev", "--port", str(free_port())], cwd=ROOT,
                            env=clean_env(tmp_path, **env), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert says in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_setting_out_of_range_is_one_line(tmp_path):
    result = subprocess.run([agentq_bin(), "run", "hi"], cwd=ROOT, timeout=120,
                            env=clean_env(tmp_path, AGENTQ_MAX_ITERATIONS="500",
                                          OPENAI_BASE_URL="http://127.0.0.1:9/v1"),
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == ("Error: configuration: AGENTQ_MAX_ITERATIONS: must be "
                                     "from 1 to 200, got 500")


def test_a_setting_below_its_floor_says_the_floor(tmp_path):
    result = subprocess.run([agentq_bin(), "run", "hi"], cwd=ROOT, timeout=120,
                            env=clean_env(tmp_path, AGENTQ_STEP_DEADLINE_S="-5",
                                          OPENAI_BASE_URL="http://127.0.0.1:9/v1"),
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == ("Error: configuration: AGENTQ_STEP_DEADLINE_S: must be "
                                     "at least 1, got -5")


def test_version():
    result = subprocess.run([agentq_bin(), "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("agentq 0.1")
