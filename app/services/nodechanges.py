"""A change of a node's hold, strikes or quarantine (docs/operators.md): its event, written in
the transaction that makes it, and its webhook, posted after the commit."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.services.notify import AfterCommit
from app.store.node_health import add_node_event, write_health

MEDIATOR = "mediator"  # who strikes, quarantines and lifts by itself


def note_change(
    s: Session,
    after: AfterCommit,
    node_id: str,
    change: str,
    reason: str | None,
    by: str | None,
) -> None:
    """A change of a node's hold or quarantine: its event now, its webhook after the commit."""
    add_node_event(s, node_id, change, reason, by)
    after.node_changes.append(
        {"event": "node", "node_id": node_id, "change": change, "reason": reason, "by": by}
    )


def lift_quarantine(
    s: Session,
    after: AfterCommit,
    node_id: str,
    reason: str | None,
    by: str,
    **also: Any,
) -> None:
    """The node's quarantine lifted and its strikes reset (its row locked by the caller), the
    change noted and the queue woken (wake point 9); ``also``: more columns of the row."""
    write_health(
        s,
        node_id,
        quarantined_at=None,
        quarantine_reason=None,
        quarantine_by=None,
        strikes=0,
        **also,
    )
    note_change(s, after, node_id, "quarantine lifted", reason, by)
    after.wake(f"quarantine lifted on {node_id}")
