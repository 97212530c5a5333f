"""Retention (docs/retention.md#retention-pruning-old-runs): finished runs older than
``retention.days`` (the reaper) or a given time (``mediator server prune --before``) are deleted
with every row that refers to them and their Record.

A batch of at most ``batch_size`` runs is one short transaction (``app.store.retention``); a reaper
pass runs at most ``PASS_BATCHES`` of them and leaves the rest for the next pass, so a long history
is worked off in steps whose cost does not grow with it.

**Rows first, then the Record.** A batch commits the deletion of its rows and its tombstones, then
deletes the Records. A process that dies between the two leaves Records no run refers to, and
their tombstones still say ``record_pending``: the next pass (or prune) deletes them first
(:func:`sweep_records`). The other order would leave, after such a crash, a sealed run whose
Record is gone: a 500 or a broken tar for whoever reads it, until someone pruned it again. A
Record without rows is unreachable (every route answers 404 for a run without a row), so it harms
no one while it waits for the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select

from app.context import Context
from app.faults import fault
from app.logs import log
from app.metrics import PRUNED_RUNS
from app.records import location_of
from app.services.tx import retrying
from app.store import retention as retention_store
from app.wire import ts

BATCH_RUNS = 100  # runs per transaction
PASS_BATCHES = 10  # transactions per reaper pass, at most
SWEEP_RECORDS = 1000  # Records of an earlier crash deleted per pass, at most
_PAGE = 1000  # runs read per statement by a dry run


@dataclass
class PruneReport:
    """What a prune removed (or, in a dry run, would remove). ``batches`` holds the number of runs
    of each transaction; ``more`` says the pass stopped at its bound with runs left to prune."""

    before: datetime
    dry_run: bool = False
    runs: int = 0
    steps: int = 0
    events: int = 0
    blobs: int = 0
    leases: int = 0
    records: int = 0
    swept: int = 0  # Records of runs pruned earlier, left behind by a crash
    batches: list[int] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    more: bool = False

    def add(self, d: retention_store.Deleted) -> None:
        self.runs += len(d.run_ids)
        self.steps += d.steps
        self.events += d.events
        self.blobs += d.blobs
        self.leases += d.leases
        self.run_ids += d.run_ids
        self.batches.append(len(d.run_ids))


@retrying
def _prune_batch(ctx: Context, before: datetime, batch_size: int) -> retention_store.Deleted:
    with ctx.db.begin() as s:
        ids = retention_store.lock_prunable(s, before, batch_size)
        deleted = retention_store.delete_runs(s, ids)
        fault("prune.before_commit")
    return deleted


def _delete_records(ctx: Context, runs: list[tuple[str, str | None]]) -> int:
    """Delete the Records of pruned runs, each (run_id, the location its row kept); a tombstone is
    cleared only for a Record whose deletion went through, so one that failed is tried again by
    the next sweep. Returns how many of them there were (a rejected submit has none)."""
    found = 0
    done = []
    for run_id, stored in runs:
        try:
            found += int(ctx.records.delete(location_of(run_id, stored)))
            done.append(run_id)
        except Exception:
            log.exception(
                "retention: deleting a Record failed; the next pass retries", run_id=run_id
            )
    with ctx.db.begin() as s:
        retention_store.records_deleted(s, done)
    return found


def sweep_records(ctx: Context, limit: int = SWEEP_RECORDS) -> int:
    """Delete the Records a crash left after their rows were pruned (tombstones still
    ``record_pending``). Returns how many were found."""
    with ctx.db.read() as s:
        pending = retention_store.pending_records(s, limit)
    return _delete_records(ctx, pending) if pending else 0


def prune(
    ctx: Context,
    before: datetime,
    *,
    dry_run: bool = False,
    batch_size: int = BATCH_RUNS,
    max_batches: int | None = None,
) -> PruneReport:
    """Prune the finished runs that ended before ``before``: sealed ones and rejected submits.
    ``max_batches`` bounds the transactions (None: until none is left). A dry run reads what
    would go, without locks, and changes nothing. Returns the counts and the run ids; the number of
    runs pruned is ``report.runs`` (what a metric of pruned runs counts)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    report = PruneReport(before=before, dry_run=dry_run)
    if dry_run:
        _dry_run(ctx, report)
    else:
        report.swept = sweep_records(ctx)
        while max_batches is None or len(report.batches) < max_batches:
            deleted = _prune_batch(ctx, before, batch_size)
            if not deleted.run_ids:
                break
            report.add(deleted)
            PRUNED_RUNS.inc(len(deleted.run_ids))
            fault("prune.after_commit")
            pruned = [(run_id, deleted.locations.get(run_id)) for run_id in deleted.run_ids]
            report.records += _delete_records(ctx, pruned)
            if len(deleted.run_ids) < batch_size:
                break
        else:
            report.more = bool(report.batches) and report.batches[-1] == batch_size
    if report.runs or report.swept or dry_run:
        log.info(
            "retention: would prune" if dry_run else "retention: pruned",
            before=ts(before),
            runs=report.runs,
            steps=report.steps,
            events=report.events,
            blobs=report.blobs,
            leases=report.leases,
            records=report.records,
            swept=report.swept,
            batches=len(report.batches),
            more=report.more,
        )
    return report


def _dry_run(ctx: Context, report: PruneReport) -> None:
    after: tuple[datetime, str] | None = None
    with ctx.db.read(snapshot=True) as s:
        while True:
            page = retention_store.prunable_page(s, report.before, after, _PAGE)
            if not page:
                break
            ids = [run_id for run_id, _, _ in page]
            counted = retention_store.count_rows(s, ids)
            report.add(counted)
            report.records += sum(1 for _, _, sealed in page if sealed)
            last = page[-1]
            after = (last[1], last[0])
    report.batches = []  # nothing was deleted: no transaction to tell of


def retention_cutoff(ctx: Context, days: int) -> datetime:
    """``now() - days`` on the database clock (the only clock:
    docs/design.md#shape-of-the-service)."""
    with ctx.db.read() as s:
        return s.execute(select(func.now() - timedelta(days=days))).scalar_one()


def prune_expired(
    ctx: Context, *, batch_size: int = BATCH_RUNS, max_batches: int = PASS_BATCHES
) -> PruneReport | None:
    """The reaper's retention step: with ``retention.days`` set, prune what ended longer ago, at
    most ``max_batches`` transactions a pass; off (0), only sweep Records left by a crash of an
    earlier ``mediator server prune``. Returns the report, or None when retention is off."""
    days = ctx.config["retention.days"]
    if not days:
        swept = sweep_records(ctx)
        if swept:
            log.info("retention: swept Records of pruned runs", swept=swept)
        return None
    return prune(ctx, retention_cutoff(ctx, days), batch_size=batch_size, max_batches=max_batches)
