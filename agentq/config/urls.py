"""Database URLs as users type them, as agentq's driver takes them, and as messages show
them (the password masked)."""
from __future__ import annotations

from agentq.errors import ConfigError

# Every spelling of a Postgres URL a user might write, and the one driver agentq installs
# (psycopg2-binary): SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3, which is not
# installed, and never accepted Heroku's `postgres://`.
_POSTGRES_SCHEMES = ("postgresql+psycopg2://", "postgresql+psycopg://", "postgresql://",
                     "postgres://", "postgres+psycopg2://", "postgres+psycopg://")
POSTGRES_DRIVER_SCHEME = "postgresql+psycopg2://"


def normalize_database_url(url: str) -> str:
    """`url` with any Postgres scheme resolved to psycopg2; other URLs unchanged."""
    stripped = url.strip()
    lowered = stripped.lower()
    for scheme in _POSTGRES_SCHEMES:
        if lowered.startswith(scheme):
            return POSTGRES_DRIVER_SCHEME + stripped[len(scheme):]
    return stripped


def shown_url(url: str) -> str:
    """A URL as it was typed, its password masked (for messages and logs)."""
    from urllib.parse import urlsplit
    stripped = url.strip()
    try:
        password = urlsplit(stripped).password
    except ValueError:  # a port that is not a number, say: shown as typed, less the secret
        password = None
        if "@" in stripped and "://" in stripped:
            scheme, rest = stripped.split("://", 1)
            userinfo, at, tail = rest.rpartition("@")
            if ":" in userinfo:
                return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{tail}"
    if password:
        return stripped.replace(f":{password}@", ":***@", 1)
    return stripped


def check_database_url(url: str) -> str:
    """`url` if agentq can use it (a PostgreSQL or SQLite URL); else ConfigError naming the
    URL as typed (password masked) and what it can be."""
    from urllib.parse import urlsplit
    stripped = url.strip()
    scheme = stripped.split("://", 1)[0].lower() if "://" in stripped else ""
    expected = ("agentq runs on PostgreSQL (postgresql://user:password@host:port/name) or "
                "SQLite (sqlite:///path/to/file.db)")
    if not scheme:
        raise ConfigError("AGENTQ_DATABASE_URL",
                          f"{shown_url(stripped)!r} is not a database URL; {expected}")
    if not (scheme.startswith("sqlite") or any(stripped.lower().startswith(s)
                                               for s in _POSTGRES_SCHEMES)):
        raise ConfigError("AGENTQ_DATABASE_URL",
                          f"{shown_url(stripped)!r}: unknown scheme {scheme + '://'!r}; "
                          f"{expected}")
    if not scheme.startswith("sqlite"):
        try:
            urlsplit(stripped).port  # noqa: B018 - reading it raises on a port that is not a number
        except ValueError:
            raise ConfigError("AGENTQ_DATABASE_URL",
                              f"{shown_url(stripped)!r}: the port is not a number from 1 "
                              f"to 65535") from None
    return url


def libpq_url(url: str) -> str:
    """A Postgres SQLAlchemy URL in the form libpq/psycopg2.connect takes (no driver)."""
    return "postgresql://" + normalize_database_url(url).removeprefix(POSTGRES_DRIVER_SCHEME)
