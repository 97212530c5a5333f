"""What operators and the Mediator keep about a node apart from its advert (docs/operators.md):
an operator's hold, strikes, quarantine and health runs, in ``node_health``, and the history of
their changes in ``node_events``. ``nodes`` stays the advert's alone.

Lock order (docs/queue.md, "Lock order"): a ``node_health`` row is locked after the runs,
node rows, placements, leases and reservations its transaction locks, and before the one-row
tables."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.models import Node, NodeEvent, NodeHealth
from app.store.pipeline import fetch

# An out-of-service node's row for the candidate reads: the predicate of ``ix_node_health_out``.
OUT_OF_SERVICE = (
    "(SELECT true FROM node_health h WHERE h.node_id = n.node_id"
    " AND (h.hold_mode IS NOT NULL OR h.quarantined_at IS NOT NULL) LIMIT 1) IS NOT NULL"
)


@dataclass(frozen=True)
class Health:
    """A node's row of ``node_health`` as read (all None/0 when it has none)."""

    hold_mode: str | None = None
    hold_reason: str | None = None
    hold_by: str | None = None
    hold_at: datetime | None = None
    strikes: int = 0
    quarantined_at: datetime | None = None
    quarantine_reason: str | None = None
    quarantine_by: str | None = None
    health_runs: int = 0
    health_queued_at: datetime | None = None
    health_ended_at: datetime | None = None

    @property
    def quarantined(self) -> bool:
        return self.quarantined_at is not None


def _health(row: NodeHealth | None) -> Health:
    if row is None:
        return Health()
    return Health(
        row.hold_mode,
        row.hold_reason,
        row.hold_by,
        row.hold_at,
        row.strikes,
        row.quarantined_at,
        row.quarantine_reason,
        row.quarantine_by,
        row.health_runs,
        row.health_queued_at,
        row.health_ended_at,
    )


def health_of(s: Session, node_id: str) -> Health:
    """The node's row, without a lock (an advert reads a hold so, docs/queue.md)."""
    return _health(s.get(NodeHealth, node_id, populate_existing=True))


def health_by_node(s: Session, node_ids: Iterable[str] | None = None) -> dict[str, Health]:
    """Every row (or those of ``node_ids``), by node."""
    q = select(NodeHealth)
    if node_ids is not None:
        q = q.where(NodeHealth.node_id.in_(list(node_ids)))
    return {r.node_id: _health(r) for r in s.execute(q).scalars()}


def lock_health(s: Session, node_id: str) -> Health:
    """The node's row ``FOR UPDATE``, created empty first when it has none."""
    s.execute(pg_insert(NodeHealth).values(node_id=node_id).on_conflict_do_nothing())
    row = s.execute(
        select(NodeHealth)
        .where(NodeHealth.node_id == node_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()
    return _health(row)


def node_seen(s: Session, node_id: str) -> bool:
    """Whether the node ever advertised (a row in ``nodes``, live or not)."""
    return s.execute(select(Node.node_id).where(Node.node_id == node_id)).first() is not None


def write_health(s: Session, node_id: str, **values: Any) -> None:
    """Set columns of the node's row (locked by :func:`lock_health`)."""
    s.execute(update(NodeHealth).where(NodeHealth.node_id == node_id).values(**values))


def add_node_event(
    s: Session, node_id: str, change: str, reason: str | None, by: str | None
) -> None:
    s.add(NodeEvent(node_id=node_id, change=change, reason=reason, by=by))
    s.flush()


def node_events(s: Session, node_id: str, limit: int = 50) -> list[NodeEvent]:
    q = (
        select(NodeEvent)
        .where(NodeEvent.node_id == node_id)
        .order_by(NodeEvent.at.desc(), NodeEvent.id.desc())
        .limit(limit)
    )
    return list(s.execute(q).scalars())


# A strike (docs/operators.md, "Quarantine"): one more, and the quarantine at :limit (0: never),
# in one statement on the row created when it has none; returns the strikes and whether this
# strike quarantined the node.
_STRIKE = text(
    "INSERT INTO node_health AS h (node_id, strikes) VALUES (:node, 1)"
    " ON CONFLICT (node_id) DO UPDATE SET strikes = h.strikes + 1"
    " RETURNING h.strikes, h.quarantined_at IS NOT NULL"
)


def add_strike(s: Session | Connection, node_id: str) -> tuple[int, bool]:
    """One strike more; (strikes now, whether the node was quarantined already)."""
    ((strikes, quarantined),) = fetch(s, _STRIKE, {"node": node_id})
    return int(strikes), bool(quarantined)


_RESET = text("UPDATE node_health SET strikes = 0 WHERE node_id = :node AND strikes > 0")


def reset_strikes(s: Session | Connection, node_id: str) -> None:
    """A DONE step on the node: its strikes go back to 0 (a node without strikes: no row
    changes)."""
    fetch(s, _RESET, {"node": node_id})


# What a result needs of its node in one statement: the advert's drain, the operator's hold and
# whether there are strikes to reset.
_RESULT_VIEW = text(
    "SELECT coalesce((SELECT drain FROM nodes WHERE node_id = :node), ''),"
    " (SELECT hold_mode FROM node_health WHERE node_id = :node),"
    " coalesce((SELECT strikes FROM node_health WHERE node_id = :node), 0)"
)


@dataclass(frozen=True)
class ResultView:
    drain: str  # the advert's own
    hold: str | None  # the operator's
    strikes: int

    @property
    def at_boundary(self) -> bool:
        """The node's effective drain is at-boundary (docs/operators.md, "Drain")."""
        return "at-boundary" in (self.drain, self.hold)


def result_view(s: Session | Connection, node_id: str) -> ResultView:
    ((drain, hold, strikes),) = fetch(s, _RESULT_VIEW, {"node": node_id})
    return ResultView(drain or "", hold, int(strikes))
