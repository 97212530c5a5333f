"""The rules between steps (docs/contract.md#validation-errors): role and step references, backward
needs, branch targets of dispatch and acquire, loops and validators, what is read; the needs
defaults; where ``release`` may stand; and the warnings about roles no step uses.

Each rule runs over all steps before the next rule starts, so the first failure is well defined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.contract.fields import fail, quote
from app.contract.steps import Draft
from app.contract.types import Role


class Steps:
    """What the reference rules read: the drafts in order, by id, the roles declared
    (``requires`` and the roles acquire steps bind) and the artifacts some step produces."""

    def __init__(self, drafts: list[Draft], by_id: dict[str, Draft], roles: tuple[Role, ...]):
        self.drafts = drafts
        self.by_id = by_id
        self.acquirers = {d.acquire_as: d for d in drafts if d.acquire_as is not None}
        self.declared = {r.name for r in roles} | set(self.acquirers)
        self.produced = {name for d in drafts for name in d.out}


def _uses_a_declared_role_after_it_is_acquired(steps: Steps, d: Draft) -> None:
    if d.uses is not None and d.uses not in steps.declared:
        fail(f"step {quote(d.id)} uses undeclared role {quote(d.uses)}")
    grab = steps.acquirers.get(d.uses) if d.uses is not None else None
    # No node is bound to an acquired role before its acquire step has run
    # (docs/contract.md#acquire).
    if grab is not None and d.seq <= grab.seq:
        fail(
            f"step {quote(d.id)} uses role {quote(d.uses)} before step {quote(grab.id)} acquires it"
        )


def _releases_declared_roles(steps: Steps, d: Draft) -> None:
    for role in d.release:
        if role not in steps.declared:
            fail(f"step {quote(d.id)} releases undeclared role {quote(role)}")


def _needs_point_backward(steps: Steps, d: Draft) -> None:
    for need in d.needs or ():
        if need not in steps.by_id:
            fail(f"step {quote(d.id)} needs unknown step {quote(need)}")
        if steps.by_id[need].seq >= d.seq:
            fail(f"dependencies must point backward: step {quote(d.id)} needs {quote(need)}")


def _acquire_targets_are_later(steps: Steps, d: Draft) -> None:
    for key, target in zip(("acquired", "unavailable"), d.acquire_targets or (), strict=False):
        _check_later(d, target, steps.by_id, f"acquire.{key}")


def _dispatch_targets_are_later(steps: Steps, d: Draft) -> None:
    for target in d.dispatch_to:
        _check_later(d, target, steps.by_id, "dispatch.to")


def _loops_go_back(steps: Steps, d: Draft) -> None:
    if d.loop_back_to is None:
        return
    back = steps.by_id.get(d.loop_back_to)
    if back is None or back.seq >= d.seq:
        fail(
            f"step {quote(d.id)}: loop.back_to must name an earlier step, "
            f"got {quote(d.loop_back_to)}"
        )


def _validators_are_later(steps: Steps, d: Draft) -> None:
    if d.validate_with is not None:
        _check_later(d, d.validate_with, steps.by_id, "validate_with")


def _reads_what_a_step_produces(steps: Steps, d: Draft) -> None:
    for name in d.reads:
        if name not in steps.produced:
            fail(f"step {quote(d.id)} reads {quote(name)}, which no step produces")


# The cross-step rules in the order their failures are reported: each runs over every step
# before the next starts, so the first failure is well defined.
REFERENCE_RULES = (
    _uses_a_declared_role_after_it_is_acquired,
    _releases_declared_roles,
    _needs_point_backward,
    _acquire_targets_are_later,
    _dispatch_targets_are_later,
    _loops_go_back,
    _validators_are_later,
    _reads_what_a_step_produces,
)


def check_references(drafts: list[Draft], by_id: dict[str, Draft], roles: tuple[Role, ...]) -> None:
    """Cross-step rules (:data:`REFERENCE_RULES`), one rule at a time over all steps, so the first
    failure is well defined."""
    steps = Steps(drafts, by_id, roles)
    for rule in REFERENCE_RULES:
        for d in drafts:
            rule(steps, d)


def _check_later(d: Draft, target: str, by_id: dict[str, Draft], what: str) -> None:
    found = by_id.get(target)
    if found is None or found.seq <= d.seq:
        fail(f"step {quote(d.id)}: {what} must name a later step, got {quote(target)}")


def normalise_needs(drafts: list[Draft], by_id: dict[str, Draft]) -> dict[int, tuple[int, ...]]:
    """``needs`` (docs/contract.md#needs): explicit ids, else the steps that dispatch to or acquire
    for this one, else the previous step; the first step waits for nothing. Returns seq -> ascending
    seqs."""
    branched_from: dict[str, set[int]] = {}
    for d in drafts:
        for target in (*d.dispatch_to, *(d.acquire_targets or ())):
            branched_from.setdefault(target, set()).add(d.seq)
    needs: dict[int, tuple[int, ...]] = {}
    for d in drafts:
        if d.needs is not None:
            seqs = {by_id[n].seq for n in d.needs}
        elif d.id in branched_from:
            seqs = branched_from[d.id]
        else:
            seqs = {d.seq - 1} if d.seq > 1 else set()
        needs[d.seq] = tuple(sorted(seqs))
    return needs


def check_releases(
    drafts: list[Draft], by_id: dict[str, Draft], needs: dict[int, tuple[int, ...]]
) -> None:
    """``release`` (docs/contract.md#release): after it, nothing may still want the node, and no
    rollback may cross it."""
    ancestors: dict[int, int] = {}  # seq -> bitset of ancestor seqs; needs point backward
    for d in drafts:
        bits = 0
        for n in needs[d.seq]:
            bits |= ancestors[n] | (1 << n)
        ancestors[d.seq] = bits
    for d in drafts:
        for role in d.release:
            for other in drafts:
                if other is not d and other.uses == role and not ancestors[d.seq] >> other.seq & 1:
                    fail(
                        f"step {quote(d.id)} releases role {quote(role)} but step "
                        f"{quote(other.id)} uses it and is not an ancestor of {quote(d.id)}"
                    )
    ranges: list[tuple[int, int, str]] = []
    for d in drafts:
        if d.loop_back_to is not None:
            ranges.append((by_id[d.loop_back_to].seq, d.seq, f"the loop of step {quote(d.id)}"))
        if d.validate_with is not None:
            ranges.append(
                (
                    d.seq,
                    by_id[d.validate_with].seq,
                    f"step {quote(d.id)} and its validator",
                )
            )
    for d in drafts:
        if not d.release:
            continue
        for first, last, what in ranges:
            if first <= d.seq <= last:
                # A rollback would reset a step onto a node whose lease was already given up.
                fail(f"step {quote(d.id)} has release but lies within {what}")


def collect_warnings(
    doc: dict[str, Any], roles: tuple[Role, ...], drafts: list[Draft], ignored: Sequence[str]
) -> tuple[str, ...]:
    """Non-blocking hints (``warnings``, docs/contract.md#warnings): few, each about something that
    costs the user. ``ignored`` are the lines about unknown fields (docs/contract.md#warnings), in
    document order."""
    warnings: list[str] = []
    if "lease" in doc:
        warnings.append("the contract's lease block is ignored: lease times are the server's")
    warnings.extend(ignored)
    used = {d.uses for d in drafts}
    for role in roles:
        if role.name not in used:
            warnings.append(
                f"role {quote(role.name)} is declared in requires but no step uses it; "
                "its node is held for the whole run"
            )
    for d in drafts:
        if d.acquire_as is not None and d.acquire_as not in used:
            warnings.append(
                f"step {quote(d.id)} acquires role {quote(d.acquire_as)} but no step uses it"
            )
    return tuple(warnings)
