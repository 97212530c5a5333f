"""Leases: a node granted to a run. ``leases.node_id`` is the primary key (SPEC §1)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.models import LEASES_PKEY, Lease, Run
from app.states import RUN_ALIVE
from app.store import NodeTaken, constraint_name
from app.store.rows import LEASE_COLUMNS, rows_insert


@dataclass(frozen=True)
class Grant:
    node_id: str
    role: str  # the first role this node fills
    capability: str  # that role's capability (shown in the heartbeat reply)


def lease_rows(run_id: str, grants: Sequence[Grant], ttl_seconds: int) -> list[dict[str, object]]:
    """One lease per distinct node, in node_id order (SPEC §1 lock order), a fresh random nonce
    each, ``not_after = now() + ttl_seconds``. Inserted with the run
    (:func:`app.store.runs.create_run`) or at its promotion (:func:`insert_leases`)."""
    return [
        {
            "node_id": g.node_id,
            "run_id": run_id,
            "role": g.role,
            "capability": g.capability,
            "nonce": secrets.token_hex(16),
            "ttl_seconds": ttl_seconds,
        }
        for g in sorted(grants, key=lambda g: g.node_id)
    ]


_INSERT_LEASES = rows_insert(Lease, LEASE_COLUMNS, "leases")


def insert_leases(s: Session, run_id: str, grants: Sequence[Grant], ttl_seconds: int) -> None:
    """The leases of a promoted run. A node another run holds fails on ``pk_leases`` ->
    :class:`NodeTaken`; the transaction is then unusable and the caller rolls it back whole."""
    if not grants:
        return
    try:
        s.connection().execute(_INSERT_LEASES, {"leases": lease_rows(run_id, grants, ttl_seconds)})
    except IntegrityError as exc:
        if constraint_name(exc) == LEASES_PKEY:
            raise NodeTaken(run_id) from exc
        raise


def delete_leases_of_run(s: Session, run_id: str) -> list[str]:
    """Delete every lease of a run (settle, cancel, reaper cleanup); the run row is locked first.
    Returns the freed node ids."""
    rows = s.execute(delete(Lease).where(Lease.run_id == run_id).returning(Lease.node_id)).all()
    return sorted(r.node_id for r in rows)


def leased_node_ids(s: Session) -> set[str]:
    """Busy nodes: a lease row exists, whatever its ``not_after`` (SPEC §12: only the reaper turns
    an expired lease into a free node)."""
    return set(s.execute(select(Lease.node_id)).scalars())


def leases_of_node(s: Session, node_id: str) -> list[Lease]:
    """The node's leases of runs not finished: what the heartbeat reply lists (SPEC §4)."""
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
    """The not_after an acquired lease shares with the run's other leases (SPEC §8 acquire)."""
    return s.execute(select(func.max(Lease.not_after)).where(Lease.run_id == run_id)).scalar_one()


def insert_lease_if_free(
    s: Session, run_id: str, grant: Grant, not_after: datetime | None, ttl_seconds: int
) -> bool:
    """``INSERT … ON CONFLICT DO NOTHING``: a node taken meanwhile is "unavailable" for an acquire
    step, not an error that would end the surrounding transaction (SPEC §8)."""
    row = s.execute(
        pg_insert(Lease)
        .values(
            node_id=grant.node_id,
            run_id=run_id,
            role=grant.role,
            capability=grant.capability,
            not_after=not_after or (func.now() + timedelta(seconds=ttl_seconds)),
            nonce=secrets.token_hex(16),
        )
        .on_conflict_do_nothing(index_elements=[Lease.node_id])
        .returning(Lease.node_id)
    ).first()
    return row is not None


def delete_leases(s: Session, run_id: str, node_ids: Sequence[str]) -> list[str]:
    """Release: delete this run's leases of the given nodes (SPEC §8 ``release``)."""
    if not node_ids:
        return []
    rows = s.execute(
        delete(Lease)
        .where(Lease.run_id == run_id, Lease.node_id.in_(sorted(node_ids)))
        .returning(Lease.node_id)
    ).all()
    return sorted(r.node_id for r in rows)


def all_holders(s: Session) -> dict[str, str]:
    """node_id -> the run holding it, for every lease."""
    return {r.node_id: r.run_id for r in s.execute(select(Lease.node_id, Lease.run_id))}
