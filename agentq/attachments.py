"""Attachments made readable: a file registered with only a URL is fetched on first read
through the webhooks' SSRF guard (`agentq.webhooks.urls`: public addresses only unless
AGENTQ_ATTACHMENT_ALLOW_PRIVATE, the connection pinned to the checked address, no
redirects, no proxies from the environment), size-capped while it streams, its content type
checked, and stored as the file's content. Later reads use the stored bytes.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import httpx

from agentq.errors import ToolError, ValidationFailed
from agentq.models import FileRecord
from agentq.webhooks.delivery import _ssl_context
from agentq.webhooks.urls import resolve_and_check

log = logging.getLogger(__name__)

TEXT_TYPES = ("text/", "application/json", "application/xml", "application/yaml",
              "application/x-yaml", "application/csv", "application/x-ndjson",
              "application/javascript", "application/sql", "application/toml")
"""Content types read as text (by prefix)."""
DATA_TYPES = ("application/octet-stream", "application/pdf", "application/zip",
              "image/png", "image/jpeg", "image/gif", "image/webp",
              "application/vnd.openxmlformats-officedocument.",
              "application/vnd.ms-excel", "application/x-parquet")
"""Other content types fetched for code.run_python's scratch (not readable as text)."""


class AttachmentError(ToolError):
    retryable = False


@dataclass(frozen=True)
class Fetched:
    content: bytes
    content_type: str


def _base_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def is_text_type(content_type: str | None) -> bool:
    return _base_type(content_type).startswith(TEXT_TYPES)


def allowed_type(content_type: str | None) -> bool:
    base = _base_type(content_type)
    return base.startswith(TEXT_TYPES) or base.startswith(DATA_TYPES)


def fetch(url: str, *, max_bytes: int, timeout_s: float, allow_private: bool) -> Fetched:
    """GET `url` once through the SSRF guard; at most `max_bytes` are read."""
    try:
        target = resolve_and_check(url, allow_private)
    except ValidationFailed as exc:
        raise AttachmentError(exc.message.replace("callback_url", "attachment URL")) from None
    headers = {"Accept": "*/*", "User-Agent": "agentq-attachments"}
    extensions = {}
    if target.host_header:
        headers["Host"] = target.host_header
    if target.sni_hostname:
        extensions["sni_hostname"] = target.sni_hostname
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False,
                          verify=_ssl_context()) as client:
            request = client.build_request("GET", target.url, headers=headers,
                                           extensions=extensions)
            response = client.send(request, stream=True)
            try:
                if response.status_code != 200:
                    raise AttachmentError(f"fetching the attachment answered HTTP "
                                          f"{response.status_code}")
                content_type = _base_type(response.headers.get("content-type")) \
                    or "application/octet-stream"
                if not allowed_type(content_type):
                    raise AttachmentError(f"the attachment's content type {content_type!r} "
                                          "is not one agentq reads")
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > max_bytes:
                    raise AttachmentError(f"the attachment is {declared} bytes; the limit is "
                                          f"{max_bytes}")
                chunks, size = [], 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise AttachmentError(f"the attachment is larger than the limit of "
                                              f"{max_bytes} bytes")
                    chunks.append(chunk)
                return Fetched(b"".join(chunks), content_type)
            finally:
                response.close()
    except httpx.HTTPError as exc:
        raise AttachmentError(f"the attachment could not be fetched: "
                              f"{type(exc).__name__}") from None


def load(session_factory, settings, file_id: str, user_id: str) -> FileRecord:
    """The user's file with its content, fetched and stored first if it has only a URL."""
    try:
        ident = uuid.UUID(str(file_id))
    except ValueError:
        raise AttachmentError(f"file_id {file_id!r} is not a UUID") from None
    with session_factory() as session:
        record = session.get(FileRecord, ident)
        # users belong to one tenant: this user's files are in the job's tenant
        if record is None or record.user_id is None or str(record.user_id) != user_id:
            raise AttachmentError(f"no file {file_id} belongs to this user")
        if record.content is not None:
            session.expunge(record)
            return record
        url = record.public_url
    if not url:
        raise AttachmentError(f"file {ident} has no stored content and no URL to fetch")
    fetched = fetch(url, max_bytes=settings.attachment_max_bytes,
                    timeout_s=settings.attachment_timeout_s,
                    allow_private=settings.attachment_allow_private)
    with session_factory() as session, session.begin():
        record = session.get(FileRecord, ident, with_for_update=True)
        if record.content is None:  # a concurrent first read may have stored it already
            record.content = fetched.content
            record.size_bytes = len(fetched.content)
            if not record.mime_type or not allowed_type(record.mime_type):
                record.mime_type = fetched.content_type
            log.info("attachment fetched", extra={"file_id": str(ident),
                                                  "bytes": len(fetched.content)})
        session.flush()
        session.expunge(record)
    return record
