"""``success_when`` (SPEC §3): conditions on a step's outcome or on the fleet.

Checked only for shape and for what can ever hold; ``app.verdict`` evaluates them at settle.
"""

from __future__ import annotations

from typing import Any

from app.contract.fields import (
    article,
    check_artifact_names,
    check_dict,
    check_field,
    check_int,
    check_keys,
    fail,
    parse_requirement,
    quote,
)
from app.contract.steps import Draft

MAX_CONDITIONS = 500  # success_when is bounded like steps: one condition per step is plenty


def parse_success_when(
    doc: dict[str, Any], by_id: dict[str, Draft], known: frozenset[str]
) -> tuple[dict[str, Any], ...]:
    if "success_when" not in doc:
        return ()
    conditions = check_field(
        doc, "success_when", "success_when", list, non_empty=False, at_most=MAX_CONDITIONS
    )
    for i, raw in enumerate(conditions):
        cond = check_dict(raw, f"success_when[{i}]")
        if ("step" in cond) == ("fleet_has" in cond):
            fail(
                f'success_when[{i}] must have exactly one of "step" or "fleet_has", '
                f"got {quote(cond)}"
            )
        if "step" in cond:
            _check_step_condition(cond, f"success_when[{i}]", by_id)
        else:
            _check_fleet_condition(cond, f"success_when[{i}]", known)
    return tuple(conditions)


def _check_step_condition(cond: dict[str, Any], path: str, by_id: dict[str, Draft]) -> None:
    check_keys(cond, ("step", "produced", "exit_code", "within_attempts"), f"{path}: ")
    step = by_id.get(cond["step"]) if isinstance(cond["step"], str) else None
    if step is None:
        fail(f"{path}.step names unknown step {quote(cond['step'])}")
    if "produced" in cond:
        for name in check_artifact_names(cond["produced"], f"{path}.produced"):
            if name not in step.out:
                # A name outside out can never be produced: the condition could only ever fail.
                fail(
                    f"{path}.produced names {quote(name)}, "
                    f"which step {quote(step.id)} does not list in out"
                )
    if "exit_code" in cond:
        if step.kind != "run":
            fail(
                f"{path}.exit_code applies only to run steps; "
                f"step {quote(step.id)} is {article(step.kind)} step"
            )
        check_int(cond["exit_code"], f"{path}.exit_code")
    if "within_attempts" in cond and not isinstance(cond["within_attempts"], bool):
        fail(f"{path}.within_attempts must be true or false, got {quote(cond['within_attempts'])}")


def _check_fleet_condition(cond: dict[str, Any], path: str, known: frozenset[str]) -> None:
    check_keys(cond, ("fleet_has", "min_count"), f"{path}: ")
    # A fleet requirement names no role, so "as" is optional here.
    parse_requirement(cond["fleet_has"], f"{path}.fleet_has", capabilities=known, need_as=False)
    if "min_count" in cond:
        check_int(cond["min_count"], f"{path}.min_count", 1)
