"""Contracts as the tests submit them: a role, a contract of roles and steps, and the shapes
many tests share (one step, two steps, a loop, an acquire, priorities, an ask)."""

from __future__ import annotations

from typing import Any


def role(name: str, capability: str = "board", count: int = 1, **attrs: str) -> dict[str, Any]:
    r: dict[str, Any] = {"as": name, "capability": capability, **attrs}
    if count != 1:
        r["count"] = count
    return r


def contract(
    run_id: str, *roles: dict[str, Any], steps: list[dict[str, Any]] | None = None, **top: Any
) -> dict[str, Any]:
    roles = roles or (role("dut"),)
    if steps is None:
        steps = [{"id": f"use-{r['as']}", "uses": r["as"], "run": ["true"]} for r in roles]
    return {"run_id": run_id, "requires": list(roles), "steps": steps, **top}


def two_steps(run_id: str, uses: str = "dut", **top: Any) -> dict[str, Any]:
    """flash then boot on one node of role ``uses``; boot needs flash (the default)."""
    return contract(
        run_id,
        role(uses),
        steps=[
            {"id": "flash", "uses": uses, "run": ["flash"]},
            {"id": "boot", "uses": uses, "run": ["boot"]},
        ],
        **top,
    )


def one_step(run_id: str, uses: str = "dut", capability: str = "board") -> dict[str, Any]:
    return contract(
        run_id, role(uses, capability), steps=[{"id": "work", "uses": uses, "run": ["x"]}]
    )


def two_free_steps(run_id: str = "run-1") -> dict[str, Any]:
    """Two steps on the one board, both startable at once (explicit ``needs: []``)."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {"id": "flash", "uses": "dut", "run": ["flash"]},
            {"id": "boot", "uses": "dut", "run": ["boot"], "needs": []},
        ],
    )


def slotted_two_steps(run_id: str, slot: str = "s") -> dict[str, Any]:
    """flash then boot on one board whose ``slot`` attribute is ``slot``."""
    return contract(
        run_id,
        role("dut", slot=slot),
        steps=[
            {"id": "flash", "uses": "dut", "run": ["flash"]},
            {"id": "boot", "uses": "dut", "run": ["boot"]},
        ],
    )


def build_then_test(run_id: str) -> dict[str, Any]:
    """build -> test, which loops back to build until its exit code is 0 (at most 3 times)."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {"id": "build", "uses": "dut", "run": ["make"]},
            {
                "id": "test",
                "uses": "dut",
                "run": ["make", "check"],
                "loop": {"back_to": "build", "max": 3, "until": {"exit_code": 0}},
            },
        ],
    )


def chain_over_two_nodes(run_id: str = "run-1") -> dict[str, Any]:
    """Step 1 on the host (node A), step 2 on the board (node B) needing step 1."""
    return contract(
        run_id,
        role("host", "agent.reason"),
        role("dut"),
        steps=[
            {"id": "build", "uses": "host", "run": ["build"]},
            {"id": "boot", "uses": "dut", "run": ["boot"]},
        ],
    )


def contract_naming(where: str, name: str) -> tuple[dict[str, Any], str]:
    """A contract that uses ``name`` as an artifact name at ``where``; the field's path."""
    run = {"id": "s", "uses": "dut", "run": ["x"], "out": ["ok.json"]}
    steps: list[dict[str, Any]] = [run]
    top: dict[str, Any] = {}
    if where == "out":
        run["out"] = ["ok.json", name]
        path = "steps[0].out[1]"
    elif where == "in.from":
        steps.append({"id": "t", "uses": "dut", "run": ["y"], "in": {"from": [name]}})
        path = "steps[1].in.from[0]"
    elif where == "ask.out":
        steps.append({"id": "q", "ask": {"prompt": "ok?"}, "out": [name]})
        path = "steps[1].out[0]"
    elif where == "ask.show":
        steps.append({"id": "q", "ask": {"prompt": "ok?", "show": [name]}, "out": ["d"]})
        path = "steps[1].ask.show[0]"
    elif where == "loop.until.produced":
        loop = {"back_to": "s", "max": 2, "until": {"produced": [name]}}
        steps.append({"id": "t", "uses": "dut", "run": ["y"], "out": [name], "loop": loop})
        path = "steps[1].out[0]"
    elif where == "success_when.produced":
        top["success_when"] = [{"step": "s", "produced": [name]}]
        path = "success_when[0].produced[0]"
    else:  # pragma: no cover - a mistake in the table below
        raise AssertionError(where)
    return contract("r1", role("dut"), steps=steps, **top), path


def acquire_step(
    step_id: str, want: str, capability: str, acquired: str, unavailable: str, **more: Any
) -> dict[str, Any]:
    """A step that acquires one more node (docs/contract.md#acquire), held as role ``want``:
    ``acquired`` runs if it gets one of ``capability``, ``unavailable`` if not; ``more`` adds
    keys to the step (``needs``, say)."""
    return {
        "id": step_id,
        "acquire": {
            "want": {"as": want, "capability": capability},
            "acquired": acquired,
            "unavailable": unavailable,
        },
        **more,
    }


def acquire_run(run_id: str = "r1", **top: Any) -> dict[str, Any]:
    """prep on the board, then grab one scope: measure on it, or fallback on the board."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {"id": "prep", "uses": "dut", "run": ["prep"]},
            acquire_step("grab", "scope", "scope", "measure", "fallback"),
            {"id": "measure", "uses": "scope", "run": ["measure"]},
            {"id": "fallback", "uses": "dut", "run": ["fallback"]},
        ],
        **top,
    )


def probing_run(run_id: str, **top: Any) -> dict[str, Any]:
    """A board run whose first step acquires a scope at once (at its placement): with-scope on
    the scope if it gets one, else without-scope on the board."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            acquire_step("get-scope", "scope", "scope", "with-scope", "without-scope", needs=[]),
            {"id": "with-scope", "uses": "scope", "run": ["measure"]},
            {"id": "without-scope", "uses": "dut", "run": ["estimate"], "needs": ["get-scope"]},
        ],
        **top,
    )


def crossing_acquires(run_id: str) -> dict[str, Any]:
    """Two acquire steps over the same two targets: the scope is got (its ``unavailable`` target,
    ``probe_only``, is SKIPPED), the probe is not (its ``acquired`` target, ``scope_only``, is
    SKIPPED). Every step settles at once, so the run ends inside the transaction that promotes
    it."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            acquire_step("grab_scope", "scope", "scope", "scope_only", "probe_only"),
            acquire_step("grab_probe", "probe", "probe", "scope_only", "probe_only"),
            {"id": "scope_only", "uses": "dut", "run": ["measure"]},
            {"id": "probe_only", "uses": "dut", "run": ["probe"]},
        ],
    )


def single(run_id: str, priority: int = 0, **attrs: str) -> dict[str, Any]:
    """One board, one step; ``queue.priority`` when not 0."""
    doc = contract(run_id, role("dut", **attrs))
    if priority:
        doc["queue"] = {"priority": priority}
    return doc


def wide(run_id: str, count: int = 2, priority: int = 0, **queue: Any) -> dict[str, Any]:
    """``count`` boards in one role, one step on them."""
    doc = contract(run_id, role("duts", count=count))
    if priority or queue:
        doc["queue"] = {**queue, **({"priority": priority} if priority else {})}
    return doc


def ask_contract(run_id: str, **ask: Any) -> dict[str, Any]:
    """An ask raised at creation (needs nothing), then a board step after it."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {
                "id": "approve",
                "ask": {"prompt": "Looks right?", **ask},
                "out": ["decision"],
                "schema": {
                    "decision": {
                        "type": "object",
                        "properties": {"verdict": {"enum": ["approve", "reject"]}},
                    }
                },
            },
            {"id": "flash", "uses": "dut", "run": ["flash-image"]},
        ],
    )
