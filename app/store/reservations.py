"""Reservations (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): nodes a
long-waiting QUEUED run holds back from runs of its priority or lower. Written by wake scans (under
the scan gate), deleted by every transaction that ends a holder's wait; lock order (docs/queue.md,
"Lock order"): the holders' run rows first, then the nodes' rows the writer reserves, then the
reservation rows, in node_id order."""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Connection,
    exists,
    func,
    literal_column,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.models import Node, NodeHealth, Placement, Reservation, Run
from app.reserve import Held
from app.states import QUEUED
from app.store.bulk import delete_in_key_order
from app.store.pipeline import pipelined
from app.store.placing import check_unreserved, unreserved_statements
from app.store.queue import (
    IS_QUEUED,
    QueuedRun,
    oldest_queued,
    queued_columns,
    reservation_probes,
)
from app.store.runs import add_event

RESERVING = "reserving: "
RELEASED = "reservation released"


@functools.cache
def _draining_and_reserved() -> CompoundSelect:
    """The statement of :func:`draining_and_reserved`; built once (it has no parameter)."""
    none: ColumnElement[Any] = literal_column("NULL")
    draining = select(Node.node_id, none.label("run_id"), none.label("p")).where(
        Node.expires_at > func.now(), Node.drain != ""
    )
    # An operator's hold drains too (docs/operators.md).
    held = select(NodeHealth.node_id, none.label("run_id"), none.label("p")).where(
        NodeHealth.hold_mode.is_not(None)
    )
    reserved = select(Reservation.node_id, Reservation.run_id, Run.priority).join(
        Run, Run.run_id == Reservation.run_id
    )
    # The typed select first: PostgreSQL types a UNION's columns pairwise from the left, and two
    # untyped NULLs first would make the priority column text.
    return union_all(reserved, draining, held)


def draining_and_reserved(s: Session) -> tuple[set[str], dict[str, Held]]:
    """Draining live nodes, and node -> holder of every reservation, in one statement (the fleet
    status reads both; a run's explanation of its wait reads its candidates' own, with them:
    ``candidate_adverts(with_leases=True, with_holders=True)``)."""
    rows = s.execute(_draining_and_reserved()).all()
    drains = {r[0] for r in rows if r[1] is None}
    held = {r[0]: Held(r[1], int(r[2])) for r in rows if r[1] is not None}
    return drains, held


@dataclass(frozen=True)
class Probe:
    held: bool  # the table is not empty
    aged: bool  # some QUEUED run has waited reserve_after_seconds
    overtaken: bool  # a lower-priority placement was made after the oldest queued run arrived
    oldest: datetime | None = None  # the oldest queued run's arrival


# A scan logs how many runs are queued (docs/metrics.md#logs) counting at most this many: the count
# costs a constant, never a read of a long queue (the metrics' queue depth counts them all, on a
# scrape).
QUEUED_COUNTED = 1000


def scan_probe(s: Session, seconds: int, top: int) -> tuple[int, Probe]:
    """One statement of index probes, never a read of every queued run (a scan's reads are
    bounded by shapes): how many runs are queued, counted up to ``QUEUED_COUNTED`` + 1, and whether a
    scan's reservation step has anything to do (it runs when a reserving run exists or the
    table is not empty: docs/design.md#priorities-and-reservations). ``top`` is the highest priority
    queued (the shapes' first runs have it). ``overtaken`` is a cheap filter over the record of
    placements; the scan checks each shape against the placements themselves. ``seconds`` <= 0:
    reservations are off, and no run is aged."""
    oldest = oldest_queued()
    held, aged, placed = reservation_probes(seconds, top, oldest)
    counted = select(func.count()).select_from(
        select(Run.run_id).where(IS_QUEUED).limit(QUEUED_COUNTED + 1).subquery()
    )
    row = s.execute(select(counted.scalar_subquery(), held, aged, placed, oldest)).one()
    return int(row[0]), Probe(bool(row[1]), bool(row[2]), bool(row[3]), row[4])


def lower_priority_placements(
    s: Session, top_priority: int, oldest: datetime
) -> list[tuple[str, int, datetime]]:
    """(node, priority, last placed at) from the record of placements, of priority below
    ``top_priority`` and after ``oldest``: what can make a waiting run of higher priority reserve
    at once, whether the run placed there still holds its lease or has ended
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits). At most nodes ×
    priorities rows."""
    rows = s.execute(
        select(Placement.node_id, Placement.priority, Placement.last_at).where(
            Placement.priority < top_priority, Placement.last_at > oldest
        )
    ).all()
    return [(r.node_id, r.priority, r.last_at) for r in rows]


def stored_reservations(s: Session) -> tuple[dict[str, str], dict[str, QueuedRun]]:
    """node -> holder as stored, and the holders that are still QUEUED."""
    rows = s.execute(
        select(Reservation.node_id, Run.state, *queued_columns()).join(
            Run, Run.run_id == Reservation.run_id
        )
    ).all()
    stored = {r[0]: r[2] for r in rows}
    holders = {r[2]: QueuedRun(*r[2:]) for r in rows if r[1] == QUEUED}
    return stored, holders


@dataclass(frozen=True)
class Written:
    changed: dict[str, list[str]]  # run -> its new reserved nodes, for every run whose set changed
    not_queued: set[str]  # planned holders whose wait ended meanwhile: nothing written for them


def write_reservations(s: Session, stored: Mapping[str, str], plan: Mapping[str, str]) -> Written:
    """Write only the difference between ``stored`` and ``plan`` (a kept row keeps its
    ``since``). The holders concerned are locked ``FOR SHARE`` in run_id order first, and rows
    are written only for holders still QUEUED (a cancel or promotion may have ended a wait
    since the plan was read). Then the nodes' rows it reserves ``FOR NO KEY UPDATE`` in node_id
    order, then the reservation rows: the ones gone deleted in node_id order, the new ones
    inserted in node_id order (docs/queue.md, "Lock order"). Each run whose set changed gets an
    event: ``reserving: <nodes>`` or ``reservation released``."""
    gone = [n for n, run in stored.items() if plan.get(n) != run]
    new = {n: run for n, run in plan.items() if stored.get(n) != run}
    touched = sorted({stored[n] for n in gone} | set(new.values()))
    if not touched:
        return Written({}, set())
    queued = set(
        s.execute(
            select(Run.run_id)
            .where(Run.run_id.in_(touched), Run.state == QUEUED)
            .order_by(Run.run_id)
            .with_for_update(read=True)
        ).scalars()
    )
    rows = [{"node_id": n, "run_id": run} for n, run in sorted(new.items()) if run in queued]
    if rows:
        # The nodes it reserves (docs/queue.md#lock-order), after the holders' run rows, so a lease
        # insert that read before this commit waits here and then sees the reservation
        # (place_unreserved).
        s.execute(
            select(Node.node_id)
            .where(Node.node_id.in_([r["node_id"] for r in rows]))
            .order_by(Node.node_id)
            .with_for_update(key_share=True)  # FOR NO KEY UPDATE
        )
    if gone:
        s.execute(delete_in_key_order(Reservation.node_id, Reservation.node_id.in_(sorted(gone))))
    if rows:
        s.execute(pg_insert(Reservation).values(rows).on_conflict_do_nothing())
    changed: dict[str, list[str]] = {}
    for run in touched:
        if run not in queued:
            continue
        nodes = sorted(n for n, holder in plan.items() if holder == run)
        changed[run] = nodes
        cause = RESERVING + ", ".join(nodes) if nodes else RELEASED
        add_event(s, run, QUEUED, QUEUED, cause, None)
    return Written(changed, set(touched) - queued)


def place_unreserved(
    s: Session | Connection, run_id: str, priority: int, node_ids: Collection[str]
) -> None:
    """Before a promotion's lease insert
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): ``FOR SHARE`` on the
    nodes' rows (node_id order), then, in a new statement and so a new snapshot, whether a
    reservation is held against the run on one of them; if none is, the placements are recorded
    (``placements (node_id, priority) -> last_at``) in that same statement. A reservation written
    after the caller's read is found: its writer holds ``FOR NO KEY UPDATE`` on those rows until it
    commits (:func:`write_reservations`), and the second statement starts only when the first has
    its locks. Both go to the server in one round trip (pipelined); the leases follow
    (:func:`app.store.leases.insert_leases`), as the lock order has them: nodes, placements, leases.
    A submit sends the same statements with its run's insert (:func:`app.store.runs.create_run`), an
    acquire its own (:func:`app.store.leases.acquire_lease`). Raises :class:`NodeTaken`: the
    caller's transaction is rolled back whole (the promotion leaves the run QUEUED)."""
    statements = unreserved_statements(run_id, priority, node_ids)
    if statements:
        check_unreserved(run_id, pipelined(s, *statements)[-1])


def release_reservations(s: Session, run_id: str) -> list[str]:
    """Delete the run's reservations (its wait ended: promoted, cancelled, timed out) in the
    caller's transaction, which holds the run row (and, at a promotion, its leases: reservations
    come after them in the lock order), in node_id order; an event when there were any."""
    deleted = s.execute(delete_in_key_order(Reservation.node_id, Reservation.run_id == run_id))
    nodes = [row.node_id for row in deleted]
    if nodes:
        add_event(s, run_id, QUEUED, QUEUED, RELEASED, None)
    return sorted(nodes)


def clear_reservations(s: Session) -> None:
    """Reservations off (``queue.reserve_after_seconds`` = 0): the empty set, deleted in node_id
    order (a cancel deleting its run's rows meanwhile locks them in that order too)."""
    s.execute(delete_in_key_order(Reservation.node_id, true()))


def queued_crossed_age(s: Session, seconds: int, previous: datetime | None) -> bool:
    """Whether a QUEUED run crossed ``seconds`` of waiting since ``previous`` (the reaper's
    previous pass): one probe of ``ix_runs_queued_age``
    (docs/design.md#priorities-and-reservations)."""
    waited = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, seconds)
    q = exists().where(IS_QUEUED, Run.created_at <= waited)
    if previous is not None:
        q = q.where(Run.created_at > previous - func.make_interval(0, 0, 0, 0, 0, 0, seconds))
    return bool(s.execute(select(q)).scalar())
