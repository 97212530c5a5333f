"""Small wire conventions shared by services: RFC 3339 UTC times, cursors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def ts(dt: datetime | None) -> str | None:
    """RFC 3339 in UTC with a ``Z`` (docs/api.md#conventions)."""
    if dt is None:
        return None
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def mark_declared(doc: dict[str, Any], field: str, token: str | None) -> dict[str, Any]:
    """Beside a principal its caller declared (docs/tokens.md#principal) (``token``: the name of the
    token it was declared under; None: not self-declared), ``<field>_self_declared: true`` and
    ``token``. The principal itself stays a string where the original's clients read one."""
    if token is not None:
        doc[f"{field}_self_declared"] = True
        doc["token"] = token
    return doc


def parse_ts(text: str) -> datetime:
    """RFC 3339 (``Z`` or an offset); raises ValueError. A time without an offset is not RFC 3339."""
    value = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError("a time needs an offset or Z")
    return value
