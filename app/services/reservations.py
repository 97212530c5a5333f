"""The reservation step of a wake scan (docs/design.md#priorities-and-reservations): keep and add
reservations, write only the difference, and hand the ordinary pass what is reserved against
whom."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from app.config import Config
from app.context import Context
from app.contract.types import role_from_wire
from app.logs import log
from app.match import Advert, satisfies
from app.reserve import Held, Reserving, plan_reservations
from app.services.tx import retrying
from app.store.nodes import draining_node_ids
from app.store.queue import (
    QueuedRun,
    aged_queued_runs,
    overtaken_queued_runs,
    set_statement_timeout,
)
from app.store.reservations import (
    Probe,
    Written,
    clear_reservations,
    lower_priority_placements,
    stored_reservations,
    write_reservations,
)


@dataclass
class Reservations:
    """What the ordinary pass matches against: node -> holder, and the holders as queued runs
    (a holder is never skipped with its shape)."""

    held: dict[str, Held] = field(default_factory=dict)
    holders: dict[str, QueuedRun] = field(default_factory=dict)
    # A node that was reserved is no longer: freed for the runs it was held back from.
    released: bool = False


@dataclass(frozen=True)
class Inputs:
    stored: dict[str, str]
    holders: dict[str, QueuedRun]
    reserving: list[QueuedRun]  # queue order
    draining: set[str]


def _reserving(run: QueuedRun) -> Reserving:
    return Reserving(
        run.run_id,
        run.requires_key,
        tuple(role_from_wire(r) for r in run.requires),
        run.priority,
    )


def _decoded(runs: list[QueuedRun]) -> dict[str, Reserving]:
    """run_id -> its Reserving, for the runs whose stored requirements decode: one that does not
    is left to fail on its own in promotion (failure isolation), never to stop every scan."""
    out: dict[str, Reserving] = {}
    for run in runs:
        try:
            out[run.run_id] = _reserving(run)
        except (KeyError, TypeError, ValueError, AttributeError):
            log.warning("queued run with undecodable requirements", run_id=run.run_id)
    return out


def read_inputs(
    s: Session, config: Config, heads: list[QueuedRun], adverts: list[Advert], probe: Probe
) -> Inputs | None:
    """Inside the scan's reading transaction, after the probe: the rest only when a reserving
    run exists or the table is not empty. None: nothing to do. Reservations off: the empty set."""
    seconds = config["queue.reserve_after_seconds"]
    if seconds <= 0:
        if probe.held:
            clear_reservations(s)
        return None
    if not (probe.held or probe.aged or probe.overtaken):
        return None
    top = max(h.priority for h in heads)
    by_node = {a.node_id: a for a in adverts}
    # Placements after the oldest queued run's arrival (not only the shapes' first runs': an
    # older run of a lower priority may be behind a younger first run of its shape).
    oldest = probe.oldest or min(h.created_at for h in heads)
    stored, holders = stored_reservations(s)
    reserving = (
        aged_queued_runs(s, seconds, _worth_reading(heads, holders, adverts)) if probe.aged else []
    )
    if probe.overtaken:
        # A run of lower priority was placed (the record of placements, whether that run still
        # holds its lease or not) on a node that could fill one of a waiting run's roles: every
        # such run reserves at once, found per shape as a prefix, never by reading every run.
        placed = lower_priority_placements(s, top, oldest)
        limits = _worth_reading(heads, holders, adverts)
        seen = {r.run_id for r in reserving}
        for head in heads:
            if head.requires_key not in limits:
                continue  # undecodable: left to fail on its own
            roles = [role_from_wire(r) for r in head.requires]
            last: dict[int, datetime] = {}
            for node, priority, at in placed:
                advert = by_node.get(node)
                if advert is not None and any(satisfies(advert, r) for r in roles):
                    last[priority] = max(at, last.get(priority, at))
            for run in overtaken_queued_runs(s, head.requires_key, last, limits[head.requires_key]):
                if run.run_id not in seen:
                    seen.add(run.run_id)
                    reserving.append(run)
        reserving.sort(key=lambda r: r.order)
    return Inputs(stored, holders, reserving, draining_node_ids(s))


def _worth_reading(
    heads: list[QueuedRun], holders: dict[str, QueuedRun], adverts: list[Advert]
) -> dict[str, int]:
    """requires_key -> how many of the shape's aged runs the reservation step can use, at most.
    In queue order each run of a shape either holds its reservation already, or reserves at least
    one node no other run holds (a node that fills one of the shape's roles), or cannot be
    satisfied, which ends the shape for the step (:func:`app.reserve.plan_reservations`): so past
    its holders, its candidates and one more, no run of the shape can matter."""
    held: dict[str, int] = {}
    for run in holders.values():
        held[run.requires_key] = held.get(run.requires_key, 0) + 1
    out = {}
    for head in heads:
        try:
            roles = [role_from_wire(r) for r in head.requires]
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # left to fail on its own in promotion (failure isolation)
        candidates = sum(1 for a in adverts if any(satisfies(a, r) for r in roles))
        out[head.requires_key] = held.get(head.requires_key, 0) + candidates + 1
    return out


@retrying
def _write(ctx: Context, stored: dict[str, str], plan: dict[str, str]) -> Written:
    """The difference, in one transaction (the holders' run rows first,
    docs/queue.md#lock-order)."""
    with ctx.db.begin() as s:
        set_statement_timeout(s, ctx.config["database.statement_timeout_seconds"])
        return write_reservations(s, stored, plan)


def reserve(
    ctx: Context,
    inputs: Inputs | None,
    adverts: list[Advert],
    *,
    blocked: Callable[[QueuedRun], bool] = lambda run: False,
) -> Reservations:
    """Plan the reservations, write the difference in one transaction, and return them.
    ``blocked``: a run whose team is at its quota (docs/teams.md, "Quotas") neither reserves
    nor keeps what it held, which this step then releases."""
    if inputs is None:
        return Reservations()
    known = {**{r.run_id: r for r in inputs.reserving}, **inputs.holders}
    decoded = _decoded(list(known.values()))
    out_of_quota = {run_id for run_id, run in known.items() if blocked(run)}
    plan = plan_reservations(
        {n: r for n, r in inputs.stored.items() if r in decoded or r not in inputs.holders},
        {
            run_id: decoded[run_id]
            for run_id in inputs.holders
            if run_id in decoded and run_id not in out_of_quota
        },
        [
            decoded[r.run_id]
            for r in inputs.reserving
            if r.run_id in decoded and r.run_id not in out_of_quota
        ],
        adverts,
        inputs.draining,
        ctx.config["lease.max_per_run"],
    )
    ended: set[str] = set()
    if plan != inputs.stored:
        # never write reservations without the gate (docs/design.md#the-scan-gate-and-wake-marks)
        ctx.gate.check(now=True)
        written = _write(ctx, inputs.stored, plan)
        ended = written.not_queued
        for run_id, nodes in written.changed.items():
            log.info("reservation", run_id=run_id, nodes=nodes)
    out = Reservations()
    for node, run_id in plan.items():
        if run_id not in ended:
            out.held[node] = Held(run_id, known[run_id].priority)
            out.holders[run_id] = known[run_id]
    out.released = any(node not in out.held for node in inputs.stored)
    return out
