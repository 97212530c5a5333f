"""The queue (docs/design.md#the-queue): wake scans and promotion. No timer anywhere: every scan is
asked for by the request (or reaper pass) that freed something, after its commit."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import NamedTuple

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.context import Context
from app.contract.types import Role, role_from_wire
from app.errors import ConfigError
from app.faults import fault
from app.logs import log
from app.match import (
    Advert,
    Reject,
    candidate_order,
    match_pinned,
    match_within_cap,
    width_exceeded,
)
from app.metrics import (
    QUEUE_WAIT,
    WAKE_FAILED,
    WAKE_PROMOTED,
    WAKE_SCANS,
    WAKE_SECONDS,
    WAKE_SKIPPED,
    cause_label,
)
from app.reserve import reserved_against, reserved_by
from app.services.execution import start_steps
from app.services.marks import mark_wake
from app.services.notify import AfterCommit, notify_claimable
from app.services.placement import assigned_json, grants, node_for_role
from app.services.reservations import Reservations, read_inputs, reserve
from app.services.settle import settle_committed
from app.services.tx import retrying
from app.states import QUEUED, RUNNING
from app.store import NodeTaken, NotQueued
from app.store.gate import GateLost, cover_if_queue_empty, cover_marks, last_mark
from app.store.leases import insert_leases
from app.store.nodes import candidate_adverts, containment_key, unavailable_node_ids
from app.store.queue import (
    QueuedRun,
    next_queued_of_shape,
    queued_shape_heads,
    queued_shape_team_heads,
    set_statement_timeout,
)
from app.store.reservations import (
    QUEUED_COUNTED,
    place_unreserved,
    release_reservations,
    scan_probe,
)
from app.store.runs import add_event, promote_run, set_wake_debt
from app.store.steps import bind_steps
from app.store.teams import OverQuota, stored_standing, take_quota
from app.teams import Standing, least_width


class Outcome(Enum):
    PROMOTED = "promoted"
    NO_FIT = "no fit"
    WIDTH_CAP = "width cap"
    QUOTA = "team at its quota"
    NOT_QUEUED = "not queued"
    NODE_TAKEN = "node taken"


class Promotion(NamedTuple):
    """What one promotion did: its outcome, the nodes it took, the nodes whose claims may now find
    a step (notified once by the scan) and the nodes its own settle freed again (a run that ended
    inside its promotion)."""

    outcome: Outcome
    nodes: list[str]
    claim_nodes: set[str]
    freed: set[str]


@dataclass
class ScanReport:
    cause: str
    skipped: bool = False  # the gate said another scan is waiting and will start after us
    queued: int = 0  # QUEUED runs when the scan began, counted up to QUEUED_COUNTED + 1
    shapes: int = 0
    looked: int = 0
    promoted: list[str] = field(default_factory=list)
    claim_nodes: set[str] = field(default_factory=set)  # to notify once, after the scan
    errors: int = 0
    # The runs whose promotion raised of itself (not a database error: the same again at the
    # next try), and how many promotions met a database error (a time-out, a lost connection).
    failed: list[str] = field(default_factory=list)
    database_errors: int = 0
    seconds: float = 0.0
    # A promotion of this pass freed nodes again (a run that ended inside its promotion) or a run
    # met a taken node twice: the queue must be looked at again with a fresh snapshot.
    again: bool = False
    passes: int = 0


# A scan looks again while its last pass freed nodes or met a node taken twice; each pass
# promotes or gives up on at least one run, and past this bound the reaper's wake takes over.
MAX_PASSES = 8


@retrying
def promote(
    ctx: Context,
    run: QueuedRun,
    adverts: list[Advert],
    unavailable: set[str],
    cause: str,
    *,
    reserved: Sequence[str] = (),
    check: Callable[[], None] = lambda: None,
    room: int | None = None,
    quarantined_only: Collection[str] = (),
) -> Promotion:
    """One transaction for one run, then what its commit left settled (:class:`Promotion`).
    ``unavailable`` includes the nodes reserved against this run; ``reserved`` are its own
    reservations, deleted in the same transaction
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits). ``check``: the scan's
    check of its gate (:meth:`app.store.gate.ScanGate.check`), made before the transaction and again
    before its commit: a promotion whose statements waited longer than ``gate.idle_seconds`` (a row
    lock, a slow disk, retries) may have lost the scanning lock meanwhile, and then rolls back and
    stops the scan (:class:`GateLost`) instead of committing outside its turn. ``room``: the nodes
    the run's team may still take as the scan counts them (None: no quota); a team with
    ``max_nodes`` is counted again under its ``team_limits`` row after the run row, and over quota
    the promotion rolls back (:attr:`Outcome.QUOTA`, docs/teams.md, "Quotas").

    Safe under concurrency by the row condition and the lease key alone: the conditional UPDATE
    locks the run row first (a cancel, a result or another scan serialises behind it), and a node
    taken meanwhile fails on ``pk_leases`` and rolls everything back (docs/design.md#promotion)."""
    roles = [role_from_wire(r) for r in run.requires]
    if run.pinned_node is not None:
        # A health run: its first role is its node's, whatever that node's quarantine.
        assignment = match_pinned(
            roles,
            adverts,
            unavailable,
            run.pinned_node,
            pinned_free=run.pinned_node in quarantined_only,
        )
    else:
        assignment = match_within_cap(
            roles, adverts, unavailable, ctx.config["lease.max_per_run"], ordered=True
        )
    if isinstance(assignment, Reject):
        return Promotion(Outcome.NO_FIT, [], set(), set())
    over = width_exceeded(assignment, ctx.config["lease.max_per_run"])
    if over:
        # Not permanent at promotion: another choice of nodes may fold the count
        # (docs/design.md#promotion).
        log.info("queued run over the width cap", run_id=run.run_id, reason=over)
        return Promotion(Outcome.WIDTH_CAP, [], set(), set())
    taken = grants(assignment, roles)
    quota = ctx.teams.quota(run.team)
    if room is not None and len(taken) > room:
        return Promotion(Outcome.QUOTA, [], set(), set())
    after = AfterCommit()
    check()
    try:
        with ctx.db.begin() as s:
            set_statement_timeout(s, ctx.config["database.statement_timeout_seconds"])
            waited = promote_run(s, run.run_id, assigned_json(assignment))
            if quota is not None:
                take_quota(s, quota.team, quota.apart, len(taken), quota.max_nodes)
            if ctx.config["queue.reserve_after_seconds"] > 0:
                # A reservation written since the scan's read is honoured
                # (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits).
                place_unreserved(s, run.run_id, run.priority, [g.node_id for g in taken])
            insert_leases(s, run.run_id, taken, ctx.config["lease.ttl_seconds"], run.team)
            if reserved:
                release_reservations(s, run.run_id)
            bind_steps(s, run.run_id, node_for_role(assignment))
            add_event(s, run.run_id, QUEUED, RUNNING, f"promoted: {cause}", None)
            start_steps(s, ctx, run.run_id, after)
            check()
            fault("promote.before_commit")
    except NotQueued:
        return Promotion(Outcome.NOT_QUEUED, [], set(), set())
    except NodeTaken:
        return Promotion(Outcome.NODE_TAKEN, [], set(), set())
    except OverQuota:
        return Promotion(Outcome.QUOTA, [], set(), set())
    QUEUE_WAIT.observe(waited)
    # Inside a scan: never wake from here (the gate is held by this very scan), and leave the
    # claim notification to the scan; the rest (verdicts, ask webhooks, seals) happens now.
    after.claim_nodes |= {g.node_id for g in taken}
    freed = settle_committed(ctx, after)
    return Promotion(Outcome.PROMOTED, [g.node_id for g in taken], after.claim_nodes, freed)


def _roles_of(runs: list[QueuedRun]) -> list[Role]:
    """The roles the runs ask for. A run whose stored requirements do not decode is left to fail
    on its own in :func:`promote` (failure isolation), not to stop the read."""
    roles: list[Role] = []
    for run in runs:
        try:
            roles.extend(role_from_wire(r) for r in run.requires)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return roles


def _cover(
    ctx: Context, run: QueuedRun, adverts: list[Advert], unavailable: set[str], covered: set[str]
) -> list[Advert]:
    """The scan's candidates, with those of ``run``'s roles added when the read at the start of
    the pass did not cover them (a run behind a head whose stored requirements did not decode);
    ``unavailable`` and ``covered`` grow in place."""
    missing = [r for r in _roles_of([run]) if containment_key(r) not in covered]
    if not missing:
        return adverts
    with ctx.db.begin() as s:
        found = candidate_adverts(s, missing)
    covered.update(containment_key(r) for r in missing)
    unavailable |= found.unavailable
    known = {a.node_id for a in adverts}
    return candidate_order([*adverts, *(a for a in found.adverts if a.node_id not in known)])


class ScanOrder:
    """The order of a scan's ordinary pass (docs/priorities.md#priority, docs/teams.md "Fair
    share"): priority descending, then, when teams are configured, the team's factor (highest first:
    the team furthest below its share), then age. ``standing`` is read once per scan and raised by
    hand as the scan places, so a team that takes nodes drops in the order within the scan; a key
    computed before that is stale, and is computed again when it comes to the top (factors only
    fall during a scan, so a stale key is never later than its run's true place).

    Without teams (``standing`` None) the order is the queue's order, and nothing is read."""

    def __init__(
        self, ctx: Context, standing: Standing | None, quarantined_only: set[str] | None = None
    ) -> None:
        self.teams = ctx.teams
        self.standing = standing
        # Candidates unavailable for their quarantine alone: a health run's pinned node may be
        # one (docs/operators.md, "Health runs").
        self.quarantined_only = quarantined_only or set()

    def key(self, run: QueuedRun) -> tuple[int, float, datetime, str]:
        rank = self.standing.rank(run.team) if self.standing is not None else 0.0
        return (-run.priority, rank, run.created_at, run.run_id)

    def team(self, run: QueuedRun) -> str:
        """The team whose quota and share the run counts under."""
        return self.teams.counted_as(run.team)

    def room(self, run: QueuedRun) -> int | None:
        """The nodes the run's team may still take, as this scan counts them (None: no quota)."""
        quota = self.teams.quota(run.team)
        if quota is None:
            return None
        held = self.standing.holding(run.team) if self.standing is not None else 0
        return quota.max_nodes - held

    def quota_blocked(self, run: QueuedRun) -> bool:
        """Its team holds more than ``max_nodes`` minus the run's least width (docs/teams.md,
        "Quotas"): skipped for its (shape, team), never reserving."""
        room = self.room(run)
        if room is None:
            return False
        try:
            width = least_width(role_from_wire(r).count for r in run.requires)
        except (KeyError, TypeError, ValueError, AttributeError):
            return False  # left to fail on its own in promotion (failure isolation)
        return width > room

    def placed(self, run: QueuedRun, nodes: int) -> None:
        if self.standing is not None:
            self.standing.hold(run.team, nodes)

    def at_quota(self, run: QueuedRun) -> None:
        """A promotion found the team at its quota under its row's lock: this scan counts it
        full (the count it met is at least that)."""
        quota = self.teams.quota(run.team)
        if quota is not None and self.standing is not None:
            held = self.standing.holding(run.team)
            self.standing.hold(run.team, max(quota.max_nodes - held, 0))


def _read_standing(ctx: Context, s: Session, heads: list[QueuedRun]) -> Standing | None:
    """The teams' standing for this scan (one statement), only when teams are configured."""
    if not ctx.teams.shared:
        return None
    stored = stored_standing(s, ctx.config["fairshare.half_life_seconds"])
    return Standing(
        ctx.teams,
        stored.usage,
        stored.held,
        {h.team for h in heads},
        ctx.config["fairshare.running_charge_seconds"],
    )


def _scan(ctx: Context, report: ScanReport) -> None:
    """One pass over the queue: the reservation step, then the first run of each shape (of each
    (shape, team) when teams are configured) in scan order, each until its first run that does
    not fit (docs/design.md#the-queue, docs/design.md#priorities-and-reservations; docs/teams.md,
    "Fair share")."""
    report.passes += 1
    report.again = False
    timeout = ctx.config["database.statement_timeout_seconds"]
    with ctx.db.begin() as s:
        set_statement_timeout(s, timeout)
        heads = queued_shape_team_heads(s) if ctx.teams.shared else queued_shape_heads(s)
        if not heads:
            return
        top = max(h.priority for h in heads)
        report.queued, probe = scan_probe(s, ctx.config["queue.reserve_after_seconds"], top)
        # Once per scan, not per run: a scan costs O(shapes + promoted), not 2N queries. Only the
        # adverts that can satisfy a head's roles are read (the runs behind a head have its
        # requirements), not the whole fleet.
        roles = _roles_of(heads)
        found = candidate_adverts(s, roles)
        adverts, unavailable = found.adverts, found.unavailable
        order_quarantined = found.quarantined_only
        covered = {containment_key(r) for r in roles}
        inputs = read_inputs(s, ctx.config, heads, adverts, probe)
        order = ScanOrder(ctx, _read_standing(ctx, s, heads), order_quarantined)
    report.shapes = len({h.requires_key for h in heads})
    # A quota-blocked run neither reserves nor keeps a reservation (docs/teams.md, "Quotas"); the
    # reservation step reads no team factor.
    reservations = reserve(ctx, inputs, adverts, blocked=order.quota_blocked)
    if reservations.released:
        # Nodes this scan freed from their reservations: a freeing commit like any other, so it
        # takes a mark, and a fresh pass reads the queue after it (a run queued since this
        # pass's read, whose submit saw no new mark, is looked at there;
        # docs/queue.md#on-submit-placed-queued-or-rejected).
        mark_wake(ctx)
        report.again = True
    _ordinary_pass(ctx, report, heads, adverts, unavailable, covered, reservations, order)


def _ordinary_pass(
    ctx: Context,
    report: ScanReport,
    heads: list[QueuedRun],
    adverts: list[Advert],
    unavailable: set[str],
    covered: set[str],
    reservations: Reservations,
    order: ScanOrder,
) -> None:
    """Always look at the first head in scan order next. A shape whose run does not fit is done
    for this pass (the unavailable set only grows) except for its holders of reservations, and
    never blocks the runs of other shapes behind it; a run of a team at its quota ends its
    (shape, team) for this pass, never its shape."""
    tie = itertools.count()
    heap = [(order.key(h), next(tie), h) for h in heads]
    heapq.heapify(heap)
    looked: set[str] = set()
    retried_taken: set[str] = set()
    no_fit: set[str] = set()  # shapes done for this pass
    held = reservations.held
    teams = ctx.teams.shared
    while heap:
        # a scan whose session lost the scanning lock stops
        # (docs/design.md#the-scan-gate-and-wake-marks)
        ctx.gate.check()
        key, _, run = heapq.heappop(heap)
        now_key = order.key(run)
        if now_key != key:
            heapq.heappush(heap, (now_key, next(tie), run))  # its team placed meanwhile
            continue
        holder = run.run_id in reservations.holders
        if run.requires_key in no_fit and not holder:
            continue  # a run of its shape found nothing free, and none has been freed since
        report.looked += 1
        looked.add(run.run_id)
        own = reserved_by(held, run.run_id)
        if order.quota_blocked(run):
            continue  # its (shape, team) waits for the team's next release
        try:
            adverts = _cover(ctx, run, adverts, unavailable, covered)
            blocked = unavailable | reserved_against(held, run.run_id, run.priority)
            outcome, nodes, claim_nodes, freed = promote(
                ctx,
                run,
                adverts,
                blocked,
                report.cause,
                reserved=own,
                check=ctx.gate.check,
                room=order.room(run),
                quarantined_only=order.quarantined_only,
            )
        except GateLost:
            raise  # the scan's turn is over, not this run's promotion
        except Exception as exc:
            # Failure isolation: one bad run must not stop the scan (its error leaves a wake
            # debt, see wake_queued).
            log.exception("promotion failed", run_id=run.run_id, cause=report.cause)
            report.errors += 1
            if isinstance(exc, DBAPIError):
                report.database_errors += 1
            else:
                report.failed.append(run.run_id)
            outcome, nodes, claim_nodes, freed = Outcome.NOT_QUEUED, [], set(), set()
        if outcome is Outcome.QUOTA:
            order.at_quota(run)
            continue
        if outcome in (Outcome.NO_FIT, Outcome.WIDTH_CAP):
            no_fit.add(run.requires_key)
            # The shape skip never skips a holder: what it may use depends on the run.
            for holder_run in reservations.holders.values():
                if holder_run.requires_key == run.requires_key and holder_run.run_id not in looked:
                    looked.add(holder_run.run_id)
                    heapq.heappush(heap, (order.key(holder_run), next(tie), holder_run))
            continue
        if outcome is Outcome.NODE_TAKEN:
            # Another run took a node between our snapshot and the insert: look at the fleet
            # again and give this run one more try in this scan.
            with ctx.db.begin() as s:
                unavailable |= unavailable_node_ids(s)
            if run.run_id not in retried_taken:
                retried_taken.add(run.run_id)
                heapq.heappush(heap, (order.key(run), next(tie), run))
                continue
            # Taken twice: a later run of its shape must not pass it, so the shape waits for
            # the next pass, which starts from a fresh snapshot of the fleet.
            report.again = True
            continue
        if outcome is Outcome.PROMOTED:
            unavailable.update(nodes)
            order.placed(run, len(nodes))
            report.promoted.append(run.run_id)
            report.claim_nodes |= claim_nodes
            for node in own:
                del held[node]  # its reservation went with its promotion
            left = set(own) - set(nodes)
            if freed or left:
                # The run ended inside its promotion, or left reserved nodes it did not take.
                # Those nodes go to the oldest eligible run first: the runs this pass already
                # passed over may want them more than the next one, so the scan starts a fresh
                # pass from the top of the queue instead of going on with this one. Freed nodes
                # take a wake mark after the commit that freed them, as after any freeing
                # commit: the verdict's took its own (settle_committed), the promotion's
                # commit that deleted the reservations takes it here.
                if left:
                    mark_wake(ctx)
                report.again = True
                break
        with ctx.db.begin() as s:
            team = run.team if teams else None
            nxt = next_queued_of_shape(s, run.requires_key, run, team=team)
            while nxt is not None and nxt.run_id in looked:  # a holder looked at out of turn
                nxt = next_queued_of_shape(s, run.requires_key, nxt, team=team)
        if nxt is not None:
            heapq.heappush(heap, (order.key(nxt), next(tie), nxt))


def wake_queued(
    ctx: Context, cause: str, *, notify: bool = True, direct: bool = False
) -> ScanReport:
    """One wake scan through the scan gate. Raises on a database failure, after leaving a wake
    debt (see :func:`wake_after_commit` for the wake points). ``notify=False``: the caller sends
    the one claim notification of its request, with ``report.claim_nodes`` in it. ``direct``:
    the reaper's scan, which takes the scanning lock whatever the waiting lock says, under
    ``lock_timeout`` = ``gate.idle_seconds`` (docs/design.md#the-scan-gate-and-wake-marks);
    ``skipped`` then means that timed out."""
    if ctx.config["lease.ttl_seconds"] <= 0:
        raise ConfigError("lease.ttl_seconds: must be greater than 0 (no unbounded leases)")
    report = ScanReport(cause)
    label = cause_label(cause)
    started = time.monotonic()
    if not direct and _queue_empty(ctx):
        report.seconds = time.monotonic() - started
        _count_scan(report)
        _log_scan(report, queue_empty=True)
        return report
    try:
        if direct:
            entered = ctx.gate.enter_directly(ctx.config["gate.idle_seconds"])
        else:
            entered = ctx.gate.enter()
    except Exception:
        WAKE_FAILED.labels(label).inc()
        raise
    if not entered:
        report.skipped = True
        WAKE_SKIPPED.labels(label).inc()
        log.debug("wake scan skipped: another is waiting", cause=cause, direct=direct)
        return report
    try:
        # The marks this scan covers: every one taken before the queue read of its last pass
        # (docs/queue.md#which-commit-frees-and-its-mark), the complete one: a pass that freed nodes
        # took a mark for them.
        with ctx.db.autocommit() as conn:
            mark = last_mark(conn)
        _scan(ctx, report)
        while report.again and report.passes < MAX_PASSES:
            with ctx.db.autocommit() as conn:
                mark = last_mark(conn)
            _scan(ctx, report)
        if report.errors and not report.again and _new_failures(ctx, report):
            # Owed first: a promotion that raised is looked at again by the reaper's scan.
            _record_debt(ctx, f"{cause}: promotion errors")
        if not report.again:
            # Promotion errors do not keep the marks uncovered: the scan looked at every run
            # after them, and what it owes for the runs that raised is the debt above. A run
            # whose promotion raises every time would otherwise make every reaper pass scan.
            with ctx.db.autocommit() as conn:
                cover_marks(conn, mark)
    except Exception as exc:
        WAKE_FAILED.labels(label).inc()
        # The promotions this scan committed before it raised are placed runs all the same:
        # their nodes' claims are told now, whoever was to send the request's notification.
        notify_claimable(ctx, report.claim_nodes)
        if isinstance(exc, GateLost):
            # Another scan may have started without us: ours stops, and what it did not look at
            # is owed (a fresh mark, paid by the reaper if no later scan covers it).
            log.warning("wake scan lost its gate", cause=cause, reason=str(exc))
            mark_wake(ctx)
        _record_debt(ctx, f"{cause}: the scan raised {type(exc).__name__}")
        raise
    finally:
        ctx.gate.leave()
        report.seconds = time.monotonic() - started
        _count_scan(report)
    if report.again:
        # A scan that could not finish its work leaves a debt the reaper pays
        # (docs/design.md#wake-debt-and-what-is-owed).
        _record_debt(ctx, f"{cause}: the queue changed during the scan")
    if notify:
        notify_claimable(ctx, report.claim_nodes)
    _log_scan(
        report,
        queued=report.queued if report.queued <= QUEUED_COUNTED else f"more than {QUEUED_COUNTED}",
    )
    return report


def _queue_empty(ctx: Context) -> bool:
    """No run is QUEUED: the scan ends at its first look, without the gate, and covers the marks
    taken before that look (docs/design.md#the-scan-gate-and-wake-marks). Its one statement reads
    the last mark and the queue, and covers the mark when the queue is empty: a run that queues
    later reads the marks around its own candidate read and scans itself when one was taken
    meanwhile (docs/queue.md#on-submit-placed-queued-or-rejected). One statement where a scan
    through the gate takes five and its locks."""
    with ctx.db.autocommit() as conn:
        return cover_if_queue_empty(conn)


def _new_failures(ctx: Context, report: ScanReport) -> bool:
    """Whether this scan's promotion errors are owed again: a database error always is (a
    time-out or a lost connection passes, and the reaper's next pass tries again); a run whose
    promotion raised of itself only when it had not raised in this process's previous scan with
    errors. A run whose promotion raises every time (its stored requirements do not decode,
    say) is retried by the next event that scans, and the reaper does not scan each pass for it
    (that would be a polling loop). The memory is this process's: another process's first scan
    that meets the run owes it once more."""
    previous, ctx.failed_promotions = ctx.failed_promotions, set(report.failed)
    return bool(report.database_errors) or not set(report.failed) <= previous


def _count_scan(report: ScanReport) -> None:
    """A scan that ran, in the metrics of its cause."""
    label = cause_label(report.cause)
    WAKE_SCANS.labels(label).inc()
    WAKE_SECONDS.labels(label).observe(report.seconds)
    WAKE_PROMOTED.labels(label).inc(len(report.promoted))


def _log_scan(report: ScanReport, **extra: object) -> None:
    """A scan's log line (why, how many queued, how many promoted, how long:
    docs/metrics.md#logs)."""
    log.info(
        "wake scan",
        cause=report.cause,
        **extra,
        shapes=report.shapes,
        looked=report.looked,
        promoted=len(report.promoted),
        errors=report.errors,
        passes=report.passes,
        ms=round(report.seconds * 1000, 1),
    )


def scan_ended_at_marks(cause: str, seconds: float) -> None:
    """A submit's wake scan that ended at its first check
    (docs/queue.md#on-submit-placed-queued-or-rejected, closing the submit window): no wake mark was
    taken since the submit's candidate read and the reservation step has no work, so nothing was
    freed that the read did not see and there is nothing to write. It takes no gate and reads no
    queue, and is counted and logged as a scan of its cause."""
    report = ScanReport(cause, seconds=seconds)
    _count_scan(report)
    _log_scan(report, nothing_freed=True)


def _record_debt(ctx: Context, why: str) -> None:
    try:
        with ctx.db.begin() as s:
            set_wake_debt(s, why)
    except Exception:
        log.exception("could not record the wake debt", why=why)


def wake_after_commit(
    ctx: Context, cause: str, *, notify: bool = True, marked: bool = False
) -> ScanReport | None:
    """A wake point: after the freeing transaction committed. Takes the wake mark first (unless
    the caller did: ``marked``), then scans. Never raises and never changes the caller's answer;
    a failed wake leaves a wake-debt marker for the reaper, and a skipped one an uncovered mark
    (docs/design.md#wake-debt-and-what-is-owed)."""
    if not marked:
        mark_wake(ctx)
    try:
        return wake_queued(ctx, cause, notify=notify)
    except Exception as exc:
        log.exception("wake scan failed", cause=cause)
        _record_debt(ctx, f"{cause}: {type(exc).__name__}")
        return None


def pay_owed(ctx: Context) -> None:
    """What this process owes since a wake mark could not be taken (``ctx.owed``, see
    :func:`app.services.marks.mark_wake`): a mark, then a scan, once the database answers again.
    Never raises; a mark that still cannot be taken stays owed."""
    if ctx.owed.is_set() and mark_wake(ctx):
        wake_after_commit(ctx, "owed after a failure", marked=True)
