"""Leases: a node granted to a run. ``leases.node_id`` is the primary key
(docs/design.md#transactions-conflicts-and-retries)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.models import LEASES_PKEY, Lease, Run
from app.states import RUN_ALIVE
from app.store import NodeTaken, constraint_name
from app.store.bulk import delete_in_key_order
from app.store.pipeline import pipelined
from app.store.placing import (
    check_and_place,
    check_unreserved,
    free_node_lock,
    leasing_statements,
)


@dataclass(frozen=True)
class Grant:
    node_id: str
    role: str  # the first role this node fills
    capability: str  # that role's capability (shown in the heartbeat reply)


def lease_rows(
    run_id: str, grants: Sequence[Grant], ttl_seconds: int, team: str
) -> list[dict[str, object]]:
    """One lease per distinct node, in node_id order (the lock order, docs/queue.md), a fresh
    random nonce each, ``not_after = now() + ttl_seconds``, carrying the run's stored ``team``
    (docs/teams.md, "Fair share"). Inserted with the run
    (:func:`app.store.runs.create_run`) or at its promotion (:func:`insert_leases`)."""
    return [
        {
            "node_id": g.node_id,
            "run_id": run_id,
            "role": g.role,
            "capability": g.capability,
            "nonce": secrets.token_hex(16),
            "ttl_seconds": ttl_seconds,
            "team": team,
        }
        for g in sorted(grants, key=lambda g: g.node_id)
    ]


def insert_leases(
    s: Session, run_id: str, grants: Sequence[Grant], ttl_seconds: int, team: str
) -> None:
    """The leases of a promoted run, after its run row (and, with reservations on, after
    :func:`app.store.reservations.place_unreserved`): the nodes' rows ``FOR SHARE`` in node_id
    order (again, a no-op, when the check locked them), then the leases in node_id order, in one
    statement (docs/queue.md, "Lock order"). A node another run holds fails on ``pk_leases`` ->
    :class:`NodeTaken`; the transaction is then unusable and the caller rolls it back whole."""
    if not grants:
        return
    try:
        rows = lease_rows(run_id, grants, ttl_seconds, team)
        pipelined(s, *leasing_statements(run_id, None, rows))
    except IntegrityError as exc:
        if constraint_name(exc) == LEASES_PKEY:
            raise NodeTaken(run_id) from exc
        raise


def delete_leases_of_run(s: Session, run_id: str) -> list[str]:
    """Delete every lease of a run (settle, cancel, reaper cleanup); the run row is locked first,
    then its leases in node_id order (:func:`app.store.bulk.delete_in_key_order`). Returns the
    freed node ids."""
    rows = s.execute(delete_in_key_order(Lease.node_id, Lease.run_id == run_id)).all()
    return sorted(r.node_id for r in rows)


def leased_node_ids(s: Session) -> set[str]:
    """Busy nodes: a lease row exists, whatever its ``not_after`` (only the reaper
    turns an expired lease into a free node: docs/queue.md#leases)."""
    return set(s.execute(select(Lease.node_id)).scalars())


def leases_of_node(s: Session, node_id: str) -> list[Lease]:
    """The node's leases of runs not finished: what the heartbeat reply lists
    (docs/queue.md#heartbeats-what-a-node-learns)."""
    q = (
        select(Lease)
        .join(Run, Run.run_id == Lease.run_id)
        .where(Lease.node_id == node_id, Run.state.in_(RUN_ALIVE))
        .order_by(Lease.run_id)
    )
    return list(s.execute(q).scalars())


def leases_of_runs(s: Session, run_ids: Sequence[str]) -> list[Lease]:
    if not run_ids:
        return []
    return list(s.execute(select(Lease).where(Lease.run_id.in_(list(run_ids)))).scalars())


def lease_of_node(s: Session, node_id: str) -> Lease | None:
    return s.execute(select(Lease).where(Lease.node_id == node_id)).scalar_one_or_none()


def run_not_after(s: Session, run_id: str) -> datetime | None:
    """The not_after an acquired lease shares with the run's other leases
    (docs/contract.md#acquire)."""
    return s.execute(select(func.max(Lease.not_after)).where(Lease.run_id == run_id)).scalar_one()


def acquire_lease(
    s: Session,
    run_id: str,
    grant: Grant,
    not_after: datetime | None,
    ttl_seconds: int,
    *,
    reserved_for: int | None,
    team: str,
) -> bool:
    """An acquire step's lease (docs/contract.md, "acquire"), or False: "unavailable". Inside a
    SAVEPOINT, so that its placement and its lease are written together or not at all (a
    placement without its lease would make a queued run count as overtaken, docs/priorities.md):
    the node's row ``FOR NO KEY UPDATE SKIP LOCKED`` (another transaction holding it is placing a
    lease there, writing a reservation or storing an advert: unavailable); with ``reserved_for``
    (reservations on) the check that no reservation of that priority or higher holds the node,
    with its placement, in a new statement; then the lease, ``ON CONFLICT DO NOTHING`` (taken
    since the caller's read). Anything short of the lease rolls the savepoint back.

    It never waits: every lease insert holds its nodes' rows from before its placement to its
    commit, so with the row held here no other transaction is placing or leasing this node, and
    the placement and the insert find nothing to wait for. That is what makes an acquire safe
    after its run's own leases, out of the lock order (docs/queue.md, "Lock order")."""
    savepoint = s.begin_nested()
    try:
        acquired = _acquire(s, run_id, grant, not_after, ttl_seconds, reserved_for, team)
    except BaseException:
        savepoint.rollback()
        raise
    if acquired:
        savepoint.commit()
    else:
        savepoint.rollback()
    return acquired


def _acquire(
    s: Session,
    run_id: str,
    grant: Grant,
    not_after: datetime | None,
    ttl_seconds: int,
    reserved_for: int | None,
    team: str,
) -> bool:
    if not pipelined(s, free_node_lock(grant.node_id))[0]:
        return False
    if reserved_for is not None:
        try:
            check_unreserved(
                run_id, pipelined(s, check_and_place(run_id, reserved_for, grant.node_id))[0]
            )
        except NodeTaken:
            return False
    row = s.execute(
        pg_insert(Lease)
        .values(
            node_id=grant.node_id,
            run_id=run_id,
            role=grant.role,
            capability=grant.capability,
            not_after=not_after or (func.now() + timedelta(seconds=ttl_seconds)),
            nonce=secrets.token_hex(16),
            team=team,
        )
        .on_conflict_do_nothing(index_elements=[Lease.node_id])
        .returning(Lease.node_id)
    ).first()
    return row is not None


def delete_leases(s: Session, run_id: str, node_ids: Sequence[str]) -> list[str]:
    """Release: delete this run's leases of the given nodes (docs/contract.md#release), in node_id
    order (:func:`app.store.bulk.delete_in_key_order`); the run row is locked first."""
    if not node_ids:
        return []
    rows = s.execute(
        delete_in_key_order(
            Lease.node_id, (Lease.run_id == run_id) & Lease.node_id.in_(sorted(node_ids))
        )
    ).all()
    return sorted(r.node_id for r in rows)


def all_holders(s: Session) -> dict[str, str]:
    """node_id -> the run holding it, for every lease."""
    return {r.node_id: r.run_id for r in s.execute(select(Lease.node_id, Lease.run_id))}
