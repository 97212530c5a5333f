"""The matcher and the width cap (docs/contract.md#requirements-and-how-runs-are-placed). Pure:
plain data in, a decision out, no I/O.

``match`` knows nothing of why a node is unavailable (busy or draining); callers pass the set.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from app.contract.types import Role


@dataclass(frozen=True)
class Capability:
    name: str
    attrs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Advert:
    node_id: str
    capabilities: tuple[Capability, ...] = ()
    label: str | None = None

    @property
    def attr_count(self) -> int:
        """The total number of attributes over all capability entries (the candidate order)."""
        return sum(len(c.attrs) for c in self.capabilities)


@dataclass(frozen=True)
class Assignment:
    """Role name -> the nodes that fill it, in the role order of the contract."""

    roles: tuple[tuple[str, tuple[str, ...]], ...]

    def nodes(self) -> list[str]:
        """Distinct nodes in order of first appearance: one lease each."""
        seen: dict[str, None] = {}
        for _, nodes in self.roles:
            for node in nodes:
                seen.setdefault(node, None)
        return list(seen)

    def by_role(self) -> dict[str, tuple[str, ...]]:
        return dict(self.roles)


class Why(enum.Enum):
    """Why a role cannot be filled now."""

    NEVER = "never"  # the live fleet has too few nodes that fit it: the run can never be placed
    NOT_NOW = "not_now"  # enough fit, but too few are free: the run waits


NEVER, NOT_NOW = Why.NEVER, Why.NOT_NOW


@dataclass(frozen=True)
class Reject:
    """A role that cannot be filled, ``why``, and the reason as the run's view shows it."""

    why: Why
    role: str
    reason: str


def satisfies(advert: Advert, role: Role) -> bool:
    """One capability entry with the role's name and every requested attribute equal
    (docs/contract.md#requirements-and-how-runs-are-placed)."""
    for cap in advert.capabilities:
        if cap.name == role.capability and all(
            cap.attrs.get(k) == v for k, v in role.attrs.items()
        ):
            return True
    return False


def describe(role: Role) -> str:
    """``board soc=imx8mp``: the requirement as it appears in reasons."""
    attrs = " ".join(f"{k}={v}" for k, v in sorted(role.attrs.items()))
    return f"{role.capability} {attrs}".rstrip()


def candidate_order(adverts: Iterable[Advert]) -> list[Advert]:
    """Fewer attributes first, then node_id: rare, specialised nodes stay free for runs that need
    them (docs/contract.md#requirements-and-how-runs-are-placed)."""
    return sorted(adverts, key=lambda a: (a.attr_count, a.node_id))


def match(
    requires: Sequence[Role],
    adverts: Sequence[Advert],
    unavailable: Collection[str],
    *,
    ordered: bool = False,
) -> Assignment | Reject:
    """Assign nodes to every role, or say why not. ``ordered`` = adverts are already in
    :func:`candidate_order` (a wake scan sorts once for many matches)."""
    fleet = adverts if ordered else candidate_order(adverts)
    satisfying: list[list[Advert]] = [[a for a in fleet if satisfies(a, r)] for r in requires]
    # Pass 1 for every role before any role in pass 2: a permanent rejection wins over a busy one.
    for role, nodes in zip(requires, satisfying):
        if len(nodes) < role.count:
            return Reject(
                NEVER, role.name, f"need {role.count}, fleet has {len(nodes)} - {describe(role)}"
            )
    chosen: list[tuple[str, tuple[str, ...]]] = []
    for role, nodes in zip(requires, satisfying):
        free = [a.node_id for a in nodes if a.node_id not in unavailable]
        if len(free) < role.count:
            return Reject(
                NOT_NOW, role.name, f"need {role.count}, currently {len(free)} - {describe(role)}"
            )
        # Distinct within a role (the list has no repeats); several roles may share a node.
        chosen.append((role.name, tuple(free[: role.count])))
    return Assignment(tuple(chosen))


def width_exceeded(assignment: Assignment, max_per_run: int) -> str | None:
    """The width cap: distinct nodes over ``lease.max_per_run`` (0 = no cap), else None."""
    width = len(assignment.nodes())
    if max_per_run and width > max_per_run:
        return f"requires exceeds the width limit: {width} nodes, limit {max_per_run}"
    return None


# How many choices the search for an assignment within the width cap may make before it gives up
# with the matcher's first answer (docs/contract.md#requirements-and-how-runs-are-placed). A choice
# is the set of nodes one role adds to the run's (or none); classes of interchangeable nodes (below)
# keep a fleet of many alike nodes at one choice per class. A search that fits, or finds that
# nothing can, mostly ends after a handful of choices; only a tangle of nodes that each fill a
# different few roles reaches the bound, at 3-6 us a choice on a 2-core machine: at most about 10
# ms, paid only by a submit that would have been refused and by a promotion that stays QUEUED (again
# at each scan while it waits). Fleets of up to 5 free nodes for 3 roles never reach it
# (tests/unit).
FIT_TRIES = 2_000


def match_within_cap(
    requires: Sequence[Role],
    adverts: Sequence[Advert],
    unavailable: Collection[str],
    max_per_run: int,
    *,
    ordered: bool = False,
    tries: int = FIT_TRIES,
) -> Assignment | Reject:
    """:func:`match`; when its assignment has more distinct nodes than ``max_per_run`` (0 = no
    cap), the one :func:`fit_within_cap` finds instead, if any, else :func:`match`'s answer
    unchanged (:func:`width_exceeded` then says why). Within the cap nothing more runs: the same
    answer as :func:`match`, at its cost."""
    fleet = adverts if ordered else candidate_order(adverts)
    outcome = match(requires, fleet, unavailable, ordered=True)
    if isinstance(outcome, Reject) or not width_exceeded(outcome, max_per_run):
        return outcome
    within = fit_within_cap(requires, fleet, unavailable, max_per_run, ordered=True, tries=tries)
    return outcome if within is None else within


class _OutOfTries(Exception):
    pass


def fit_within_cap(
    requires: Sequence[Role],
    adverts: Sequence[Advert],
    unavailable: Collection[str],
    max_per_run: int,
    *,
    ordered: bool = False,
    tries: int = FIT_TRIES,
) -> Assignment | None:
    """An assignment of every role to ``count`` distinct free nodes that fill it, with at most
    ``max_per_run`` distinct nodes in all (a node filling several roles is leased once), or
    None: there is none, or ``tries`` choices did not find one.

    Depth first over the roles, those with the fewest free nodes first (then in contract order):
    a role keeps the run's nodes that fill it (in candidate order) and adds as few new nodes as
    it can, new ones in candidate order. New nodes that fill the same later roles are
    interchangeable for the rest of the search, so a role's choice is how many it adds of each
    such class (the first ones of the class), not which. A choice is cut when the run's nodes
    plus what some later role must still add exceed the cap. A role's nodes are listed in
    candidate order, as :func:`match` lists them."""
    if not max_per_run or any(r.count > max_per_run for r in requires):
        return None
    fleet = adverts if ordered else candidate_order(adverts)
    rank = {a.node_id: k for k, a in enumerate(fleet)}  # candidate order
    free = [
        [a.node_id for a in fleet if a.node_id not in unavailable and satisfies(a, r)]
        for r in requires
    ]
    if any(len(nodes) < r.count for r, nodes in zip(requires, free)):
        return None
    # The roles with the fewest free nodes go first: they decide most, and the others then find
    # those nodes among the run's.
    order = sorted(range(len(requires)), key=lambda i: (len(free[i]), i))
    counts = [requires[i].count for i in order]
    fills: dict[str, int] = {}  # node -> a bit for each role (in search order) it may fill
    for bit, i in enumerate(order):
        for n in free[i]:
            fills[n] = fills.get(n, 0) | 1 << bit
    # Per role: its free nodes grouped by the later roles they fill, each class in candidate
    # order.
    classes: list[list[tuple[int, list[str]]]] = []
    for bit, i in enumerate(order):
        grouped: dict[int, list[str]] = {}
        for n in free[i]:
            grouped.setdefault(fills[n] >> (bit + 1), []).append(n)
        classes.append(list(grouped.items()))
    left = [tries]

    def place(i: int, used: frozenset[str], have: list[int]) -> list[tuple[str, ...]] | None:
        """The nodes of roles ``i`` on, given the run's nodes ``used``, of which ``have[j]`` fill
        role ``j``; None: no fit."""
        if i == len(counts):
            return []
        room = max_per_run - len(used)
        mine = sorted((n for n in used if fills[n] >> i & 1), key=rank.__getitem__)
        # The classes' first nodes not yet the run's, classes in the order of those.
        avail = sorted(
            (
                (later, firsts)
                for later, members in classes[i]
                if (firsts := list(islice((n for n in members if n not in used), room)))
            ),
            key=lambda cls: rank[cls[1][0]],
        )
        sizes = [len(members) for _, members in avail]
        for new in range(max(0, counts[i] - len(mine)), min(counts[i], room) + 1):
            for spread in _spreads(sizes, new):
                if left[0] <= 0:
                    raise _OutOfTries
                left[0] -= 1
                grown = list(have)
                for c, k in spread:
                    later, j = avail[c][0], i + 1
                    while later:
                        if later & 1:
                            grown[j] += k
                        later >>= 1
                        j += 1
                width = len(used) + new
                if any(
                    width + counts[j] - grown[j] > max_per_run for j in range(i + 1, len(counts))
                ):
                    continue
                fresh = [n for c, k in spread for n in avail[c][1][:k]]
                rest = place(i + 1, used | frozenset(fresh), grown)
                if rest is not None:
                    chosen = sorted(mine[: counts[i] - new] + fresh, key=rank.__getitem__)
                    return [tuple(chosen), *rest]
        return None

    try:
        found = place(0, frozenset(), [0] * len(counts))
    except _OutOfTries:
        return None
    if found is None:
        return None
    by_role = dict(zip(order, found))
    return Assignment(tuple((r.name, by_role[i]) for i, r in enumerate(requires)))


def _spreads(sizes: Sequence[int], total: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every way to take ``total`` items from classes of ``sizes``, as (class, how many) pairs
    without zeros, more from earlier classes first (descending lexicographic order). Iterative:
    each next way costs its own length, whatever the number of classes."""
    holds = [0] * (len(sizes) + 1)  # holds[c]: what the classes from c on hold
    for c in range(len(sizes) - 1, -1, -1):
        holds[c] = holds[c + 1] + sizes[c]
    if holds[0] < total:
        return

    def fill(c: int, left: int, out: list[tuple[int, int]]) -> None:
        while left:
            if sizes[c]:
                k = min(sizes[c], left)
                out.append((c, k))
                left -= k
            c += 1

    spread: list[tuple[int, int]] = []
    fill(0, total, spread)
    while True:
        yield tuple(spread)
        # The last pair that can give one item to the classes after it takes one less, and the
        # classes after it are filled again from the left.
        tail = 0
        for p in range(len(spread) - 1, -1, -1):
            c, k = spread[p]
            if holds[c + 1] > tail:
                del spread[p:]
                if k > 1:
                    spread.append((c, k - 1))
                fill(c + 1, tail + 1, spread)
                break
            tail += k
        else:
            return


def adverts_from_rows(rows: Iterable[tuple[str, object, str | None]]) -> list[Advert]:
    """(node_id, capabilities JSON, label) rows to adverts; malformed entries are ignored."""
    out = []
    for node_id, caps, label in rows:
        entries = []
        for c in caps if isinstance(caps, list) else []:
            if isinstance(c, dict) and isinstance(c.get("capability"), str):
                attrs = c["attrs"] if isinstance(c.get("attrs"), dict) else {}
                entries.append(Capability(c["capability"], {str(k): v for k, v in attrs.items()}))
        out.append(Advert(node_id, tuple(entries), label))
    return out


@dataclass(frozen=True)
class Firsts:
    """What a bounded candidate read found for one requirement (one containment key), read up to
    ``limit`` nodes: the satisfying live nodes, free ones first, each part in candidate order.
    ``free``: those not unavailable, in order; ``found``: how many were read in all."""

    free: tuple[str, ...]
    found: int
    limit: int


def match_firsts(requires: Sequence[Role], firsts: Sequence[Firsts]) -> Assignment | Reject:
    """:func:`match` when each role's candidates were read bounded (``firsts[i]`` for
    ``requires[i]``, its ``limit`` at least the role's count): the same assignment and the same
    reasons. Fewer read than the limit means the fleet has exactly that many satisfying nodes;
    free nodes come first, so fewer free than the limit means exactly that many are free."""
    for role, got in zip(requires, firsts):
        if got.found < role.count:
            return Reject(
                NEVER, role.name, f"need {role.count}, fleet has {got.found} - {describe(role)}"
            )
    chosen: list[tuple[str, tuple[str, ...]]] = []
    for role, got in zip(requires, firsts):
        if len(got.free) < role.count:
            return Reject(
                NOT_NOW,
                role.name,
                f"need {role.count}, currently {len(got.free)} - {describe(role)}",
            )
        chosen.append((role.name, got.free[: role.count]))
    return Assignment(tuple(chosen))


def match_pinned(
    requires: Sequence[Role],
    adverts: Sequence[Advert],
    unavailable: Collection[str],
    pinned: str,
    *,
    pinned_free: bool,
) -> Assignment | Reject:
    """A health run's match (docs/operators.md, "Health runs"): its first role is filled by its
    pinned node alone, whatever that node's quarantine (``pinned_free``: the node is unavailable
    for nothing but its quarantine, or not at all), the other roles as usual, without it."""
    first, rest = requires[0], list(requires[1:])
    pin = next((a for a in adverts if a.node_id == pinned), None)
    if pin is None or not satisfies(pin, first):
        return Reject(NOT_NOW, first.name, f"the pinned node {pinned} is not live or does not fit")
    if pinned in unavailable and not pinned_free:
        return Reject(NOT_NOW, first.name, f"the pinned node {pinned} is busy or draining")
    if not rest:
        return Assignment(((first.name, (pinned,)),))
    outcome = match(rest, adverts, set(unavailable) | {pinned}, ordered=True)
    if isinstance(outcome, Reject):
        return outcome
    return Assignment(((first.name, (pinned,)), *outcome.roles))
