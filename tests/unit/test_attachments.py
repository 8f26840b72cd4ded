"""Attachments fetched through the SSRF guard from a local HTTP server: refused on loopback
unless allowed, size-capped, content-type checked, no redirects; stored on first read, and
read by files.read_document a page at a time."""
from __future__ import annotations

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentq import attachments
from agentq.attachments import AttachmentError
from agentq.db import dispose_engines, session_factory, session_scope, utcnow
from agentq.models import FileRecord, Tenant, User
from agentq.tenants import DEFAULT_TENANT_ID
from agentq.tools.manifest import ToolContext
from tests.support import unit_db
from tool_workers.files import read_document

CSV = "name,score\n" + "".join(f"row{i},{i * 3}\n" for i in range(2000))


class Server:
    def __init__(self):
        self.hits: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.hits.append(self.path)
                routes = {
                    "/data.csv": (200, "text/csv; charset=utf-8", CSV.encode()),
                    "/big.txt": (200, "text/plain", b"x" * 5000),
                    "/app.exe": (200, "application/x-msdownload", b"MZ"),
                    "/moved": (302, "text/plain", b""),
                }
                status, kind, body = routes.get(self.path, (404, "text/plain", b"no"))
                self.send_response(status)
                self.send_header("Content-Type", kind)
                if self.path == "/moved":
                    self.send_header("Location", "/data.csv")
                if self.path != "/big.txt":  # the big one streams without a length
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def _fetch(url, **kw):
    return attachments.fetch(url, **{"max_bytes": 1_000_000, "timeout_s": 5,
                                     "allow_private": True, **kw})


def test_loopback_is_refused_unless_allowed(server):
    with pytest.raises(AttachmentError, match="loopback"):
        _fetch(f"{server.url}/data.csv", allow_private=False)
    fetched = _fetch(f"{server.url}/data.csv")
    assert fetched.content == CSV.encode() and fetched.content_type == "text/csv"


def test_size_cap_content_type_and_redirects(server):
    with pytest.raises(AttachmentError, match="limit"):  # declared length
        _fetch(f"{server.url}/data.csv", max_bytes=100)
    with pytest.raises(AttachmentError, match="limit"):  # streamed without a length
        _fetch(f"{server.url}/big.txt", max_bytes=1000)
    with pytest.raises(AttachmentError, match="content type"):
        _fetch(f"{server.url}/app.exe")
    with pytest.raises(AttachmentError, match="HTTP 302"):
        _fetch(f"{server.url}/moved")
    with pytest.raises(AttachmentError, match="HTTP 404"):
        _fetch(f"{server.url}/nothing")


@pytest.fixture
def db(tmp_path):
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path),
                                 "AGENTQ_ATTACHMENT_ALLOW_PRIVATE": "1"})
    yield settings, session_factory(settings)
    dispose_engines()


def _attached(settings, url: str) -> tuple[str, str]:
    with session_scope(settings) as session:
        if session.get(Tenant, DEFAULT_TENANT_ID) is None:
            session.add(Tenant(id=DEFAULT_TENANT_ID, name="default"))
        user = User(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID, permission_level="guest",
                    tokens_used_this_month=0, budget_reset_at=utcnow())
        session.add(user)
        session.flush()
        record = FileRecord(id=uuid.uuid4(), tenant_id=DEFAULT_TENANT_ID, user_id=user.id,
                            filename="data.csv", public_url=url)
        session.add(record)
        return str(record.id), str(user.id)


def test_read_document_fetches_once_then_pages(server, db):
    settings, sessions = db
    file_id, user_id = _attached(settings, f"{server.url}/data.csv")
    ctx = ToolContext(tool_use_id="t1", job_id=str(uuid.uuid4()), user_id=user_id,
                      conversation_id="c", permission_level="guest",
                      session_factory=sessions, extra={"settings": settings})
    before = len(server.hits)
    first = read_document({"file_id": file_id}, ctx)
    assert first["content"] == CSV[:6000] and first["truncated"]
    assert first["total_chars"] == len(CSV) and first["next_offset"] == 6000
    pages, offset = [first["content"]], first["next_offset"]
    while offset is not None:
        page = read_document({"file_id": file_id, "offset": offset, "max_chars": 10_000}, ctx)
        pages.append(page["content"])
        offset = page["next_offset"]
    assert "".join(pages) == CSV
    assert len(server.hits) == before + 1  # fetched on first read, stored, never again
    with sessions() as session:
        record = session.get(FileRecord, uuid.UUID(file_id))
        assert record.content == CSV.encode() and record.size_bytes == len(CSV)
        assert record.mime_type == "text/csv"


def test_another_users_file_is_not_found(server, db):
    settings, sessions = db
    file_id, _ = _attached(settings, f"{server.url}/data.csv")
    ctx = ToolContext(tool_use_id="t1", job_id="j", user_id=str(uuid.uuid4()),
                      conversation_id="c", permission_level="guest",
                      session_factory=sessions, extra={"settings": settings})
    with pytest.raises(AttachmentError, match="belongs"):
        read_document({"file_id": file_id}, ctx)
