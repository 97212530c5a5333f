"""Turning a matcher assignment into what the store writes: assigned, leases, step binding."""

from __future__ import annotations

from typing import Any

from app.contract.types import Role
from app.match import Assignment
from app.store.leases import Grant


def assigned_json(assignment: Assignment) -> list[dict[str, Any]]:
    return [{"as": role, "nodes": list(nodes)} for role, nodes in assignment.roles]


def grants(assignment: Assignment, roles: tuple[Role, ...] | list[Role]) -> list[Grant]:
    """One lease per distinct node, named after the first role it fills
    (docs/queue.md#heartbeats-what-a-node-learns)."""
    capability = {r.name: r.capability for r in roles}
    out: dict[str, Grant] = {}
    for role, nodes in assignment.roles:
        for node in nodes:
            out.setdefault(node, Grant(node, role, capability[role]))
    return list(out.values())


def node_for_role(assignment: Assignment) -> dict[str, str]:
    """Steps of a role bind to the role's first node
    (docs/contract.md#requirements-and-how-runs-are-placed, count > 1)."""
    return {role: nodes[0] for role, nodes in assignment.roles}
