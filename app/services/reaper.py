"""The reaper (docs/queue.md#the-reaper): a pass every ``lease.renew_seconds``; safe with several
reapers (a ``pg_try_advisory_lock`` skips the pass when another holds it) and with API workers
(every change locks the run row and re-checks). It wakes the queue only when it freed something or a
wake debt is set: it never polls the queue.

The reaper's lock lives like the scan gate's (docs/queue.md, "The reaper"): on a session that
PostgreSQL drops when its host or process stops answering, looked at between the pass's rows and
from a thread during a long one; a pass that finds it gone ends after the row in hand."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import func

from app.context import Context
from app.db import database_unavailable, gate_options
from app.logs import log
from app.metrics import LEASE_EXPIRIES, REAPER_DONE, REAPER_PASSES
from app.services.after_commit import settle_and_wake
from app.services.end_run import settle_failed
from app.services.execution import Picture, settle
from app.services.health import queue_due_health_runs
from app.services.notify import AfterCommit
from app.services.operators import strike
from app.services.queue import mark_wake, wake_after_commit, wake_queued
from app.services.records import seal_run
from app.services.retention import prune_expired
from app.services.settle import complete_verdict
from app.services.teams import charge_usage
from app.services.tx import retrying
from app.states import ASKED, FAILED, QUEUED, RUN_FINISHED, RUNNING
from app.store import reaper as reaper_store
from app.store.auth import forget_old_failures
from app.store.clock import database_now, has_passed
from app.store.queue import timed_out_queued
from app.store.reaper import ReaperLock, ReaperLockLost
from app.store.reservations import queued_crossed_age
from app.store.runs import clear_wake_debt, lock_run, set_wake_debt, wake_debt_set
from app.store.steps import fail_open_steps, lock_steps, update_step
from app.store.ui_sessions import forget_expired_sessions

LEASE_EXPIRED = "lease expired: renewal stopped"
RESTARTED = "the database restarted or switched"


@dataclass
class PassReport:
    skipped: bool = False
    extended: int = 0
    asks_expired: int = 0
    lease_expired: list[str] = field(default_factory=list)
    steps_failed: int = 0
    leases_deleted: int = 0
    verdicts: int = 0
    queue_timeouts: list[str] = field(default_factory=list)
    sealed: int = 0
    woke: bool = False
    # The marks the previous pass saw were not covered by any scan since
    # (docs/design.md#wake-debt-and-what-is-owed).
    uncovered: bool = False
    # runs deleted by retention (docs/retention.md#what-is-pruned-and-what-is-kept) in this pass
    pruned: int = 0
    crossed_age: bool = False  # a QUEUED run crossed the reservation age since the last pass
    # The database restarted or switched since the previous pass: a scan is owed (a wake debt)
    # and the leases got the outage grace.
    restarted: bool = False
    lost: str | None = None  # why the pass lost the reaper's lock and ended early
    charged: float = 0.0  # node-seconds charged to the teams' usage (step 8)
    health_runs: list[str] = field(default_factory=list)  # queued in step 5
    analyzed: list[str] = field(default_factory=list)  # tables whose statistics it refreshed

    @property
    def freed(self) -> bool:
        return bool(self.asks_expired or self.lease_expired or self.leases_deleted)


@retrying
def _expire_ask(ctx: Context, run_id: str, seq: int, after: AfterCommit) -> bool:
    with ctx.db.begin() as s:
        run = lock_run(s, run_id)
        if run is None or run.state != RUNNING:
            return False
        pic = Picture(run, lock_steps(s, run_id))
        st = pic.steps.get(seq)
        if st is None or st.state != ASKED:
            return False
        if st.ask_deadline is None or not has_passed(s, st.ask_deadline):
            return False
        update_step(
            s, run_id, seq, [ASKED], state=FAILED, error="ask deadline passed", ended_at=func.now()
        )
        settle(s, pic, after)
        return True


@retrying
def _fail_expired(ctx: Context, run_id: str, after: AfterCommit) -> bool:
    with ctx.db.begin() as s:
        run = lock_run(s, run_id)
        if (
            run is None
            or run.state != RUNNING
            or not reaper_store.runs_with_expired_leases(s, run_id)
        ):
            return False  # renewed, ended or an ask was raised meanwhile
        silent = reaper_store.expired_lease_nodes(s, run_id)
        settle_failed(
            s,
            run,
            checks=[{"what": "lease", "ok": False, "note": LEASE_EXPIRED}],
            step_error=LEASE_EXPIRED,
            cause="lease expired",
            by="reaper",
            reject={"Code": 410, "Reason": LEASE_EXPIRED},
        )
        # Last in the run's transaction: each node whose silence ended it gets a strike.
        for node_id in silent:
            strike(ctx, s, node_id, f"its lease of {run_id} expired", after)
        after.settled.append(run_id)
        return True


@retrying
def _fail_open_steps(ctx: Context, run_id: str) -> int:
    with ctx.db.begin() as s:
        run = lock_run(s, run_id)
        if run is None or run.state not in RUN_FINISHED:
            return 0
        return fail_open_steps(s, run_id, f"run already {run.state}")


@retrying
def _delete_finished_leases(ctx: Context, run_id: str) -> int:
    with ctx.db.begin() as s:
        run = lock_run(s, run_id)
        if run is None or run.state not in RUN_FINISHED:
            return 0
        return reaper_store.delete_run_leases(s, run_id)


@retrying
def _queue_timeout(ctx: Context, run_id: str) -> bool:
    with ctx.db.begin() as s:
        run = lock_run(s, run_id)
        if run is None or run.state != QUEUED or not timed_out_queued(s, run_id):
            return False
        # Locked and re-read as QUEUED: the guarded end cannot miss.
        settle_failed(
            s,
            run,
            checks=[{"what": "queue", "ok": False, "note": "queue timeout"}],
            step_error="queue timeout",
            cause="queue timeout",
            by="reaper",
        )
        return True


def _rows(lock: ReaperLock, items: list[Any]) -> Iterator[Any]:
    """The candidates of a step, one at a time, each only while the pass still holds the
    reaper's lock: the row in hand is finished, the next one is left to the reaper that holds
    the lock now (raises :class:`ReaperLockLost`)."""
    for item in items:
        lock.check()
        yield item


def _isolated(handle: Callable[[Any], Any], item: Any, what: str) -> int:
    """One candidate in its own transaction: one failing run never stops the pass. Returns what
    the handler counted (True counts 1)."""
    try:
        return int(handle(item) or 0)
    except Exception:
        log.exception(f"reaper: {what} failed", item=str(item))
        return 0


def reap_pass(ctx: Context, *, previous_failed: bool = False) -> PassReport:
    """One pass, in the order of docs/queue.md#the-reaper, while this process holds the reaper's
    lock."""
    report = PassReport()
    idle = ctx.config["gate.idle_seconds"]
    try:
        lock = ReaperLock(
            ctx.db.dedicated_connection(options=gate_options(idle), name="mediator-reaper"), idle
        )
        try:
            if not lock.take():
                report.skipped = True
                REAPER_PASSES.labels("skipped").inc()
                return report
            with lock.kept():
                _pass(ctx, report, previous_failed, lock)
        finally:
            lock.close()
    except Exception:
        REAPER_PASSES.labels("failed").inc()
        count_pass(report)  # what the pass did before it failed stays done
        raise
    REAPER_PASSES.labels("lost" if report.lost else "done").inc()
    count_pass(report)
    return report


def count_pass(report: PassReport) -> None:
    """What a pass did, for ``mediator_reaper_actions_total`` and lease expiries."""
    done = {
        "leases_extended": report.extended,
        "asks_expired": report.asks_expired,
        "lease_expired": len(report.lease_expired),
        "steps_failed": report.steps_failed,
        "leases_deleted": report.leases_deleted,
        "verdicts": report.verdicts,
        "queue_timeouts": len(report.queue_timeouts),
        "sealed": report.sealed,
        "pruned": report.pruned,
    }
    for action, n in done.items():
        if n:
            REAPER_DONE.labels(action).inc(n)
    if report.lease_expired:
        LEASE_EXPIRIES.inc(len(report.lease_expired))


def _crossed_age(ctx: Context, s: Any, previous: Any) -> bool:
    """A QUEUED run crossed ``queue.reserve_after_seconds`` since the previous pass: time passing
    is not an event, so this pass scans once to write its reservation
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits,
    docs/queue.md#the-reaper)."""
    seconds = ctx.config["queue.reserve_after_seconds"]
    return seconds > 0 and queued_crossed_age(s, seconds, previous)


def _pass(ctx: Context, report: PassReport, previous_failed: bool, lock: ReaperLock) -> None:
    """The steps of docs/queue.md#the-reaper, in its order; each step's runs in their own
    transactions, each looked at only while the pass holds the reaper's lock (between steps too). A
    pass that finds the lock gone finishes the row in hand and ends: it writes nothing more (its
    ``reaper_state`` row was written at its start), and what its rows freed is still marked,
    announced and woken for, through the ordinary gate."""
    after = AfterCommit()
    causes: list[str] | None = None  # set once step 6 has marked and announced
    paying = False  # steps 6 and 7 began: their wake is this pass's own
    try:
        lock.check()
        _begin_pass(ctx, report)
        _expire_asks(ctx, report, after, lock)  # 1
        _expire_leases(ctx, report, after, lock)  # 2
        _fail_steps_of_finished_runs(ctx, report, lock)  # 3
        _delete_leases_of_finished_runs(ctx, report, lock)  # 4
        _settle_verifying_and_time_out_queued(ctx, report, after, lock)  # 5
        causes = _mark_and_settle(ctx, report, after)  # 6 marks now; its wake is below
        _seal_finished_runs(ctx, report, lock)  # 5, last part: after the ends above are announced
        lock.check()
        paying = True
        _wake_or_pay(ctx, report, causes, previous_failed)  # 6 and 7
        lock.check()
        _charge_usage(ctx, report, lock)  # 8
        lock.check()
        _prune(ctx, report)
        _refresh_statistics(ctx, report)
    except ReaperLockLost as exc:
        report.lost = str(exc)
        log.warning("reaper: the reaper's lock is gone; the pass ends", reason=report.lost)
        if causes is None:
            causes = _mark_and_settle(ctx, report, after)
        if (report.freed or causes) and not paying:
            # What this pass freed is woken for as at any wake point; what is owed is left to
            # the reaper that holds the lock now.
            wake_after_commit(ctx, "reaper: freed nodes", marked=True)
    _log_pass(report)


def _begin_pass(ctx: Context, report: PassReport) -> None:
    """Read what the previous pass left (its time, its wake marks, the database's start time)
    and record this one; forget stale 429 counts and page sessions; note a run crossing the
    reservation age; after an outage longer than a lease window, or when the database restarted
    or switched since the previous pass, give every lease a full window before anything is
    reaped (docs/queue.md, "Crashes and restarts"). One transaction, its locks in the global
    order: leases, then the singletons ``wake_debt`` and ``reaper_state``."""
    window = timedelta(seconds=ctx.lease_window_seconds)
    with ctx.db.begin() as s:
        start = reaper_store.read_pass_start(s)
        now, previous = start.now, start.previous
        report.uncovered = start.previous_mark is not None and start.previous_mark > start.covered
        forget_old_failures(s)  # the 429 counts of addresses whose minute is long over
        # the pages' sessions past their expiry (docs/pages.md#signing-in)
        forget_expired_sessions(s)
        report.crossed_age = _crossed_age(ctx, s, previous)
        report.restarted = start.restarted
        outage = previous is not None and now - previous > window
        lost = ctx.reaper_lost_database
        if outage or start.restarted or lost:
            # The Mediator or its database was down, or its previous pass could not use the
            # database (a switch shorter than a lease window still cost renewals): no node could
            # renew (and after a switch now() is another host's clock). Give every lease a full
            # window first.
            report.extended = reaper_store.extend_leases(s, window)
            log.warning(
                "reaper: outage grace",
                gap_s=round((now - previous).total_seconds()) if previous is not None else None,
                restarted=start.restarted,
                after_a_failed_pass=lost,
                leases=report.extended,
            )
        if start.restarted:
            # The restart or switch may have swallowed a wake mark or a wake debt: a scan is
            # owed, written as a debt in the transaction that stores the new start time, so a
            # pass that ends before its scan leaves it to the next one.
            set_wake_debt(s, RESTARTED)
        reaper_store.record_pass(s)
    ctx.reaper_lost_database = False  # the grace is committed


def _expire_asks(ctx: Context, report: PassReport, after: AfterCommit, lock: ReaperLock) -> None:
    """Step 1: asks past their deadline fail (``ask deadline passed``) and their runs settle."""
    with ctx.db.read() as s:
        asks = reaper_store.expired_asks(s)
    for ask in _rows(lock, asks):
        report.asks_expired += _isolated(
            lambda a: _expire_ask(ctx, a[0], a[1], after), ask, "ask expiry"
        )


def _expire_leases(ctx: Context, report: PassReport, after: AfterCommit, lock: ReaperLock) -> None:
    """Step 2: runs whose lease's ``not_after`` passed, with no ASKED step, become FAILED (410)."""
    with ctx.db.read() as s:
        expired = reaper_store.runs_with_expired_leases(s)
    for run_id in _rows(lock, expired):
        if _isolated(lambda r: _fail_expired(ctx, r, after), run_id, "lease expiry"):
            report.lease_expired.append(run_id)


def _fail_steps_of_finished_runs(ctx: Context, report: PassReport, lock: ReaperLock) -> None:
    """Step 3: open steps of finished runs become FAILED."""
    with ctx.db.read() as s:
        open_runs = reaper_store.open_steps_of_finished_runs(s)
    for run_id in _rows(lock, open_runs):
        report.steps_failed += _isolated(lambda r: _fail_open_steps(ctx, r), run_id, "open steps")


def _delete_leases_of_finished_runs(ctx: Context, report: PassReport, lock: ReaperLock) -> None:
    """Step 4: leases of finished runs go (runs that ended while the Mediator was down)."""
    with ctx.db.read() as s:
        leased = reaper_store.leases_of_finished_runs(s)
    for run_id in _rows(lock, leased):
        report.leases_deleted += _isolated(
            lambda r: _delete_finished_leases(ctx, r), run_id, "lease cleanup"
        )


def _settle_verifying_and_time_out_queued(
    ctx: Context, report: PassReport, after: AfterCommit, lock: ReaperLock
) -> None:
    """Step 5: runs left in VERIFYING get their verdict; QUEUED runs past their ``queue.timeout``
    fail (``queue timeout``), and their reservations go with them, so the queue is woken."""
    with ctx.db.read() as s:
        verifying = reaper_store.verifying_runs(s)
        timed_out = timed_out_queued(s)
    for run_id in _rows(lock, verifying):
        report.verdicts += _isolated(
            lambda r: complete_verdict(ctx, r, after) is not None, run_id, "verdict"
        )
    try:
        for run_id in _rows(lock, timed_out):
            if _isolated(lambda r: _queue_timeout(ctx, r), run_id, "queue timeout"):
                report.queue_timeouts.append(run_id)
    finally:
        # Also when the pass ends early: the runs timed out so far are announced and woken for.
        after.settled += report.queue_timeouts
        if report.queue_timeouts:
            # A timed-out run's reservations went with it: the wake hands those nodes on
            # (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits).
            after.wake("queue timeout of " + ", ".join(report.queue_timeouts))
    # Health runs due (docs/operators.md, "Health runs"): each queued run is woken for.
    try:
        report.health_runs = queue_due_health_runs(ctx, lock.check)
    except ReaperLockLost:
        raise
    except Exception:
        log.exception("reaper: health runs could not be queued")
    if report.health_runs:
        after.wake("health run queued: " + ", ".join(report.health_runs))


def _mark_and_settle(ctx: Context, report: PassReport, after: AfterCommit) -> list[str]:
    """Mark the wake right after the freeing commits when steps 1, 2, 4 or 5 changed anything,
    then settle and announce the runs that ended; returns the wake causes, those of the verdicts
    the settle computed included (a run whose ask expired in step 1 ends there, and its verdict
    takes its own mark after its commit)."""
    # Step 6 wakes once, in _wake_or_pay; ``settle_and_wake`` must not wake a second time.
    if report.freed or after.wake_causes:
        mark_wake(ctx)  # docs/queue.md: right after the freeing commits, before anything can fail
    settle_and_wake(ctx, after, wake=False)
    return list(after.wake_causes)


def _seal_finished_runs(ctx: Context, report: PassReport, lock: ReaperLock) -> None:
    """Step 5, last part: seal the Records of finished runs that are not sealed yet."""
    with ctx.db.read() as s:
        unsealed = reaper_store.unsealed_finished_runs(s)
    for run_id in _rows(lock, unsealed):
        if seal_run(ctx, run_id):
            report.sealed += 1


def _wake_or_pay(
    ctx: Context, report: PassReport, causes: list[str], previous_failed: bool
) -> None:
    """Steps 6 and 7: wake the queue once when the pass freed something or a run crossed the
    reservation age, and pay what is owed (a wake debt, uncovered marks, a failed pass) with a
    scan that takes the scanning lock directly."""
    with ctx.db.read() as s:
        debt = wake_debt_set(s)
        started = database_now(s)
    # A mark this process could not take earlier (app/services/marks.py) is taken now and
    # paid by this pass's scan.
    paying = ctx.owed.is_set() and mark_wake(ctx)
    owed = bool(debt or previous_failed or report.uncovered or paying)
    if not (report.freed or causes or owed or report.crossed_age):
        return
    if report.freed or causes:
        why = "reaper: freed nodes"
    elif report.restarted:
        why = f"reaper: {RESTARTED}"
    elif report.uncovered:
        why = "reaper: uncovered wake marks"
    else:
        why = "reaper: " + ("wake debt" if owed else "reservation age")
    # Paying what is owed takes the scanning lock directly: the waiter the skipped wakes
    # counted on may never scan (docs/design.md#wake-debt-and-what-is-owed). A scan that raises
    # leaves its debt.
    scan = wake_queued(ctx, why, direct=owed)
    report.woke = not scan.skipped
    if scan.skipped:
        log.warning("reaper: the scanning lock was not free in time; next pass", why=why)
        # What this scan was for (the reservation age, no freeing commit; a debt or a failed
        # pass that the next pass would not see again) becomes a mark now: uncovered, the next
        # pass pays it with its direct turn.
        mark_wake(ctx)
    elif debt:
        # The scan ran to its end: the debt it paid goes. What the scan itself still owes (a
        # queue that changed under it, a promotion that raised for the first time) it set
        # again after ``started``, and that stays for the next pass.
        with ctx.db.begin() as s:
            clear_wake_debt(s, set_before=started)


def _charge_usage(ctx: Context, report: PassReport, lock: ReaperLock) -> None:
    """Step 8: the teams' usage (docs/teams.md, "Fair share"). It frees nothing, and a failure
    of it fails no other work of the pass: what it did not charge, the next pass charges."""
    try:
        report.charged = charge_usage(ctx, lock.check)
    except ReaperLockLost:
        raise
    except Exception:
        log.exception("reaper: the teams' usage could not be charged")


def _prune(ctx: Context, report: PassReport) -> None:
    """Retention last: it frees nothing a queued run waits for, and a failure of it fails no other
    work of the pass (the next pass tries again)."""
    try:
        pruned = prune_expired(ctx)
        report.pruned = pruned.runs if pruned is not None else 0
    except Exception:
        log.exception("reaper: retention failed")


# A table is analysed by the pass once this many rows, and this fraction of its live rows, changed
# since its last ANALYZE (autovacuum's own rule is 50 rows and 10 %, looked at once a minute).
STALE_ROWS = 1000
STALE_FRACTION = 0.2


def _refresh_statistics(ctx: Context, report: PassReport) -> None:
    """After a bulk change, the planner's statistics of the tables requests read are refreshed
    by the next pass rather than by autovacuum's next look (docs/design.md#targets): one small
    read of ``pg_stat_user_tables``, and an ``ANALYZE`` of a table only when it changed that much.
    A failure of it fails no other work of the pass."""
    try:
        with ctx.db.autocommit() as conn:
            stale = reaper_store.stale_statistics(conn, least=STALE_ROWS, fraction=STALE_FRACTION)
            for table in stale:
                reaper_store.analyze(conn, table)
                report.analyzed.append(table)
    except Exception:
        log.exception("reaper: the statistics could not be refreshed")


def _log_pass(report: PassReport) -> None:
    """The one ``reaper pass`` line: what the pass did."""
    log.info(
        "reaper pass",
        extended=report.extended,
        asks_expired=report.asks_expired,
        lease_expired=len(report.lease_expired),
        steps_failed=report.steps_failed,
        leases_deleted=report.leases_deleted,
        verdicts=report.verdicts,
        queue_timeouts=len(report.queue_timeouts),
        sealed=report.sealed,
        woke=report.woke,
        pruned=report.pruned,
        charged=round(report.charged, 1),
        health_runs=len(report.health_runs),
        analyzed=report.analyzed,
        restarted=report.restarted,
        lost=report.lost,
    )


def reap_once(ctx: Context, *, previous_failed: bool) -> bool:
    """One turn of the reaper's loop; returns whether a debt is still owed by this reaper (its
    pass failed, or one was owed and its scan did not run: the pass was skipped, lost the
    reaper's lock before it, or the scanning lock did not come in time; a pass that could not
    take the reaper's lock does not forget the debt it saw,
    docs/design.md#wake-debt-and-what-is-owed)."""
    try:
        report = reap_pass(ctx, previous_failed=previous_failed)
    except Exception as exc:
        log.exception("reaper pass failed")
        ctx.reaper_lost_database = ctx.reaper_lost_database or database_unavailable(exc)
        return True
    return previous_failed and not report.woke


def run_reaper(ctx: Context, stop: threading.Event) -> None:
    """``mediator server reaper`` and the development server's thread: a pass every
    renew_seconds."""
    period = ctx.config["lease.renew_seconds"]
    failed = False
    while not stop.is_set():
        started = time.monotonic()
        failed = reap_once(ctx, previous_failed=failed)
        stop.wait(max(0.0, period - (time.monotonic() - started)))
