"""An OTLP/HTTP trace receiver for the benchmarks: accepts `POST /v1/traces`, counts the
requests, bytes and spans it was sent (by service and by span name), keeps nothing else.
In its own process, so its CPU is not counted as agentq's (a real deployment exports to a
collector elsewhere).

    python -m benchmarks.otlp_sink

prints its base URL on stdout (set it as `OTEL_EXPORTER_OTLP_ENDPOINT`). `GET /stats`
answers the counts as JSON.
"""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ANSWER = ExportTraceServiceResponse().SerializeToString()


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = self.bytes = self.spans = 0
        self.services: dict[str, int] = {}
        self.names: dict[str, int] = {}


COUNTS = Counts()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector answers

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = ExportTraceServiceRequest.FromString(body)
        with COUNTS.lock:
            COUNTS.requests += 1
            COUNTS.bytes += len(body)
            for resource in request.resource_spans:
                service = next((a.value.string_value for a in resource.resource.attributes
                                if a.key == "service.name"), "?")
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        COUNTS.spans += 1
                        COUNTS.services[service] = COUNTS.services.get(service, 0) + 1
                        COUNTS.names[span.name] = COUNTS.names.get(span.name, 0) + 1
        self._answer(200, "application/x-protobuf", ANSWER)

    def do_GET(self):  # noqa: N802
        with COUNTS.lock:
            stats = {"requests": COUNTS.requests, "bytes": COUNTS.bytes,
                     "spans": COUNTS.spans, "services": dict(COUNTS.services),
                     "names": dict(COUNTS.names)}
        self._answer(200, "application/json", json.dumps(stats).encode())

    def _answer(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args):
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.close()


if __name__ == "__main__":
    main()
