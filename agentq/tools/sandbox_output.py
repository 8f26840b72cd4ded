"""A sandboxed run's stdout and stderr: the start of each stream kept (as bytes), the rest
counted, and the text cut once, by its length as a JSON string (a control character takes
6 characters there), so a caller can size the caps to make its whole result fit its JSON
budget (`agentq.tools.sandbox`)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

MARKER = "\n... [truncated {n} bytes]"


def json_chars(text: str) -> int:
    """How many characters `text` takes as a JSON string (json.dumps, ensure_ascii=False,
    as tool results are written), quotes excluded."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


@dataclass
class Capture:
    """Keeps the start of a stream (as bytes) and counts the rest. Its text is cut so that
    it takes at most `max_chars` characters as a JSON string, the marker included: a
    control character takes 6 (\\u0001), a quote 2, so the caller's JSON budget holds."""
    max_chars: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        # a character takes at least one JSON character and at most 4 UTF-8 bytes
        room = self.max_chars * 4 + 4 - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def whole(self) -> str | None:
        """The stream, if it was kept whole."""
        if self.total != len(self.data):
            return None
        return printable(bytes(self.data).decode("utf-8", "surrogateescape"))

    def text(self, max_chars: int | None = None) -> tuple[str, bool]:
        """The stream as text taking at most `max_chars` (default: ours) JSON characters,
        and whether it was cut."""
        limit = self.max_chars if max_chars is None else max_chars
        whole = self.whole()
        if whole is not None and json_chars(whole) <= limit:
            return whole, False
        text = bytes(self.data).decode("utf-8", "surrogateescape")
        guess = self.total  # the marker's count, at most this many digits
        while True:
            room = limit - json_chars(MARKER.format(n=guess))
            low, high = 0, min(len(text), max(room, 0))
            while low < high:  # the longest prefix within the room
                mid = (low + high + 1) // 2
                if json_chars(printable(text[:mid])) <= room:
                    low = mid
                else:
                    high = mid - 1
            kept = text[:low]
            omitted = self.total - len(kept.encode("utf-8", "surrogateescape"))
            if len(str(omitted)) == len(str(guess)):
                break
            guess = omitted  # fewer digits: room for a little more text
        return printable(kept) + MARKER.format(n=omitted), True


def printable(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def share(captures: dict[str, Capture], total: int | None) -> dict[str, int]:
    """Each stream's JSON budget: its own cap, and when the streams share `total`, what one
    does not use goes to the other."""
    caps = {name: c.max_chars for name, c in captures.items()}
    if total is None or sum(caps.values()) <= total:
        return caps
    need = {}
    for name, capture in captures.items():
        whole = capture.whole()
        need[name] = json_chars(whole) if whole is not None else caps[name]
        need[name] = min(need[name], caps[name])
    fair = total // len(caps)
    small = [n for n in caps if need[n] <= fair]
    spare = total - sum(need[n] for n in small)
    large = [n for n in caps if n not in small]
    out = {n: need[n] for n in small}
    for n in large:
        out[n] = min(caps[n], spare // len(large))
    return out
