"""How the tables' values are stored: the column types agentq.models declares its columns with.

JSON is JSONB on Postgres; a timestamp is timezone-aware UTC in and out on Postgres and on
SQLite (which keeps no zones); a `StrEnum` column holds its members' values. A leaf: it
imports nothing of agentq.
"""
from __future__ import annotations

import enum
from datetime import timezone

from sqlalchemy import JSON, DateTime, TypeDecorator
from sqlalchemy import Enum as SqlEnum
from sqlalchemy.dialects.postgresql import JSONB

JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC in and out, on Postgres (timestamptz) and SQLite (no zones)."""
    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; use UTC-aware ones")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


TZ = UTCDateTime()


def enum_column(kind: type[enum.StrEnum]) -> SqlEnum:
    """A column of `kind`'s members, stored as their values: the VARCHAR(16) the column
    always was, with no CHECK constraint and no database enum type, so the rows and the
    schema are those of the string column (no migration); a loaded value is the member."""
    return SqlEnum(kind, native_enum=False, create_constraint=False, length=16,
                   values_callable=lambda members: [m.value for m in members])
