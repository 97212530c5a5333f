"""The check that a lease insert passes no reservation (SPEC §7a), as statements a caller sends
with its own in one round trip: :func:`app.store.reservations.place_unreserved` alone, a submit
after its run's insert (:func:`app.store.runs.create_run`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import ClauseElement, text

from app.store import NodeTaken

_CHECK_AND_PLACE = text(
    "WITH blocked AS ("
    " SELECT r.node_id FROM reservations r JOIN runs h ON h.run_id = r.run_id"
    " WHERE r.node_id = ANY(CAST(:nodes AS text[])) AND r.run_id <> :run_id"
    " AND h.priority >= :priority),"
    " placed AS ("
    " INSERT INTO placements (node_id, priority, last_at)"
    " SELECT n, :priority, now() FROM unnest(CAST(:nodes AS text[])) AS n"
    " WHERE NOT EXISTS (SELECT 1 FROM blocked)"
    " ON CONFLICT (node_id, priority)"
    " DO UPDATE SET last_at = GREATEST(placements.last_at, excluded.last_at))"
    " SELECT count(*) FROM blocked"
)


# SPEC §7a: the nodes' rows in node_id order, as the reservation writer locks them.
_LOCK_NODES = text(
    "SELECT node_id FROM nodes WHERE node_id = ANY(CAST(:nodes AS text[]))"
    " ORDER BY node_id FOR SHARE"
)


def unreserved_statements(
    run_id: str, priority: int, node_ids: Collection[str]
) -> list[tuple[ClauseElement, dict[str, Any]]]:
    """The two statements of :func:`app.store.reservations.place_unreserved` (none for no node), for a caller that
    sends them after statements of its own in one round trip; their last one's rows go to
    :func:`check_unreserved`."""
    nodes = sorted(set(node_ids))
    if not nodes:
        return []
    params = {"nodes": nodes, "run_id": run_id, "priority": priority}
    return [(_LOCK_NODES, {"nodes": nodes}), (_CHECK_AND_PLACE, params)]


def check_unreserved(run_id: str, blocked: Sequence[Sequence[Any]]) -> None:
    """:class:`NodeTaken` when the check of :func:`unreserved_statements` found a reservation
    held against the run."""
    if blocked[0][0]:
        raise NodeTaken(run_id)
