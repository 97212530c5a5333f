"""Reading the queue for a wake scan (docs/design.md#the-queue,
docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): the first QUEUED run of each
requirement shape in queue order (priority descending, then arrival: created_at, run_id).

The scan reads QUEUED runs without row locks; the conditional promotion does the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    BindParameter,
    ColumnElement,
    Connection,
    DateTime,
    Integer,
    Select,
    String,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    column,
    exists,
    false,
    func,
    literal_column,
    or_,
    select,
    text,
    tuple_,
    values,
)
from sqlalchemy.orm import Session

from app.models import Placement, QueueCount, Reservation, Run
from app.store.gate import LAST_MARK_SQL
from app.store.pipeline import pipelined

# The state as a constant in the SQL text, not a parameter: a prepared statement's generic plan
# could not prove the partial indexes' ``state = 'QUEUED'`` predicate from a parameter.
IS_QUEUED = Run.state == literal_column("'QUEUED'")


@dataclass(frozen=True)
class QueuedRun:
    run_id: str
    created_at: datetime
    requires_key: str
    requires: Any
    priority: int = 0
    team: str = "default"  # as stored on the run (docs/teams.md)
    pinned_node: str | None = None  # a health run's node (docs/operators.md)

    @property
    def order(self) -> tuple[int, datetime, str]:
        """The queue order as a sort key (docs/priorities.md#priority)."""
        return (-self.priority, self.created_at, self.run_id)


def queued_columns():  # type: ignore[no-untyped-def]
    return (
        Run.run_id,
        Run.created_at,
        Run.requires_key,
        Run.requires,
        Run.priority,
        Run.team,
        Run.pinned_node,
    )


QUEUE_ORDER = (Run.priority.desc(), Run.created_at, Run.run_id)


def after_in_queue(run: QueuedRun):  # type: ignore[no-untyped-def]
    """The runs behind ``run`` in queue order."""
    return or_(
        Run.priority < run.priority,
        and_(
            Run.priority == run.priority,
            or_(
                Run.created_at > run.created_at,
                and_(Run.created_at == run.created_at, Run.run_id > run.run_id),
            ),
        ),
    )


@functools.cache
def _shape_heads() -> Select[Any]:
    """The statement of :func:`queued_shape_heads`; built once (it has no parameter, and every
    scan runs it)."""
    keys = (
        select(Run.requires_key.label("k"))
        .where(IS_QUEUED)
        .order_by(Run.requires_key)
        .limit(1)
        .cte("shape_keys", recursive=True)
    )
    next_key = (
        select(Run.requires_key)
        .where(IS_QUEUED, Run.requires_key > keys.c.k)
        .order_by(Run.requires_key)
        .limit(1)
        .scalar_subquery()
    )
    keys = keys.union_all(select(next_key.label("k")).where(keys.c.k.is_not(None)))
    head = (
        select(*queued_columns())
        .where(IS_QUEUED, Run.requires_key == keys.c.k)
        .order_by(*QUEUE_ORDER)
        .limit(1)
        .lateral("head")
    )
    return (
        select(*(head.c[col.key] for col in queued_columns()))
        .select_from(keys)
        .join(head, literal_column("true"))
        .where(keys.c.k.is_not(None))
    )


# The first QUEUED run, in queue order, of every (shape, team): a loose index scan of
# ``ix_runs_queued_shape_team`` for the distinct pairs, then a probe of it for each pair's first.
_SHAPE_TEAM_HEADS = text(
    "WITH RECURSIVE pairs(k, t) AS ("
    " (SELECT requires_key, team FROM runs WHERE state = 'QUEUED'"
    " ORDER BY requires_key, team LIMIT 1)"
    " UNION ALL"
    " SELECT p.k, p.t FROM pairs, LATERAL (SELECT r.requires_key AS k, r.team AS t FROM runs r"
    " WHERE r.state = 'QUEUED' AND (r.requires_key, r.team) > (pairs.k, pairs.t)"
    " ORDER BY r.requires_key, r.team LIMIT 1) p)"
    " SELECT h.run_id, h.created_at, h.requires_key, h.requires, h.priority, h.team,"
    " h.pinned_node FROM pairs CROSS JOIN LATERAL (SELECT run_id, created_at, requires_key,"
    " requires, priority, team, pinned_node FROM runs WHERE state = 'QUEUED' AND requires_key = pairs.k AND team = pairs.t"
    " ORDER BY priority DESC, created_at, run_id LIMIT 1) h"
)


def queued_shape_team_heads(s: Session) -> list[QueuedRun]:
    """The first QUEUED run, in queue order, of every distinct (``requires_key``, team): what a
    scan looks at first when teams share the fleet (docs/teams.md, "Fair share"). Its cost grows
    with shapes × teams with queued runs, never with the queued runs."""
    return [QueuedRun(*row) for row in s.execute(_SHAPE_TEAM_HEADS).all()]


def queued_shape_heads(s: Session | Connection) -> list[QueuedRun]:
    """The first QUEUED run, in queue order, of every distinct ``requires_key``.

    A loose index scan (recursive CTE over ``ix_runs_queued_shape``) finds the distinct keys in
    O(shapes · log n) instead of reading every queued row; a LATERAL picks each key's first run.
    """
    return [QueuedRun(*row) for row in s.execute(_shape_heads()).all()]


def next_queued_of_shape(
    s: Session, requires_key: str, after: QueuedRun, *, team: str | None = None
) -> QueuedRun | None:
    """The next QUEUED run of one shape after ``after`` in queue order; with ``team``, of that
    stored team only (``ix_runs_queued_shape_team``)."""
    q = select(*queued_columns()).where(
        IS_QUEUED, Run.requires_key == requires_key, after_in_queue(after)
    )
    if team is not None:
        q = q.where(Run.team == team)
    q = q.order_by(*QUEUE_ORDER).limit(1)
    row = s.execute(q).first()
    return QueuedRun(*row) if row else None


def aged_queued_runs(s: Session, seconds: int, per_shape: Mapping[str, int]) -> list[QueuedRun]:
    """QUEUED runs that have waited ``seconds`` or longer, in queue order
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): of each shape in
    ``per_shape`` (requires_key -> how many), only its first ones in queue order, each shape by one
    LATERAL probe of ``ix_runs_queued_shape`` with its own LIMIT; the rest of a shape cannot matter
    to this scan's reservation step, and reading (or ranking) them would make its cost grow with the
    queue instead of with the shapes."""
    if not per_shape:
        return []
    limits = values(
        column("k", String), column("n", Integer), name="limits", literal_binds=False
    ).data(list(per_shape.items()))
    first = (
        select(*queued_columns())
        .where(
            IS_QUEUED,
            Run.requires_key == limits.c.k,
            Run.created_at <= func.now() - func.make_interval(0, 0, 0, 0, 0, 0, seconds),
        )
        .order_by(*QUEUE_ORDER)
        .limit(limits.c.n)
        .lateral("first")
    )
    q = (
        select(*(first.c[col.key] for col in queued_columns()))
        .select_from(limits)
        .join(first, literal_column("true"))
        .order_by(first.c.priority.desc(), first.c.created_at, first.c.run_id)
    )
    return [QueuedRun(*row) for row in s.execute(q).all()]


def overtaken_queued_runs(
    s: Session, requires_key: str, placed: Mapping[int, datetime], limit: int
) -> list[QueuedRun]:
    """The QUEUED runs of one shape overtaken by a placement
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): a run of priority p
    created at t is overtaken when ``placed`` (priority q -> the last placement of priority q on a
    candidate of the shape) has some q < p with a time after t. For each priority that is a
    created_at prefix; the first ``limit`` in queue order, through ``ix_runs_queued_shape``."""
    if not placed or limit <= 0:
        return []
    q = (
        select(*queued_columns())
        .where(
            IS_QUEUED,
            Run.requires_key == requires_key,
            or_(*(and_(Run.priority > p, Run.created_at < at) for p, at in placed.items())),
        )
        .order_by(*QUEUE_ORDER)
        .limit(limit)
    )
    return [QueuedRun(*row) for row in s.execute(q).all()]


def queue_depth(s: Session) -> int:
    return s.execute(select(func.count()).select_from(Run).where(IS_QUEUED)).scalar_one()


def set_statement_timeout(s: Session, seconds: float) -> None:
    """``SET LOCAL statement_timeout`` for the rest of this transaction (scans,
    docs/design.md#the-scan-gate-and-wake-marks)."""
    s.execute(
        text("SELECT set_config('statement_timeout', :ms, true)"), {"ms": f"{int(seconds * 1000)}"}
    )


def timed_out_queued(s: Session, run_id: str | None = None) -> list[str]:
    """QUEUED runs whose contract's ``queue.timeout`` has passed (the reaper,
    docs/queue.md#leaving-the-queue); with ``run_id``, whether that one run still is."""
    # ``queue_deadline`` and the predicate are those of ``ix_runs_queue_deadline``: the pass reads
    # the runs whose deadline passed, not every QUEUED run with a timeout.
    q = select(Run.run_id).where(
        IS_QUEUED,
        Run.queue_timeout_seconds.is_not(None),
        func.queue_deadline(Run.created_at, Run.queue_timeout_seconds) <= func.now(),
    )
    if run_id is not None:
        q = q.where(Run.run_id == run_id)
    return list(s.execute(q).scalars())


# ---------------------------------------------------------------- a run's place in the queue


@dataclass(frozen=True)
class QueuePlace:
    """A run's place in the queue, read in one statement
    (docs/queue.md#what-a-queued-runs-view-explains)."""

    now: datetime  # the database clock: ``candidates_at``
    state: str | None  # the run's state now (None: no such run)
    ahead: int  # QUEUED runs ahead of it in queue order
    # the nodes reserved for it
    # (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits)
    own: list[str]
    # the last wake mark taken (the submit's check,
    # docs/queue.md#on-submit-placed-queued-or-rejected)
    mark: int
    # Whether a scan's reservation step could have work (a reservation stored, a run that
    # waited ``queue.reserve_after_seconds``, or a lower-priority placement since the oldest
    # queued run arrived): the filter of ``scan_probe``
    # (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits).
    reservation_work: bool


# A run's place is counted among the runs of its priority before it while there are few of them
# (a bounded range of ``ix_runs_queued``); past this many, from the counts of QUEUED runs less the
# runs from it on (the range behind it, short for a run that just queued).
COUNTED_BEFORE = 1000


def _unseen(value: BindParameter[Any]) -> ColumnElement[Any]:
    """``value`` as a subquery of its own: the planner estimates with it as with a parameter it
    does not know, so a plan made for the call costs what the generic plan does, and PostgreSQL
    keeps the generic plan instead of planning the statement at every call (its ranges of the
    queue by priority and arrival made the generic plan look dearer). Index scans still take it
    as their bound."""
    return select(value).scalar_subquery()


def _unseen_array(name: str) -> ColumnElement[Any]:
    """The text array parameter ``name`` as :func:`_unseen` makes it, cast back to an array: a
    bare subquery under ``= ANY`` would compare with its rows, not with its elements."""
    return cast(_unseen(bindparam(name, type_=ARRAY(Text))), ARRAY(Text))


def _queued_ahead(teams: bool) -> ColumnElement[int]:
    """QUEUED runs ahead in scan order: higher priority, or equal priority and older (the queue
    position of a run, docs/queue.md#what-a-queued-runs-view-explains). Never a count of the whole
    queue: the higher priorities from ``queue_counts``, its own priority by the shorter of the two
    ranges of ``ix_runs_queued`` around the run (one snapshot: the counts are kept in the
    transactions that move runs in and out of QUEUED).

    ``teams`` (docs/teams.md, "Fair share"): at the run's priority, the runs of the stored teams
    ranked before its own (``:before``) all count, from ``queue_counts``, and the older runs of
    the teams ranked with its own (``:same``, its own among them) by a range of
    ``ix_runs_queued_team``."""
    priority = _unseen(bindparam("priority", type_=Integer))
    key = tuple_(
        _unseen(bindparam("created_at", type_=DateTime(timezone=True))),
        _unseen(bindparam("run_id", type_=Text)),
    )
    here = tuple_(Run.created_at, Run.run_id)
    same = and_(IS_QUEUED, Run.priority == priority)
    at_priority: list[ColumnElement[bool]] = [QueueCount.priority == priority]
    if teams:
        same = and_(same, Run.team == any_(_unseen_array("same")))
        at_priority.append(QueueCount.team == any_(_unseen_array("same")))

    def counted(*where: ColumnElement[bool]) -> ColumnElement[int]:
        return func.coalesce(
            select(func.sum(QueueCount.queued)).where(*where).correlate(None).scalar_subquery(),
            0,
        )

    before = (
        select(func.count())
        .select_from(
            select(Run.run_id)
            .where(same, here < key)
            .limit(literal_column(str(COUNTED_BEFORE + 1)))
            .correlate(None)
            .subquery()
        )
        .scalar_subquery()
    )
    from_it_on = select(func.count()).where(same, here >= key).correlate(None).scalar_subquery()
    own = case(
        (before <= COUNTED_BEFORE, before),
        else_=counted(*at_priority) - from_it_on,
    )
    ahead = counted(QueueCount.priority > priority) + own
    if teams:
        ranked_before = QueueCount.team == any_(_unseen_array("before"))
        ahead = ahead + counted(QueueCount.priority == priority, ranked_before)
    return ahead


def oldest_queued() -> ColumnElement[datetime]:
    """The oldest QUEUED run's arrival, as a scalar subquery (one probe of an index)."""
    return (
        select(Run.created_at)
        .where(IS_QUEUED)
        .order_by(Run.created_at)
        .limit(literal_column("1"))  # a constant, not a parameter (see _queue_now)
        .correlate(None)
        .scalar_subquery()
    )


def reservation_probes(
    seconds: int, top: int | ColumnElement[int], oldest: ColumnElement[datetime]
) -> tuple[ColumnElement[bool], ColumnElement[bool], ColumnElement[bool]]:
    """Whether a scan's reservation step has anything to do
    (docs/design.md#priorities-and-reservations), as three index probes: a reservation is stored
    (``held``), a QUEUED run waited ``seconds`` (``aged``), a run of a priority below ``top`` was
    placed after ``oldest`` (``placed``, a cheap filter over the record of placements). ``seconds``
    <= 0: reservations are off, and no run is aged."""
    held: ColumnElement[bool] = exists().where(Reservation.node_id.is_not(None))
    if seconds <= 0:
        return held, false(), false()
    # The interval as a constant of the statement, not a parameter: a generic plan then probes
    # ix_runs_queued_age as a custom one does (with parameters it read the whole queue).
    waited = func.now() - literal_column(f"interval '{int(seconds)} seconds'")
    aged = exists().where(IS_QUEUED, Run.created_at <= waited)
    placed = (
        select(Placement.node_id)
        .where(Placement.priority < top, Placement.last_at > oldest)
        .correlate(None)
        .exists()
    )
    return held, aged, placed


def _reservation_work(seconds: int) -> ColumnElement[bool]:
    """:func:`reservation_probes` in one, with the highest queued priority read here rather than
    from the shapes' first runs."""
    top = select(func.max(Run.priority)).where(IS_QUEUED).correlate(None).scalar_subquery()
    return or_(*reservation_probes(seconds, top, oldest_queued()))


@functools.cache
def _run_place(teams: bool) -> Select[Any]:
    """The first statement of :func:`queue_place`: the run's state, the QUEUED runs ahead of it
    and its own reservations; built once per whether teams order the queue (every queued
    submit's reply runs it)."""
    run_id = bindparam("run_id", type_=Text)
    # Each part is a subquery of its own (nothing to correlate: the statement has no FROM).
    return select(
        select(Run.state).where(Run.run_id == run_id).correlate(None).scalar_subquery(),
        _queued_ahead(teams),
        func.array(
            select(Reservation.node_id)
            .where(Reservation.run_id == run_id)
            .order_by(Reservation.node_id)
            .correlate(None)
            .scalar_subquery()
        ),
    )


@functools.cache
def _queue_now(seconds: int) -> Select[Any]:
    """The second statement of :func:`queue_place`: the database's clock, the last wake mark and
    whether the reservation step has work. It has no parameter, so PostgreSQL plans it once a
    connection (while these probes were in the first statement, with its values as parameters,
    they were two-thirds of the planning it had at every call)."""
    clock: ColumnElement[Any] = func.now()
    return select(clock, literal_column(f"({LAST_MARK_SQL})"), _reservation_work(seconds))


@dataclass(frozen=True)
class TeamOrder:
    """Where a run's team stands at its priority (docs/teams.md, "Fair share"): the stored team
    names ranked before it, and those ranked with it (its own among them)."""

    before: list[str]
    same: list[str]


def queue_place(
    s: Session | Connection,
    run_id: str,
    priority: int,
    created_at: datetime,
    *,
    reserve_after: int,
    order: TeamOrder | None = None,
) -> QueuePlace:
    """Where the run stands, in two statements sent together (one round trip): its state, the
    QUEUED runs ahead of it and the nodes reserved for it; then the database's clock, the last
    wake mark and whether the reservation step has work (``reserve_after``:
    ``queue.reserve_after_seconds``). The mark is read after the place, never before it: a
    submit that compares it with the mark it read before its candidate read scans whenever a
    node was freed since. ``order``: teams order the queue, and this is where the run's team
    stands (None: by priority and age alone)."""
    params: dict[str, Any] = {"priority": priority, "created_at": created_at, "run_id": run_id}
    if order is not None:
        params.update(before=order.before, same=order.same)
    place, clock = pipelined(
        s, (_run_place(order is not None), params), (_queue_now(reserve_after), {})
    )
    ((state, ahead, own),) = place
    ((now, mark, work),) = clock
    return QueuePlace(now, state, int(ahead), list(own), int(mark), bool(work))
