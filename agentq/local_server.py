"""The local model server: llama.cpp's OpenAI-compatible server (`llama_cpp.server`, its
flags unchanged) whose `POST /v1/embeddings` is answered by the packaged embedding model
(`agentq.local_embeddings`) instead of the chat model, which has no embedding head.

    python -m agentq.local_server --model SmolLM2.gguf --port 8080 ...

`LocalModelServer` starts it as a child process. Without the embedding model's package,
llama.cpp's own route stays (and refuses: the chat model is not loaded for embeddings).
The embedding model loads in a thread while the chat model loads; a request waits for it.
"""
from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from agentq.local_embeddings import Encoder

log = logging.getLogger(__name__)

EMBEDDINGS_PATH = "/v1/embeddings"
LOAD_TIMEOUT_S = 120.0


class LazyEncoder:
    """The encoder, loaded in a background thread from construction on."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._encoder: Encoder | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._load, name="embedding-model", daemon=True).start()

    def _load(self) -> None:
        try:
            from agentq.local_embeddings import Encoder
            self._encoder = Encoder()
        except BaseException as exc:  # noqa: BLE001 - reported to every request
            self._error = exc
        finally:
            self._ready.set()

    def get(self) -> Encoder:
        if not self._ready.wait(LOAD_TIMEOUT_S):
            raise RuntimeError("the embedding model is still loading")
        if self._error is not None or self._encoder is None:
            raise RuntimeError(f"the embedding model failed to load: {self._error}")
        return self._encoder


def embeddings_body(encoder: Encoder, body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI embeddings response for a request body (`input`: a string or a list of
    strings; vectors as floats, or base64 of little-endian float32 when asked)."""
    import base64
    import struct

    from agentq.local_embeddings import EMBEDDING_MODEL, token_count
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError("input must be a string or a list of strings")
    data = []
    for i, vector in enumerate(encoder.embed(texts)):
        value: Any = vector
        if body.get("encoding_format") == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(token_count(t) for t in texts)
    return {"object": "list", "data": data, "model": body.get("model") or EMBEDDING_MODEL,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def install_embeddings(app: Starlette) -> bool:
    """Answer POST /v1/embeddings in `app` (llama.cpp's FastAPI app) with the packaged
    embedding model. False (the app unchanged) when it is not installed."""
    from agentq.local_embeddings import missing
    reason = missing()
    if reason is not None:
        log.warning("no local embedding model (%s): /v1/embeddings is llama.cpp's", reason)
        return False
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    encoder = LazyEncoder()

    async def create_embedding(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            answer = await run_in_threadpool(embeddings_body, encoder.get(), body)
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error",
                                           "code": "400"}}, status_code=400)
        except RuntimeError as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "server_error",
                                           "code": "503"}}, status_code=503)
        return JSONResponse(answer)

    # first in the app's routes: llama.cpp's own (inside its included router) never matches
    app.router.routes.insert(0, Route(EMBEDDINGS_PATH, create_embedding, methods=["POST"]))
    return True


REPACK_ENV = "AGENTQ_LOCAL_MODEL_REPACK"


def no_weight_repacking() -> None:
    """Load models without llama.cpp's extra buffer types (weights repacked for the CPU's
    matrix units): on a CPU that reports AMX, llama.cpp 0.3.36's AMX kernel crashes the
    server (SIGSEGV in `ggml_backend_amx_mul_mat`) at the first token. Llama() reads
    `llama_model_default_params()` when it loads; AGENTQ_LOCAL_MODEL_REPACK=1 keeps them."""
    import llama_cpp.llama_cpp as bindings
    defaults = bindings.llama_model_default_params

    def params():
        value = defaults()
        value.use_extra_bufts = False
        return value

    bindings.llama_model_default_params = params


def main(argv: list[str] | None = None) -> None:
    """`python -m llama_cpp.server`'s flags (no config file: LocalModelServer passes
    flags and clears the variables that would override them), then the same app and
    uvicorn, with /v1/embeddings answered by the packaged embedding model."""
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings
    parser = argparse.ArgumentParser(description="llama.cpp's server with agentq's "
                                                 "local embedding model")
    add_args_from_model(parser, Settings)
    args = parser.parse_args(argv)
    if os.environ.get(REPACK_ENV) != "1":
        no_weight_repacking()
    # llama_cpp annotates parse_model_from_args as returning the class it is given; it
    # returns an instance of it
    server = cast(ServerSettings, parse_model_from_args(ServerSettings, args))
    model = cast(ModelSettings, parse_model_from_args(ModelSettings, args))
    app = create_app(server_settings=server, model_settings=[model])
    install_embeddings(app)
    uvicorn.run(app, host=server.host, port=server.port)


if __name__ == "__main__":
    main()
