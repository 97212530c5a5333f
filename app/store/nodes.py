"""Node adverts: the fleet as the matcher sees it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, union
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.match import Advert, adverts_from_rows
from app.models import Lease, Node, Reservation, Run


@dataclass(frozen=True)
class PreviousAdvert:
    drain: str
    capabilities: Any
    live: bool


def lock_previous_advert(s: Session, node_id: str) -> PreviousAdvert | None:
    """The node row ``FOR UPDATE`` (last in the lock order): two adverts of one node serialise, and
    the second sees what the first stored. ``live`` is judged by the database clock."""
    row = s.execute(
        select(Node.drain, Node.capabilities, (Node.expires_at > func.now()).label("live"))
        .where(Node.node_id == node_id)
        .with_for_update()
    ).first()
    if row is None:
        return None
    return PreviousAdvert(row.drain, row.capabilities, bool(row.live))


def upsert_node(
    s: Session,
    *,
    node_id: str,
    label: str | None,
    principal: str | None,
    instance: str | None,
    capabilities: list[dict[str, Any]],
    drain: str,
    window_seconds: int,
) -> None:
    """Each advert replaces the previous one completely; ``seen_at = now()``, ``expires_at =
    now() + renew_seconds × not_after_factor`` (SPEC §4)."""
    values = {
        "node_id": node_id,
        "label": label,
        "principal": principal,
        "instance": instance,
        "capabilities": capabilities,
        "attr_count": sum(len(c.get("attrs") or {}) for c in capabilities),
        "drain": drain,
        "seen_at": func.now(),
        "expires_at": func.now() + timedelta(seconds=window_seconds),
    }
    stmt = pg_insert(Node).values(**values)
    s.execute(
        stmt.on_conflict_do_update(
            index_elements=[Node.node_id],
            set_={k: getattr(stmt.excluded, k) for k in values if k != "node_id"},
        )
    )


def live_adverts(s: Session) -> list[Advert]:
    rows = s.execute(
        select(Node.node_id, Node.capabilities, Node.label).where(Node.expires_at > func.now())
    ).all()
    return adverts_from_rows((r.node_id, r.capabilities, r.label) for r in rows)


def draining_node_ids(s: Session) -> set[str]:
    return set(
        s.execute(
            select(Node.node_id).where(Node.expires_at > func.now(), Node.drain != "")
        ).scalars()
    )


def unavailable_node_ids(s: Session, *, reserved_for: int | None = None) -> set[str]:
    """Nodes holding a lease ∪ draining nodes, read once (SPEC §6.3). ``reserved_for``: the
    priority of a run that holds no reservation (a submit, an acquire): the nodes reserved
    against it join the set, in the same statement (SPEC §7a)."""
    leased = select(Lease.node_id)
    draining = select(Node.node_id).where(Node.expires_at > func.now(), Node.drain != "")
    if reserved_for is None:
        return set(s.execute(leased.union(draining)).scalars())
    reserved = (
        select(Reservation.node_id)
        .join(Run, Run.run_id == Reservation.run_id)
        .where(Run.priority >= reserved_for)
    )
    return set(s.execute(union(leased, draining, reserved)).scalars())


def node_labels(s: Session, node_ids: list[str]) -> dict[str, str | None]:
    if not node_ids:
        return {}
    rows = s.execute(select(Node.node_id, Node.label).where(Node.node_id.in_(node_ids)))
    return {r.node_id: r.label for r in rows}


@dataclass(frozen=True)
class NodeRow:
    node: Node
    live: bool
    lease: Lease | None


def listed_nodes(s: Session) -> tuple[datetime, list[NodeRow]]:
    """Live nodes, and nodes that still hold a lease though their advert expired (SPEC §14),
    by node_id, with the database time of the snapshot."""
    now = s.execute(select(func.now())).scalar_one()
    q = (
        select(Node, (Node.expires_at > func.now()).label("live"), Lease)
        .outerjoin(Lease, Lease.node_id == Node.node_id)
        .where(or_(Node.expires_at > func.now(), Lease.node_id.is_not(None)))
        .order_by(Node.node_id)
    )
    return now, [NodeRow(r[0], bool(r[1]), r[2]) for r in s.execute(q).all()]


def live_nodes(s: Session) -> tuple[datetime, list[Node]]:
    now = s.execute(select(func.now())).scalar_one()
    q = select(Node).where(Node.expires_at > func.now()).order_by(Node.node_id)
    return now, list(s.execute(q).scalars())


def drain_of(s: Session, node_id: str) -> str:
    """The node's stored drain ("" when none, or no such node)."""
    return s.execute(select(Node.drain).where(Node.node_id == node_id)).scalar_one_or_none() or ""
