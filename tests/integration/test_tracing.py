"""OpenTelemetry traces through a real stack exporting over OTLP/HTTP to a receiver in this
test: one trace covers the submit, each step, each model request and each tool call, across
the web and worker processes, to the job's end (`job.end`); log lines carry its id."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import TEST_ENV, Client, uid
from tests.support.stack import Stack, create_database, die_with_parent, drop_database, free_port

pytestmark = pytest.mark.integration
SPANS_TIMEOUT_S = 60


class Receiver:
    """An OTLP/HTTP trace receiver: decodes each export and keeps its spans."""

    def __init__(self):
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for resource in request.resource_spans:
                        service = {a.key: a.value.string_value
                                   for a in resource.resource.attributes}.get("service.name")
                        for scope in resource.scope_spans:
                            for s in scope.spans:
                                receiver.spans.append({
                                    "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                    "parent": s.parent_span_id.hex(), "name": s.name,
                                    "service": service,
                                    "attributes": {a.key: _value(a.value)
                                                   for a in s.attributes}})
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def of_trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


@pytest.fixture(scope="module")
def traced(servers_up, llm, tmp_path_factory):
    """A stack of its own (own database, own Redis server) exporting traces to a receiver."""
    receiver = Receiver()
    redis_port = free_port()
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port",
                              str(redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL,
                             preexec_fn=die_with_parent)
    name = f"agentq_trace_{os.getpid()}"
    stack = None
    try:  # a failed set-up too leaves no process and no database behind
        database = create_database(name)
        env = {**TEST_ENV, "AGENTQ_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
               "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        stack = Stack(database, llm.base_url, tmp_path_factory.mktemp("traced"), env,
                      workers=("orchestrator", "tools"), beat=False)
        stack.start()
        yield stack, receiver, Client(stack, stack.create_key("traced", admin=True))
    finally:
        if stack is not None:
            stack.stop()
        redis.terminate()
        redis.wait(timeout=30)
        receiver.close()
        drop_database(name)


def test_one_trace_covers_submit_steps_model_requests_tools_and_the_end(traced, script):
    stack, receiver, client = traced
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("42")])
    job = client.wait(client.submit(f"{marker} what is 6*7", user=uid("u"))["id"])
    assert job["status"] == "completed"

    # once the processes have exported their spans (every 100 ms)
    deadline = time.monotonic() + SPANS_TIMEOUT_S
    while True:
        with receiver.lock:
            steps = [s for s in receiver.spans
                     if s["attributes"].get("agentq.job_id") == job["id"]]
        trace_ids = {s["trace_id"] for s in steps}
        # the step, the one after the tools, and the job's end
        if len(steps) >= 3 and len(trace_ids) == 1:
            spans = receiver.of_trace(trace_ids.pop())
            names = defaultdict(int)
            for s in spans:
                names[s["name"]] += 1
            if (names["llm.request"] >= 2 and any("tools.execute" in n for n in names)
                    and names["job.end"] >= 1
                    and any(s["service"] == "agentq-api" for s in spans)):
                break
        assert time.monotonic() < deadline, [
            (s["service"], s["name"], s["trace_id"][:6], s["span_id"][:6], s["parent"][:6],
             s["attributes"].get("agentq.job_id")) for s in receiver.spans]
        time.sleep(0.2)

    by_id = {s["span_id"]: s for s in spans}
    root = [s for s in spans if not s["parent"] or s["parent"] not in by_id]
    assert len(root) == 1 and root[0]["service"] == "agentq-api"  # the submit, in the web
    # every span of the job descends from the submit, across processes
    for s in spans:
        node = s
        while node["parent"] in by_id:
            node = by_id[node["parent"]]
        assert node is root[0]
    assert {s["service"] for s in spans} >= {"agentq-api", "agentq-worker"}
    runs = [s for s in spans if s["name"].startswith("run/")]
    assert {"run/orchestrator.step", "run/tools.execute"} <= {s["name"] for s in runs}
    models = {s["attributes"].get("agentq.model") for s in spans if s["name"] == "llm.request"}
    assert models == {"primary-model"}

    # each task's run span is a child of the span that sent it (its context rode in the
    # message's headers); no span is made for the send itself
    assert not [s["name"] for s in spans if s["name"].startswith("apply_async/")]
    first = next(s for s in runs if s["name"] == "run/orchestrator.step")
    assert by_id[first["parent"]] is root[0]  # the step sent by the submit's request
    tool = next(s for s in runs if s["name"] == "run/tools.execute")
    assert by_id[tool["parent"]]["name"] == "run/orchestrator.step"  # sent by the step

    # the job's end: one span, made by the step that ended the job (after the tools'
    # step), saying how it ended
    ends = [s for s in spans if s["name"] == "job.end"]
    assert len(ends) == 1
    end = ends[0]
    assert end["attributes"]["agentq.job_id"] == job["id"]
    assert end["attributes"]["agentq.status"] == "completed"
    assert end["attributes"]["agentq.finish_reason"] == job["finish_reason"] == "end_turn"
    assert end["service"] == "agentq-worker"
    parent = by_id[end["parent"]]
    assert parent["name"].startswith("run/orchestrator.")
    assert parent["attributes"].get("agentq.job_id") == job["id"]
    assert parent["attributes"].get("agentq.iteration") == max(
        s["attributes"].get("agentq.iteration", -1) for s in runs)

    # the worker's log lines of that job carry the trace's id
    trace_id = root[0]["trace_id"]
    lines = [json.loads(line) for line in stack.logs["orchestrator"].read_text().splitlines()
             if line.startswith("{")]
    assert any(line.get("trace_id") == trace_id and line.get("job_id") == job["id"]
               for line in lines)
