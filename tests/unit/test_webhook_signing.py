"""Webhook signing (verified by the standardwebhooks library itself) and the callback URL
checks (SSRF guard). No network: IP literals need no DNS; `localhost` is in /etc/hosts."""
from __future__ import annotations

import base64
import json
import socket

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from agentq.errors import ConfigError, ValidationFailed
from agentq.webhooks import urls
from agentq.webhooks.signing import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    new_event_id,
    signed_headers,
)
from agentq.webhooks.urls import check_callback_url, resolve_and_check

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NEW_SECRET = "whsec_" + base64.b64encode(b"another secret, 32 bytes long!!!").decode()
BODY = json.dumps({"type": "job.completed", "timestamp": "2024-01-01T00:00:00+00:00",
                   "data": {"id": "j1", "text": "caf\u00e9"}}, separators=(",", ":"))


# --- signing ------------------------------------------------------------------------------

def test_a_signature_verifies_with_the_library():
    # given an event signed with the configured secret
    event_id = new_event_id()
    headers = signed_headers((SECRET,), event_id, BODY)
    # then the library's own verifier accepts it and returns the payload
    assert headers[ID_HEADER] == event_id and event_id.startswith("msg_")
    assert headers[SIGNATURE_HEADER].startswith("v1,")
    assert Webhook(SECRET).verify(BODY.encode(), headers) == json.loads(BODY)


def test_a_changed_body_or_id_does_not_verify():
    headers = signed_headers((SECRET,), "msg_1", BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY.replace("j1", "j2"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY, {**headers, ID_HEADER: "msg_2"})


def test_rotation_every_secret_signs_first_first():
    # given two secrets (rotation)
    headers = signed_headers((SECRET, NEW_SECRET), "msg_rot", BODY)
    # then the header carries two v1 signatures, and a receiver with either secret verifies
    signatures = headers[SIGNATURE_HEADER].split(" ")
    assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)
    assert signatures[0] == signed_headers((SECRET,), "msg_rot", BODY,
                                           at=_at(headers))[SIGNATURE_HEADER]
    Webhook(SECRET).verify(BODY, headers)
    Webhook(NEW_SECRET).verify(BODY, headers)


def test_the_timestamp_header_is_whole_seconds_and_signed():
    headers = signed_headers((SECRET,), "msg_ts", BODY)
    assert headers[TIMESTAMP_HEADER].isdigit()
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY, {**headers,
                                      TIMESTAMP_HEADER: str(int(headers[TIMESTAMP_HEADER]) - 1)})


def test_no_secret_is_a_config_error_naming_the_variable():
    with pytest.raises(ConfigError) as caught:
        signed_headers((), "msg_x", BODY)
    assert caught.value.variable == "AGENTQ_WEBHOOK_SECRET"


def _at(headers):
    from datetime import datetime, timezone
    return datetime.fromtimestamp(int(headers[TIMESTAMP_HEADER]), timezone.utc)


# --- callback URLs ------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1/hook",
    "http://127.0.0.1:8080/hook",
    "http://10.1.2.3/hook",
    "http://192.168.0.10/hook",
    "http://172.16.5.4/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:10.0.0.1]/hook",
    "http://[fe80::1]/hook",
    "http://[fc00::1]/hook",
    "http://0.0.0.0/hook",
    "http://224.0.0.1/hook",
    "http://100.64.0.1/hook",
    "http://2130706433/hook",  # 127.0.0.1 as one number
    "http://localhost/hook",
])
def test_private_addresses_are_refused(url):
    with pytest.raises(ValidationFailed) as caught:
        check_callback_url(url, allow_private=False)
    assert list(caught.value.fields) == ["callback_url"]
    with pytest.raises(ValidationFailed):
        resolve_and_check(url, allow_private=False)


@pytest.mark.parametrize("url", ["ftp://example.com/x", "file:///etc/passwd", "http:///path",
                                 "gopher://1.1.1.1/", "http://1.1.1.1:99999/"])
def test_only_http_urls_with_a_host(url):
    for allow_private in (False, True):
        with pytest.raises(ValidationFailed) as caught:
            check_callback_url(url, allow_private=allow_private)
        assert "callback_url" in caught.value.fields


@pytest.mark.parametrize("url", ["https://1.1.1.1/hook", "http://8.8.8.8:8080/x?y=1",
                                 "https://[2606:4700:4700::1111]/hook"])
def test_a_public_ip_literal_passes(url):
    check_callback_url(url, allow_private=False)
    assert resolve_and_check(url, allow_private=False).url == url


def test_private_addresses_pass_when_allowed():
    check_callback_url("http://127.0.0.1:9/hook", allow_private=True)
    assert resolve_and_check("http://localhost:9/hook", allow_private=True).url == \
        "http://localhost:9/hook"


def _fake_dns(monkeypatch, *addresses):
    def getaddrinfo(host, port, type=0):
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port)) for a in addresses]
    monkeypatch.setattr(urls.socket, "getaddrinfo", getaddrinfo)


def test_a_hostname_is_pinned_to_its_checked_address(monkeypatch):
    # given a public name (DNS faked: no network in unit tests)
    _fake_dns(monkeypatch, "93.184.216.34")
    target = resolve_and_check("https://Hooks.Example.com:8443/in?k=v", allow_private=False)
    # then the request goes to the checked IP, with the name for Host and TLS
    assert target.url == "https://93.184.216.34:8443/in?k=v"
    assert target.host_header == "hooks.example.com:8443"
    assert target.sni_hostname == "hooks.example.com"


def test_one_private_answer_refuses_the_host(monkeypatch):
    # a resolver answering a public and a private address (rebinding) is refused
    _fake_dns(monkeypatch, "93.184.216.34", "10.0.0.5")
    with pytest.raises(ValidationFailed):
        resolve_and_check("https://rebind.example.com/", allow_private=False)


def test_an_unresolvable_host_is_refused(monkeypatch):
    def getaddrinfo(host, port, type=0):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    monkeypatch.setattr(urls.socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(ValidationFailed) as caught:
        check_callback_url("https://nowhere.invalid/", allow_private=False)
    assert "does not resolve" in caught.value.fields["callback_url"][0]
