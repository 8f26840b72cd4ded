"""A webhook endpoint on loopback for the tests that receive agentq's webhooks (the
`receiver` fixture, tests/conftest.py): it verifies each request's signature with the
standardwebhooks library, records it, and answers from a plan of status codes per path."""
from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.api import TEST_ENV

SECRET = TEST_ENV["AGENTQ_WEBHOOK_SECRET"]
"""The secret the test stacks sign their webhooks with."""
DELIVERY_TIMEOUT_S = 20


class Receiver:
    """A webhook endpoint: verifies every request with the standardwebhooks library, records
    it, and answers from a plan of status codes per path (then 200)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.plans: dict[str, deque[int]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = Webhook(SECRET).verify(body, dict(self.headers))
                    verified = True
                except WebhookVerificationError:
                    payload, verified = json.loads(body or b"null"), False
                with receiver.lock:
                    plan = receiver.plans.get(self.path)
                    status = plan.popleft() if plan else 200
                    receiver.requests.append({
                        "path": self.path, "verified": verified, "payload": payload,
                        "body": body, "headers": dict(self.headers),
                        "webhook_id": self.headers.get("webhook-id"),
                        "status": status})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str, *answers: int) -> str:
        with self.lock:
            self.plans[path] = deque(answers)
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def received(self, path: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["path"] == path]

    def wait_for(self, path: str, count: int) -> list[dict]:
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            got = self.received(path)
            if len(got) >= count:
                return got
            time.sleep(0.05)
        raise AssertionError(f"{path}: {len(self.received(path))} of {count} requests")
