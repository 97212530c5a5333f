"""What retention deletes (docs/retention.md#what-is-pruned-and-what-is-kept): finished runs old
enough, in batches by primary key.

A batch locks the runs it deletes with ``FOR UPDATE SKIP LOCKED``: a run some request holds is left
for a later batch, and no request waits on anything a batch locks but the rows of those runs, which
are finished and sealed (or rejected) and so are never written again; the run's steps, events,
blobs and leases are only ever locked after the run row (docs/queue.md#lock-order). Children go
first by explicit statements (their foreign keys also cascade, which covers any table that refers to
runs with ``ON DELETE CASCADE``), then the runs, and each id leaves a tombstone in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    delete,
    func,
    literal_column,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.models import PRUNABLE_RUNS, Blob, Lease, Run, RunEvent, RunTombstone, Step
from app.states import RUN_FINISHED
from app.store import rowcount

# The index's predicate word for word (``ix_runs_prunable``), and the finished states as constants.
_PRUNABLE = text(f"({PRUNABLE_RUNS})")  # parenthesised: it is an OR, ANDed with the rest
_FINISHED = Run.state.in_([literal_column(f"'{state}'") for state in RUN_FINISHED])


@dataclass
class Deleted:
    """Rows one batch deleted, by table; ``locations``: each deleted run's Record location as its
    row kept it (None for a run created before locations were kept: the old rule's)."""

    run_ids: list[str]
    locations: dict[str, str | None] = field(default_factory=dict)
    steps: int = 0
    events: int = 0
    blobs: int = 0
    leases: int = 0


def prunable_query(before: datetime | ColumnElement[Any], limit: int) -> Select[Any]:
    """The statement of :func:`lock_prunable` (its predicate is ``ix_runs_prunable``'s)."""
    return (
        select(Run.run_id)
        .where(_PRUNABLE, _FINISHED, Run.ended_at < before)
        # run_id after the time, as the dry run's pages: runs that ended together go in one order
        .order_by(Run.ended_at, Run.run_id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


def lock_prunable(s: Session, before: datetime | ColumnElement[Any], limit: int) -> list[str]:
    """Up to ``limit`` ids of runs that ended before ``before`` and are sealed, or are rejected
    submits (born FAILED with ``ended_at`` = ``created_at``, never sealed: they have no Record),
    oldest first, each locked ``FOR UPDATE SKIP LOCKED``. Runs whose Record is not sealed yet (the
    reaper still owes the seal) and unfinished runs are never among them."""
    return list(s.scalars(prunable_query(before, limit)))


def delete_runs(s: Session, run_ids: Sequence[str]) -> Deleted:
    """Delete the runs (locked by :func:`lock_prunable`) with every row that refers to them, and
    write their tombstones (the Record is still to be deleted: ``record_pending``)."""
    out = Deleted(list(run_ids))
    if not run_ids:
        return out
    ids = list(run_ids)
    out.events = rowcount(s.execute(delete(RunEvent).where(RunEvent.run_id.in_(ids))))
    out.steps = rowcount(s.execute(delete(Step).where(Step.run_id.in_(ids))))
    out.blobs = rowcount(s.execute(delete(Blob).where(Blob.run_id.in_(ids))))
    out.leases = rowcount(s.execute(delete(Lease).where(Lease.run_id.in_(ids))))
    gone = s.execute(
        delete(Run).where(Run.run_id.in_(ids)).returning(Run.run_id, Run.record_location)
    ).all()
    out.locations = {run_id: location for run_id, location in gone}
    s.execute(
        pg_insert(RunTombstone)
        .values([{"run_id": r, "record_location": out.locations.get(r)} for r in ids])
        .on_conflict_do_nothing(index_elements=[RunTombstone.run_id])
    )
    return out


def prunable_page(
    s: Session,
    before: datetime | ColumnElement[Any],
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[tuple[str, datetime, bool]]:
    """What :func:`lock_prunable` would take, read without locks, a page at a time in
    (ended_at, run_id) order after the cursor ``after``: for ``--dry-run``. Each is (run_id,
    ended_at, sealed)."""
    q = (
        select(Run.run_id, Run.ended_at, Run.sealed_at.is_not(None).label("sealed"))
        .where(_PRUNABLE, _FINISHED, Run.ended_at < before)
        .order_by(Run.ended_at, Run.run_id)
        .limit(limit)
    )
    if after is not None:
        q = q.where(tuple_(Run.ended_at, Run.run_id) > tuple_(*after))
    return [(r.run_id, r.ended_at, bool(r.sealed)) for r in s.execute(q).all()]


def count_rows(s: Session, run_ids: Sequence[str]) -> Deleted:
    """The rows :func:`delete_runs` would delete for these runs, counted."""
    out = Deleted(list(run_ids))
    if not run_ids:
        return out
    ids = list(run_ids)

    def count(model: Any) -> int:
        return int(
            s.execute(
                select(func.count()).select_from(model).where(model.run_id.in_(ids))
            ).scalar_one()
        )

    out.events, out.steps = count(RunEvent), count(Step)
    out.blobs, out.leases = count(Blob), count(Lease)
    return out


def pending_records(s: Session, limit: int) -> list[tuple[str, str | None]]:
    """Tombstones whose Record may still be in the store (a crash between a batch's commit and
    the Records' deletion), oldest first: (run_id, the Record location its row kept)."""
    q = (
        select(RunTombstone.run_id, RunTombstone.record_location)
        .where(RunTombstone.record_pending)
        .order_by(RunTombstone.pruned_at)
        .limit(limit)
    )
    return [(run_id, location) for run_id, location in s.execute(q).all()]


def records_deleted(s: Session, run_ids: Sequence[str]) -> None:
    if run_ids:
        s.execute(
            update(RunTombstone)
            .where(RunTombstone.run_id.in_(list(run_ids)))
            .values(record_pending=False)
        )


def is_pruned(s: Session, run_id: str) -> bool:
    return (
        s.execute(select(RunTombstone.run_id).where(RunTombstone.run_id == run_id)).first()
        is not None
    )
