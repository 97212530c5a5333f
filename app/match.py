"""The matcher and the width cap (SPEC §5). Pure: plain data in, a decision out, no I/O.

``match`` knows nothing of why a node is unavailable (busy or draining); callers pass the set.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Reject:
    """``code`` 422: the live fleet can never satisfy the role; 409: all candidates occupied."""

    code: int
    role: str
    reason: str


def satisfies(advert: Advert, role: Role) -> bool:
    """One capability entry with the role's name and every requested attribute equal (SPEC §3)."""
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
    them (SPEC §5)."""
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
                422, role.name, f"need {role.count}, fleet has {len(nodes)} - {describe(role)}"
            )
    chosen: list[tuple[str, tuple[str, ...]]] = []
    for role, nodes in zip(requires, satisfying):
        free = [a.node_id for a in nodes if a.node_id not in unavailable]
        if len(free) < role.count:
            return Reject(
                409, role.name, f"need {role.count}, currently {len(free)} - {describe(role)}"
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
                422, role.name, f"need {role.count}, fleet has {got.found} - {describe(role)}"
            )
    chosen: list[tuple[str, tuple[str, ...]]] = []
    for role, got in zip(requires, firsts):
        if len(got.free) < role.count:
            return Reject(
                409, role.name, f"need {role.count}, currently {len(got.free)} - {describe(role)}"
            )
        chosen.append((role.name, got.free[: role.count]))
    return Assignment(tuple(chosen))
