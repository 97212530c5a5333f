"""Reservations (SPEC §7a), the pure part: which nodes are reserved against a run, and the plan a
wake scan writes. Plain data in, a decision out, no I/O (like :mod:`app.match`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.contract.types import Role
from app.match import Advert, Reject, match, satisfies, width_exceeded


@dataclass(frozen=True)
class Held:
    """One reserved node: its holder and the holder's priority."""

    run_id: str
    priority: int


@dataclass(frozen=True)
class Reserving:
    """A QUEUED run that may reserve: its id, requirement shape and roles (queue order)."""

    run_id: str
    requires_key: str
    roles: tuple[Role, ...]


def reserved_against(held: Mapping[str, Held], run_id: str | None, priority: int) -> set[str]:
    """The reserved nodes a run may not use: every node whose holder is another run of equal or
    higher priority (a higher-priority run passes a reservation, SPEC §7a)."""
    return {n for n, h in held.items() if h.run_id != run_id and priority <= h.priority}


def reserved_by(held: Mapping[str, Held], run_id: str) -> list[str]:
    return sorted(n for n, h in held.items() if h.run_id == run_id)


def _usable(advert: Advert | None, roles: Sequence[Role], draining: Collection[str]) -> bool:
    return (
        advert is not None
        and advert.node_id not in draining
        and any(satisfies(advert, r) for r in roles)
    )


def plan_reservations(
    existing: Mapping[str, str],
    holders: Mapping[str, Reserving],
    reserving: Iterable[Reserving],
    adverts: Sequence[Advert],
    draining: Collection[str],
    max_per_run: int,
) -> dict[str, str]:
    """node -> holder: what a scan's reservation step leaves (SPEC §7a, step 1).

    ``existing`` is node -> holder as stored; ``holders`` the holders still QUEUED. A holder keeps
    its reservation while every node of it is still a live, non-draining candidate of one of its
    roles (its clock never restarts); otherwise it loses it whole and is planned again like any
    reserving run. Then, in queue order (``reserving``, adverts in candidate order), each
    reserving run without a reservation gets the nodes the matcher gives it as if every busy node
    were free, less the nodes reserved by others: none if even that cannot satisfy it or passes
    the width cap. A shape is skipped after its first run that cannot be satisfied, and the plan
    stops once every usable node is reserved."""
    live = {a.node_id: a for a in adverts}
    by_run: dict[str, list[str]] = {}
    for node, run_id in existing.items():
        by_run.setdefault(run_id, []).append(node)
    plan: dict[str, str] = {}
    for run_id, nodes in by_run.items():
        holder = holders.get(run_id)
        if holder is not None and all(_usable(live.get(n), holder.roles, draining) for n in nodes):
            plan.update({n: run_id for n in nodes})
    usable = {a.node_id for a in adverts if a.node_id not in draining}
    planned = set(plan.values())
    skipped: set[str] = set()
    for run in reserving:
        if usable <= plan.keys():
            break
        if run.run_id in planned or run.requires_key in skipped:
            continue
        outcome = match(run.roles, adverts, set(draining) | plan.keys(), ordered=True)
        if isinstance(outcome, Reject) or width_exceeded(outcome, max_per_run):
            skipped.add(run.requires_key)
            continue
        plan.update({n: run.run_id for n in outcome.nodes()})
        planned.add(run.run_id)
    return plan


def overtaken(
    run_priority: int,
    run_created_at: object,
    roles: Sequence[Role],
    placements: Iterable[tuple[str, int, object]],
    adverts: Mapping[str, Advert],
) -> bool:
    """A run of lower priority was placed on a node that could fill one of this run's roles while
    it waited: ``placements`` are (node, priority, placed at) of the runs holding leases."""
    for node, priority, placed_at in placements:
        advert = adverts.get(node)
        if (
            priority < run_priority
            and placed_at is not None
            and placed_at > run_created_at  # type: ignore[operator]
            and advert is not None
            and any(satisfies(advert, r) for r in roles)
        ):
            return True
    return False
