"""Small wire conventions shared by services: RFC 3339 UTC times, cursors."""

from __future__ import annotations

from datetime import UTC, datetime


def ts(dt: datetime | None) -> str | None:
    """RFC 3339 in UTC with a ``Z`` (SPEC §2)."""
    if dt is None:
        return None
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_ts(text: str) -> datetime:
    """RFC 3339 (``Z`` or an offset); raises ValueError. A time without an offset is not RFC 3339."""
    value = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError("a time needs an offset or Z")
    return value
