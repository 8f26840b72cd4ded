"""Tool names as we write them (`math.evaluate`) and as the Chat Completions API accepts
them (`^[a-zA-Z0-9_-]{1,64}$`).

Our names are `<module>.<tool>`, each part `[a-z][a-z0-9_]*`, so they never contain '-':
turning '.' into '-' is reversible. Any other string is made valid by replacing invalid
characters with '_' and, past 64 characters, by keeping a prefix plus a short stable hash.
`NameMap` does both directions for one request and keeps distinct names distinct.
"""
from __future__ import annotations

import hashlib
import re
from typing import Iterable

API_NAME_MAX_CHARS = 64
HASH_CHARS = 10
"""Hex digits of the sha256 suffix that keeps shortened or colliding names unique."""

OUR_NAME_RE = re.compile(r"[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*")
API_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_REVERSIBLE_RE = re.compile(r"[a-z][a-z0-9_]*-[a-z][a-z0-9_]*")
_INVALID_CHAR_RE = re.compile(r"[^a-zA-Z0-9_-]")


def is_our_name(name: str) -> bool:
    return OUR_NAME_RE.fullmatch(name) is not None


def is_api_name(name: str) -> bool:
    return API_NAME_RE.fullmatch(name) is not None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]


def _with_suffix(base: str, suffix: str) -> str:
    return f"{base[:API_NAME_MAX_CHARS - 1 - len(suffix)]}_{suffix}"


def to_api_name(name: str) -> str:
    """The API name of `name`: deterministic, always valid for the API."""
    if is_our_name(name):
        base = name.replace(".", "-")
    else:
        base = _INVALID_CHAR_RE.sub("_", name) or "_"
    if len(base) <= API_NAME_MAX_CHARS:
        return base
    return _with_suffix(base, _digest(name))


def from_api_name(api_name: str) -> str:
    """Undo the '.' -> '-' rule when `api_name` has its shape; else return it unchanged."""
    if _REVERSIBLE_RE.fullmatch(api_name):
        return api_name.replace("-", ".")
    return api_name


def _precedence(name: str, base: str) -> tuple[int, str]:
    # Who keeps the plain API name when several names map to it: one of our names first
    # (so the reversible rule stays true), then a name already valid as is, then order.
    if is_our_name(name):
        return (0, name)
    if name == base:
        return (1, name)
    return (2, name)


class NameMap:
    """Both directions between our names and API names, for one set of names.

    Deterministic: the result depends on the set of names, not on their order. Distinct
    names always get distinct API names; when two collide, the one with precedence keeps
    the plain name and the others get a hash suffix.
    """

    def __init__(self, names: Iterable[str] = ()):
        groups: dict[str, list[str]] = {}
        for name in sorted(set(names)):
            groups.setdefault(to_api_name(name), []).append(name)
        taken = set(groups)
        self._to_api: dict[str, str] = {}
        for base, members in sorted(groups.items()):
            members.sort(key=lambda n: _precedence(n, base))
            self._to_api[members[0]] = base
            for name in members[1:]:
                salt = 0
                candidate = _with_suffix(base, _digest(name))
                while candidate in taken:
                    salt += 1
                    candidate = _with_suffix(base, _digest(f"{name}#{salt}"))
                taken.add(candidate)
                self._to_api[name] = candidate
        self._to_ours = {api: ours for ours, api in self._to_api.items()}

    def api(self, ours: str) -> str:
        """The API name for one of our names (names outside the map: `to_api_name`)."""
        found = self._to_api.get(ours)
        return found if found is not None else to_api_name(ours)

    def ours(self, api_name: str) -> str:
        """Our name for an API name. Unknown names come back reversed by the '.' -> '-'
        rule when they have its shape, else unchanged (the loop then tells the model there
        is no such tool)."""
        found = self._to_ours.get(api_name)
        return found if found is not None else from_api_name(api_name)

    def __contains__(self, ours: object) -> bool:
        return ours in self._to_api

    def __len__(self) -> int:
        return len(self._to_api)

    def __repr__(self) -> str:
        return f"NameMap({self._to_api!r})"
