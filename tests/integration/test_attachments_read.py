"""An attachment served by a local HTTP server is read by files.read_document and by code in
the sandbox (code.run_python's file_ids), through the real stack. The model's replies come
from a responder that reads the file_id out of the message, as a model would."""
from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentq.models import FileRecord
from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import uid

pytestmark = pytest.mark.integration
CSV = "city,population\n" + "".join(f"city{i},{1000 + i}\n" for i in range(300))
FILE_ID_RE = re.compile(r"file_id: ([0-9a-f-]{36})")


@pytest.fixture(scope="module")
def files_server():
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            body = CSV.encode()
            self.send_response(200 if self.path == "/cities.csv" else 404)
            self.send_header("Content-Type", "text/csv")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def _responder(tag: str, first_call):
    """Calls a tool on the attached file (first_call(file_id)), then answers with what the
    tool gave back."""
    def respond(request: dict):
        messages = request.get("messages") or []
        users = [m.get("content") or "" for m in messages if m.get("role") == "user"]
        if not any(tag in u for u in users):
            return None
        if messages[-1].get("role") == "tool":
            return text("RESULT " + messages[-1]["content"])
        file_id = FILE_ID_RE.search(" ".join(users)).group(1)
        return tool_calls(first_call(file_id))
    return respond


@pytest.fixture
def responder(llm):
    previous = llm.responder

    def install(fn):
        llm.responder = lambda request: fn(request) or (previous(request) if previous
                                                        else None)
    yield install
    llm.responder = previous


def _submit_with_attachment(client, url: str, tag: str, user: str | None = None) -> dict:
    return client.submit(f"{tag} what is in the file?", user=user or uid("u"),
                         attachments=[{"filename": "cities.csv", "url": f"{url}/cities.csv",
                                       "mime_type": "text/csv"}])


def test_read_document_reads_an_attachment_from_its_url(client, stack, files_server,
                                                        responder):
    url, hits = files_server
    tag = uid("ATTACH")
    responder(_responder(tag, lambda fid: call("files.read_document",
                                               {"file_id": fid, "max_chars": 200})))
    before = len(hits)
    job = client.wait(_submit_with_attachment(client, url, tag)["id"])
    assert job["status"] == "completed", job
    assert job["response"]["metadata"]["tool_calls"][0]["success"] is True
    result = json.loads(job["response"]["content"].removeprefix("RESULT "))
    assert result["content"] == CSV[:200]
    assert result["total_chars"] == len(CSV) and result["next_offset"] == 200
    assert len(hits) > before
    # stored as the file's content: later reads need no fetch
    with stack.sessions()() as s:
        record = s.get(FileRecord, uuid.UUID(result["file_id"]))
    assert record.content == CSV.encode() and record.size_bytes == len(CSV)


def test_code_finds_the_attachment_in_its_scratch(client, stack, files_server, responder):
    url, _ = files_server
    tag = uid("ATTACH")
    user = uid("u")
    assert stack.agentq("users", "set", "api", user, "--level", "user").returncode == 0
    code = ("import csv\nrows = list(csv.DictReader(open('cities.csv')))\n"
            "print(len(rows), sum(int(r['population']) for r in rows))")
    responder(_responder(tag, lambda fid: call("code.run_python",
                                               {"code": code, "file_ids": [fid]})))
    job = client.wait(_submit_with_attachment(client, url, tag, user=user)["id"], timeout_s=90)
    assert job["status"] == "completed", job
    result = json.loads(job["response"]["content"].removeprefix("RESULT "))
    expected = sum(1000 + i for i in range(300))
    assert result["stdout"].strip() == f"300 {expected}", result
    assert list(result["files"].values()) == ["cities.csv"]
