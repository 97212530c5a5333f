"""The normalised contract: what validation hands to the rest of the Mediator
(docs/contract.md#writing-contracts).

Pure data; no I/O. ``validate_contract`` in ``app.contract.validate`` builds a :class:`Contract` or
raises ``app.errors.BadRequest`` naming the field and the offending value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Role:
    """One line of ``requires`` (or the ``want`` of an acquire step): a capability requirement."""

    name: str  # the contract's "as"
    capability: str
    count: int = 1
    attrs: dict[str, str] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """The output form: attributes nested, ``count`` only when it is not 1
        (docs/contract.md#requirements-and-how-runs-are-placed)."""
        out: dict[str, Any] = {"as": self.name, "capability": self.capability}
        if self.count != 1:
            out["count"] = self.count
        out["attrs"] = dict(self.attrs)
        return out


@dataclass(frozen=True)
class StepDef:
    """One step of the contract, with its seq and its normalised needs."""

    seq: int  # 1-based position in "steps"
    id: str
    kind: str  # "run" | "agent" | "ask" | "acquire"
    uses: str | None  # a role name; None for ask and acquire steps
    needs: tuple[int, ...]  # seqs of the steps this one waits for, ascending
    # the step object as submitted, without the fields it ignores (docs/contract.md#warnings)
    spec: dict[str, Any]


@dataclass(frozen=True)
class Contract:
    run_id: str
    work_id: str  # "" when the contract names no work
    requires: tuple[Role, ...]
    steps: tuple[StepDef, ...]
    success_when: tuple[dict[str, Any], ...]
    ledger_scope: str  # "run" | "work"
    queue_timeout_seconds: int | None
    warnings: tuple[str, ...]
    document: dict[str, Any]  # the submitted contract without its ignored "lease" block
    # sha256 hex of the canonical JSON of the normalised requires (docs/design.md#the-queue)
    requires_key: str
    priority: int = 0  # queue.priority (docs/priorities.md#priority): -100..100
    queue_team: str | None = None  # queue.team as named, not yet checked (docs/teams.md)
    # The run's team, chosen at submit after validation (docs/teams.md, "A run's team"):
    # validation leaves "default", the submit puts its choice here with dataclasses.replace.
    team: str = "default"


def role_from_wire(d: dict[str, Any]) -> Role:
    """The inverse of :meth:`Role.to_wire`, for requirements read back from the database."""
    return Role(d["as"], d["capability"], int(d.get("count", 1)), dict(d.get("attrs") or {}))
