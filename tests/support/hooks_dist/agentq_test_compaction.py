"""A compaction strategy for tests: keeps the system messages and the newest KEEP others,
and says so in a system message of its own (what the model then sees shows it ran)."""
from __future__ import annotations

KEEP = 2
NOTE = "[compacted by keep_last: {dropped} older messages dropped]"


class KeepLast:
    def compact(self, ctx):
        messages = ctx["messages"]
        system = [m for m in messages if m["role"] == "system"]
        rest = [m for m in messages if m["role"] != "system"]
        kept = rest[-KEEP:]
        note = {"role": "system", "content": NOTE.format(dropped=len(rest) - len(kept))}
        return [*system, note, *kept]
