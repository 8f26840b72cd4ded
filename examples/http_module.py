"""An example HTTP tool module (seed 003's protocol), started by one command:

    python -m examples.http_module --port 8700 [--name demo] [--secret whsec_…]

then registered with `agentq modules add demo http://127.0.0.1:8700 --secret whsec_…`
(a loopback module needs AGENTQ_MODULE_ALLOW_PRIVATE=1).

It serves `GET /manifest` and `POST /execute`. With a secret it verifies every request's
Standard Webhooks signature (the `standardwebhooks` package) and refuses a bad one with 401.
`GET /stats` tells how often it was asked (the tests read it). Standard library only, besides
standardwebhooks.

Tools: `<name>.add` (a + b), `<name>.echo` (the text and the context agentq sent),
`<name>.sleep` (sleeps, for time limits), `<name>.fail` (HTTP 500), `<name>.refuse`
(`{"ok": false, "error": ...}`), `<name>.garble` (an answer without `ok`).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def manifest(name: str) -> dict:
    number = {"type": "number"}
    return {
        "module": name,
        "description": "An example module: arithmetic, echo, and ways to fail.",
        "tools": [
            {"name": f"{name}.add", "description": "Add two numbers.",
             "parameters": {"type": "object", "properties": {"a": number, "b": number},
                            "required": ["a", "b"], "additionalProperties": False},
             "permission": "guest"},
            {"name": f"{name}.echo", "description": "Echo a text with the call's context.",
             "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                            "required": ["text"], "additionalProperties": False},
             "permission": "guest"},
            {"name": f"{name}.sleep", "description": "Sleep for some seconds.",
             "parameters": {"type": "object",
                            "properties": {"seconds": {"type": "number", "minimum": 0,
                                                       "maximum": 600}},
                            "required": ["seconds"], "additionalProperties": False},
             "permission": "guest", "time_limit_s": 2},
            {"name": f"{name}.fail", "description": "Always fails with HTTP 500.",
             "parameters": {"type": "object", "properties": {}}, "permission": "guest"},
            {"name": f"{name}.refuse", "description": "Always answers an error.",
             "parameters": {"type": "object", "properties": {}}, "permission": "guest"},
            {"name": f"{name}.garble", "description": "Answers outside the protocol.",
             "parameters": {"type": "object", "properties": {}}, "permission": "guest"},
        ],
    }


class Module:
    def __init__(self, name: str, secret: str | None, bad_manifest: bool = False):
        self.name = name
        self.verifier = None
        if secret:
            from standardwebhooks import Webhook
            self.verifier = Webhook(secret)
        self.bad_manifest = bad_manifest
        self.lock = threading.Lock()
        self.stats = {"manifest_fetches": 0, "executes": 0, "bad_signatures": 0,
                      "verified": 0, "in_flight": 0, "max_in_flight": 0, "calls": []}

    def verify(self, headers, body: bytes) -> bool:
        if self.verifier is None:
            return True
        from standardwebhooks.webhooks import WebhookVerificationError
        try:
            self.verifier.verify(body, {k.lower(): v for k, v in headers.items()})
        except ValueError as exc:  # verified; the empty body of GET /manifest is no JSON
            if isinstance(exc, WebhookVerificationError) or body:
                with self.lock:
                    self.stats["bad_signatures"] += 1
                return False
        except Exception:  # noqa: BLE001 - any unverifiable request counts as a bad signature
            with self.lock:
                self.stats["bad_signatures"] += 1
            return False
        with self.lock:
            self.stats["verified"] += 1
        return True

    def execute(self, request: dict) -> tuple[int, dict]:
        tool = str(request.get("tool", "")).partition(".")[2]
        args = request.get("arguments") or {}
        with self.lock:
            self.stats["executes"] += 1
            self.stats["in_flight"] += 1
            self.stats["max_in_flight"] = max(self.stats["max_in_flight"],
                                              self.stats["in_flight"])
            self.stats["calls"].append({"tool": request.get("tool"),
                                        "tool_use_id": request.get("tool_use_id"),
                                        "context": request.get("context")})
        try:
            if tool == "add":
                return 200, {"ok": True, "result": args["a"] + args["b"]}
            if tool == "echo":
                return 200, {"ok": True, "result": {"text": args["text"],
                                                    "context": request.get("context")}}
            if tool == "sleep":
                time.sleep(float(args["seconds"]))
                return 200, {"ok": True, "result": "slept"}
            if tool == "fail":
                return 500, {"error": "the module broke"}
            if tool == "refuse":
                return 200, {"ok": False, "error": {"code": "refused",
                                                    "message": "This tool always refuses."}}
            if tool == "garble":
                return 200, {"answer": "not the protocol's shape"}
            return 200, {"ok": False, "error": f"unknown tool {request.get('tool')!r}"}
        finally:
            with self.lock:
                self.stats["in_flight"] -= 1


def make_handler(module: Module):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: agentq pools its connections
        disable_nagle_algorithm = True  # headers and body go out at once, no 40 ms stall

        def log_message(self, *_args) -> None:
            pass

        def _answer(self, status: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if self.path == "/manifest":
                if not module.verify(self.headers, b""):
                    return self._answer(401, {"error": "bad signature"})
                with module.lock:
                    module.stats["manifest_fetches"] += 1
                body = manifest(module.name)
                if module.bad_manifest:
                    body["tools"][0]["parameters"] = {"type": "string"}
                return self._answer(200, body)
            if self.path == "/stats":
                with module.lock:
                    return self._answer(200, json.loads(json.dumps(module.stats)))
            self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/execute":
                return self._answer(404, {"error": "not found"})
            if not module.verify(self.headers, body):
                return self._answer(401, {"error": "bad signature"})
            try:
                request = json.loads(body)
            except ValueError:
                return self._answer(400, {"ok": False, "error": "not JSON"})
            status, answer = module.execute(request)
            self._answer(status, answer)

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--name", default="demo")
    parser.add_argument("--secret", default=None)
    parser.add_argument("--bad-manifest", action="store_true",
                        help="serve a manifest that agentq refuses (tests)")
    args = parser.parse_args(argv)
    module = Module(args.name, args.secret, args.bad_manifest)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(module))
    server.daemon_threads = True
    print(f"http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
