"""Which callback URLs agentq may call (SSRF guard).

A callback is `http` or `https` with a host. Unless private targets are allowed
(AGENTQ_WEBHOOK_ALLOW_PRIVATE), every address the host resolves to must be publicly routable:
no loopback, private, link-local, multicast, reserved, unspecified or otherwise non-global
address, looking through IPv4-mapped, 6to4 and Teredo IPv6 forms to the IPv4 inside.

The check runs twice: at submit (`check_callback_url`, a 422 naming `callback_url`) and again
right before each send (`resolve_and_check`), because DNS can change in between. Against DNS
rebinding, the send connects to the very address that was checked: the returned `Target`
pins the IP in the URL and carries the original host for the `Host` header and for TLS (SNI
and certificate verification). No window is left between check and connect.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from agentq.errors import ValidationFailed

FIELD = "callback_url"
ALLOWED_SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Target:
    """Where one attempt connects: `url` (IP-pinned when checked), and the original host for
    the `Host` header and TLS server name (None when the URL is used as given)."""
    url: str
    host_header: str | None = None
    sni_hostname: str | None = None


def _refuse(problem: str, field_name: str = FIELD) -> ValidationFailed:
    return ValidationFailed({field_name: [problem]},
                            f"The {field_name} is not allowed: {problem}")


def _split(url: str, field_name: str = FIELD) -> tuple[str, str, int]:
    """(scheme, host, port) of a well-formed http(s) URL, or ValidationFailed."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _refuse("Not a valid URL.", field_name) from None
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise _refuse("Only http and https URLs are allowed.", field_name)
    host = parts.hostname
    if not host:
        raise _refuse("The URL has no host.", field_name)
    return scheme, host, port or DEFAULT_PORTS[scheme]


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    inside = [address.ipv4_mapped, address.sixtofour]
    if address.teredo:
        inside.extend(address.teredo)
    return [a for a in inside if a is not None]


def disallowed_reason(address: IPAddress) -> str | None:
    """Why this address may not be called, or None when it is public."""
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        candidates.extend(_embedded_ipv4(address))
    for candidate in candidates:
        for flag, reason in (("is_unspecified", "unspecified"), ("is_loopback", "loopback"),
                             ("is_link_local", "link-local"), ("is_multicast", "multicast"),
                             ("is_private", "private"), ("is_reserved", "reserved")):
            if getattr(candidate, flag):
                return reason
        if not candidate.is_global:
            return "not publicly routable"
    return None


def _resolve(host: str, port: int, field_name: str = FIELD) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise _refuse(f"The host {host!r} does not resolve.", field_name) from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise _refuse(f"The host {host!r} does not resolve.", field_name)
    return addresses


def _public_addresses(host: str, port: int, field_name: str = FIELD) -> list[IPAddress]:
    """Every address of `host`, all of which must be public (one bad one refuses the host:
    a resolver answering a mix is how rebinding attacks get lucky)."""
    addresses = _resolve(host, port, field_name)
    for address in addresses:
        reason = disallowed_reason(address)
        if reason:
            raise _refuse(f"The host {host!r} resolves to a {reason} address; "
                          "agentq may only call public addresses here.", field_name)
    return addresses


def check_callback_url(url: str, allow_private: bool, field_name: str = FIELD) -> None:
    """Raise ValidationFailed({field_name: [...]}) unless agentq may call `url` (callbacks,
    and tool modules with field_name "url")."""
    _scheme, host, port = _split(url, field_name)
    if not allow_private:
        _public_addresses(host, port, field_name)


def resolve_and_check(url: str, allow_private: bool, field_name: str = FIELD) -> Target:
    """Check `url` now and say where to connect: the checked address itself, so a DNS answer
    that changes after the check cannot redirect the request (rebinding)."""
    _scheme, host, port = _split(url, field_name)
    if allow_private:
        return Target(url)
    address = _public_addresses(host, port, field_name)[0]
    if _is_ip_literal(host):
        return Target(url)  # nothing to resolve: the URL already names the address
    parsed = httpx.URL(url)
    host_header = parsed.host if port == DEFAULT_PORTS[parsed.scheme] else f"{parsed.host}:{port}"
    return Target(url=str(parsed.copy_with(host=str(address))), host_header=host_header,
                  sni_hostname=parsed.host)


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
