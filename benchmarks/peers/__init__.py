"""The fair comparison's peers (benchmarks/fair.py): the services a user would build instead
of agentq, and the library peers driven phase by phase from stdin. What the two services
share: their Flask front (`job_front`) and a thing built once per process (`once`)."""
from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def once(build: Callable[[], T]) -> Callable[[], T]:
    """`build()` run at the first call, under a lock; every later call (any thread) gets what
    it built."""
    lock = threading.Lock()
    built: list[T] = []

    def get() -> T:
        with lock:
            if not built:
                built.append(build())
            return built[0]
    return get


def job_front(import_name: str, enqueue: Callable[[str], str],
              outcome: Callable[[str], tuple[str, Any]]):
    """A service's Flask front: `POST /jobs {"content": ...}` → 202 `{"id": enqueue(content)}`
    (400 in agentq's error shape without content); `GET /jobs/<id>` → `{"id", "status",
    "answer"}` from `outcome(id)` = (`pending` | `completed` | `failed`, the answer or None);
    `GET /health`."""
    from flask import Flask, jsonify, request
    app = Flask(import_name)

    @app.post("/jobs")
    def submit():
        content = (request.get_json(silent=True) or {}).get("content")
        if not isinstance(content, str) or not content:
            return jsonify({"error": {"code": "invalid_request",
                                      "message": "content is required", "details": {}}}), 400
        return jsonify({"id": enqueue(content)}), 202

    @app.get("/jobs/<job_id>")
    def status(job_id: str):
        state, answer = outcome(job_id)
        return jsonify({"id": job_id, "status": state, "answer": answer})

    @app.get("/health")
    def health():
        return jsonify({"ok": True})

    return app
