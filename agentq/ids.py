"""Row ids: time-ordered (UUIDv7, RFC 9562), not random.

A table's primary key is a B-tree: a random id (UUIDv4) lands each new row's entry on a
random leaf page, so a table that grows keeps its whole index hot and writes each touched
page whole to the WAL after every checkpoint; a time-ordered id lands on the rightmost leaf
with the rows written just before it. A UUIDv7 is 48 bits of Unix milliseconds, then 74
bits of randomness (with a counter within one millisecond in one process, from `uuid6`):
ids stay unguessable in practice and sort by creation, across processes to the
millisecond. The column type is unchanged (`uuid`); rows made before keep their v4 ids.

Append-only tables whose rows are named by their parent and a counter have no id of their
own (`job_events`: (job_id, seq)). Names that are not row ids (a lease's owner, a temporary
path, a webhook event id, a provider call id) stay uuid4: nothing indexes them by order.
"""
from __future__ import annotations

import uuid

import uuid6


def new_id() -> uuid.UUID:
    """A new row id: a UUIDv7 (as a plain `uuid.UUID`)."""
    return uuid.UUID(int=uuid6.uuid7().int)
