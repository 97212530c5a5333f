"""A lease insert's statements, in the global lock order (docs/queue.md, "Lock order"): the
nodes' rows, then (with reservations on) the check that no reservation is held against the run
together with the record of placements, then the leases. Written as statements a caller sends
with its own in one round trip (:func:`app.store.pipeline.pipelined`): a submit after its run's
insert (:func:`app.store.runs.create_run`), a promotion (:func:`app.store.reservations.place_unreserved`
and :func:`app.store.leases.insert_leases`), an acquire (:func:`app.store.leases.acquire_lease`).

Every lease insert takes its nodes' rows first (``FOR SHARE``; an acquire ``FOR NO KEY UPDATE
SKIP LOCKED``) and keeps them until its commit. So a transaction that holds a node's row
exclusively knows that no other transaction is between its placement of that node and its
lease insert there: that is what lets an acquire, which comes after its run's own leases, take
its node without ever waiting (docs/queue.md, "Lock order")."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import ClauseElement, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from app.store import NodeTaken

# The reservations held against the run on the nodes: by another run of its priority or higher.
_BLOCKED = (
    "blocked AS ("
    " SELECT r.node_id FROM reservations r JOIN runs h ON h.run_id = r.run_id"
    " WHERE r.node_id = ANY(CAST(:nodes AS text[])) AND r.run_id <> :run_id"
    " AND h.priority >= :priority)"
)
# The record of placements (docs/priorities.md), only when nothing blocks.
_PLACED = (
    "placed AS ("
    " INSERT INTO placements (node_id, priority, last_at)"
    " SELECT n, :priority, now() FROM unnest(CAST(:nodes AS text[])) AS n"
    " WHERE NOT EXISTS (SELECT 1 FROM blocked)"
    " ORDER BY n"
    " ON CONFLICT (node_id, priority)"
    " DO UPDATE SET last_at = GREATEST(placements.last_at, excluded.last_at)"
    " RETURNING 1)"
)
# The rows of :func:`app.store.leases.lease_rows` (one JSONB parameter), in node_id order.
_LEASE_ROWS = (
    " SELECT r.node_id, r.run_id, r.role, r.capability, r.nonce,"
    " now() + make_interval(secs => r.ttl_seconds), r.team"
    " FROM jsonb_to_recordset(CAST(:new_leases AS jsonb)) AS r(node_id text, run_id text, role text,"
    " capability text, nonce text, ttl_seconds integer, team text)"
)
_INTO_LEASES = "INSERT INTO leases (node_id, run_id, role, capability, nonce, not_after, team)"

_CHECK_AND_PLACE = text(f"WITH {_BLOCKED}, {_PLACED} SELECT count(*) FROM blocked")

Statement = tuple[ClauseElement, dict[str, Any]]

# The check, the placements and then the leases, in one statement: the leases' source waits for
# ``placed`` to be read to its end (a scalar subquery, run before the first lease row), so the
# placements are written first, as the lock order has them.
_CHECK_PLACE_AND_LEASE = text(
    f"WITH {_BLOCKED}, {_PLACED},"
    f" leased AS ({_INTO_LEASES}{_LEASE_ROWS}"
    " WHERE NOT EXISTS (SELECT 1 FROM blocked) AND (SELECT count(*) FROM placed) >= 0"
    " ORDER BY r.node_id RETURNING 1)"
    " SELECT (SELECT count(*) FROM blocked), (SELECT count(*) FROM leased)"
).bindparams(bindparam("new_leases", type_=JSONB))

# The nodes' rows in node_id order, as the reservation writer locks them.
_LOCK_NODES = text(
    "SELECT node_id FROM nodes WHERE node_id = ANY(CAST(:nodes AS text[]))"
    " ORDER BY node_id FOR SHARE"
)

# One node's row, as _LOCK_NODES locks it: with a parameter PostgreSQL need not plan at every
# call (an array's length is not known to a generic plan, so ``= ANY`` was planned each time).
_LOCK_NODE = text("SELECT node_id FROM nodes WHERE node_id = :node FOR SHARE")


def _lock_nodes(nodes: list[str]) -> Statement:
    """The nodes' rows ``FOR SHARE`` in node_id order (``nodes`` sorted)."""
    if len(nodes) == 1:
        return (_LOCK_NODE, {"node": nodes[0]})
    return (_LOCK_NODES, {"nodes": nodes})


# The nodes' rows, then the leases, in one statement (no reservation to check): the lock is a
# scalar subquery the leases' source waits for, so every row is locked before the first insert.
_LOCK_AND_LEASE = text(
    "WITH locked AS (SELECT node_id FROM nodes WHERE node_id = ANY(CAST(:nodes AS text[]))"
    " ORDER BY node_id FOR SHARE)"
    f" {_INTO_LEASES}{_LEASE_ROWS}"
    " WHERE (SELECT count(*) FROM locked) >= 0 ORDER BY r.node_id"
).bindparams(bindparam("new_leases", type_=JSONB))

# An acquire's one node: taken at once or not at all (never waited for).
_LOCK_FREE_NODE = text(
    "SELECT node_id FROM nodes WHERE node_id = :node FOR NO KEY UPDATE SKIP LOCKED"
)


def leasing_statements(
    run_id: str, priority: int | None, leases: Sequence[dict[str, Any]]
) -> list[Statement]:
    """The statements that insert ``leases`` (rows of :func:`app.store.leases.lease_rows`) in the
    lock order: their nodes' rows ``FOR SHARE``, then with ``priority`` (reservations on: the
    priority whose reservations the leases may not pass) the check and the placements, then the
    leases. The check is a statement after the lock, and so sees a reservation its writer
    committed while this one waited for the rows (READ COMMITTED: a new snapshot a statement).
    The last statement's rows go to :func:`check_unreserved` when ``priority`` is given. A node
    another run holds fails on ``pk_leases``."""
    if not leases:
        return []
    nodes = sorted({str(lease["node_id"]) for lease in leases})
    rows = sorted(leases, key=lambda lease: str(lease["node_id"]))
    if priority is None:
        return [(_LOCK_AND_LEASE, {"nodes": nodes, "new_leases": rows})]
    params = {"nodes": nodes, "run_id": run_id, "priority": priority, "new_leases": rows}
    return [_lock_nodes(nodes), (_CHECK_PLACE_AND_LEASE, params)]


def unreserved_statements(run_id: str, priority: int, node_ids: Collection[str]) -> list[Statement]:
    """The nodes' rows ``FOR SHARE``, then the check and the placements, without the leases (a
    promotion inserts those with :func:`app.store.leases.insert_leases`, which locks the rows
    again, a no-op): :func:`app.store.reservations.place_unreserved`. None for no node."""
    nodes = sorted(set(node_ids))
    if not nodes:
        return []
    params = {"nodes": nodes, "run_id": run_id, "priority": priority}
    return [_lock_nodes(nodes), (_CHECK_AND_PLACE, params)]


def free_node_lock(node_id: str) -> Statement:
    """An acquire's node row ``FOR NO KEY UPDATE SKIP LOCKED``: no row when another transaction
    holds it (a lease insert between its placement and its commit, the reservation writer, an
    advert), which the acquire takes as "unavailable"."""
    return (_LOCK_FREE_NODE, {"node": node_id})


def check_and_place(run_id: str, priority: int, node_id: str) -> Statement:
    """The check and the placement of one node whose row the caller holds already (an acquire)."""
    return (_CHECK_AND_PLACE, {"nodes": [node_id], "run_id": run_id, "priority": priority})


def check_unreserved(run_id: str, blocked: Sequence[Sequence[Any]]) -> None:
    """:class:`NodeTaken` when the check of these statements found a reservation held against
    the run."""
    if blocked[0][0]:
        raise NodeTaken(run_id)
