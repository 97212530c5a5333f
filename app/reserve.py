"""Reservations (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits), the pure
part: which nodes are reserved against a run, and the plan a wake scan writes. Plain data in, a
decision out, no I/O (like :mod:`app.match`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.contract.types import Role
from app.match import Advert, Reject, match, match_within_cap, satisfies, width_exceeded


@dataclass(frozen=True)
class Held:
    """One reserved node: its holder and the holder's priority."""

    run_id: str
    priority: int


@dataclass(frozen=True)
class Reserving:
    """A QUEUED run that may reserve: its id, requirement shape and roles, and its priority
    (listed in queue order)."""

    run_id: str
    requires_key: str
    roles: tuple[Role, ...]
    priority: int = 0


def reserved_against(held: Mapping[str, Held], run_id: str | None, priority: int) -> set[str]:
    """The reserved nodes a run may not use: every node whose holder is another run of equal or
    higher priority (a higher-priority run passes a reservation,
    docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits)."""
    return {n for n, h in held.items() if h.run_id != run_id and priority <= h.priority}


def reserved_by(held: Mapping[str, Held], run_id: str) -> list[str]:
    return sorted(n for n, h in held.items() if h.run_id == run_id)


def _usable(advert: Advert | None, roles: Sequence[Role], draining: Collection[str]) -> bool:
    return (
        advert is not None
        and advert.node_id not in draining
        and any(satisfies(advert, r) for r in roles)
    )


def _preferring(adverts: Sequence[Advert], first: Collection[str]) -> list[Advert]:
    """The adverts with ``first`` ahead of the rest, each part in candidate order: the greedy
    matcher then keeps those nodes wherever they still fit."""
    return [a for a in adverts if a.node_id in first] + [
        a for a in adverts if a.node_id not in first
    ]


def plan_reservations(
    existing: Mapping[str, str],
    holders: Mapping[str, Reserving],
    reserving: Iterable[Reserving],
    adverts: Sequence[Advert],
    draining: Collection[str],
    max_per_run: int,
) -> dict[str, str]:
    """node -> holder: what a scan's reservation step leaves
    (docs/design.md#priorities-and-reservations).

    ``existing`` is node -> holder as stored; ``holders`` the holders still QUEUED. *Keep*: a
    holder keeps every node that is still a live, non-draining candidate of one of its roles
    (its clock never restarts); one that lost nodes matches only the vacant places, keeping the
    others, and releases all of them if even busy-as-free cannot fill its roles. *Add*: then, in
    queue order (``reserving``, adverts in candidate order), each reserving run without a
    reservation gets the nodes the matcher gives it as if every busy node were free, less the
    nodes reserved by others. *Takeover*: a run that cannot be satisfied that way matches once
    more with the nodes of lower-priority holders added and takes over just the reserved nodes of
    that assignment (among equal priorities the earlier reservation stands). A run gets none if
    even that fails or passes the width cap; a shape is skipped after its first such run, and the
    step stops once no node is left that a later (no higher-priority) run could use."""
    live = {a.node_id: a for a in adverts}
    usable = {a.node_id for a in adverts if a.node_id not in draining}
    by_run: dict[str, list[str]] = {}
    for node, run_id in existing.items():
        by_run.setdefault(run_id, []).append(node)
    plan: dict[str, str] = {}
    priority: dict[str, int] = {}
    # Keep: every holder its nodes that still fit, higher priorities first.
    order = sorted(holders.values(), key=lambda h: -h.priority)
    lost: list[Reserving] = []
    for holder in order:
        nodes = by_run.get(holder.run_id, [])
        kept = [n for n in nodes if _usable(live.get(n), holder.roles, draining) and n not in plan]
        plan.update({n: holder.run_id for n in kept})
        priority[holder.run_id] = holder.priority
        kept_adverts = [live[n] for n in kept]
        if len(kept) < len(nodes) or isinstance(match(holder.roles, kept_adverts, ()), Reject):
            # It lost nodes (gone, draining, no longer fitting, or taken over by a higher
            # priority): the vacant places are matched again below.
            lost.append(holder)
    for holder in lost:
        own = {n for n, r in plan.items() if r == holder.run_id}
        others = set(plan) - own
        outcome = match_within_cap(
            holder.roles,
            _preferring(adverts, own),
            set(draining) | others,
            max_per_run,
            ordered=True,
        )
        for n in own:
            del plan[n]
        if isinstance(outcome, Reject) or width_exceeded(outcome, max_per_run):
            continue  # even busy-as-free cannot fill it: it releases all its nodes
        plan.update({n: holder.run_id for n in outcome.nodes()})
    planned = set(plan.values())
    skipped: set[str] = set()
    for run in reserving:
        takeable = {n for n, r in plan.items() if priority.get(r, run.priority) < run.priority}
        if usable <= plan.keys() and not takeable:
            break  # nothing free, nothing of a lower priority: no later run can do better
        if run.run_id in planned or run.requires_key in skipped:
            continue
        outcome = match_within_cap(
            run.roles, adverts, set(draining) | plan.keys(), max_per_run, ordered=True
        )
        if takeable and (isinstance(outcome, Reject) or width_exceeded(outcome, max_per_run)):
            # Takeover: unreserved nodes first, then those of lower-priority holders.
            outcome = match_within_cap(
                run.roles,
                _preferring(adverts, usable - plan.keys()),
                set(draining) | (plan.keys() - takeable),
                max_per_run,
                ordered=True,
            )
        if isinstance(outcome, Reject) or width_exceeded(outcome, max_per_run):
            skipped.add(run.requires_key)
            continue
        plan.update({n: run.run_id for n in outcome.nodes()})
        planned.add(run.run_id)
        priority[run.run_id] = run.priority
    return plan
