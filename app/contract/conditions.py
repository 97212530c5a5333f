"""``success_when`` (docs/contract.md#success_when): conditions on a step's outcome or on the fleet.

Checked only for shape and for what can ever hold; ``app.verdict`` evaluates them at settle.
"""

from __future__ import annotations

from typing import Any

from app.contract.fields import (
    article,
    check_artifact_names,
    check_dict,
    check_exit_code,
    check_field,
    check_int,
    check_str_list,
    fail,
    ignored_fields,
    is_relative_path,
    parse_requirement,
    quote,
)
from app.contract.steps import Draft

MAX_CONDITIONS = 500  # success_when is bounded like steps: one condition per step is plenty
STEP_CONDITION_KEYS = ("step", "produced", "exit_code", "changed", "within_attempts")
FLEET_CONDITION_KEYS = ("fleet_has", "min_count")


def parse_success_when(
    doc: dict[str, Any], by_id: dict[str, Draft], known: frozenset[str], ignored: list[str]
) -> tuple[dict[str, Any], ...]:
    """The conditions as submitted; a warning per field a condition does not know is appended to
    ``ignored`` (ignored, not refused: docs/contract.md#warnings). The verdict reads only the fields
    it knows."""
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
            ignored.extend(ignored_fields(cond, STEP_CONDITION_KEYS, f"success_when[{i}]"))
            _check_step_condition(cond, f"success_when[{i}]", by_id)
        else:
            ignored.extend(ignored_fields(cond, FLEET_CONDITION_KEYS, f"success_when[{i}]"))
            _check_fleet_condition(cond, f"success_when[{i}]", known)
    return tuple(conditions)


def _check_step_condition(cond: dict[str, Any], path: str, by_id: dict[str, Draft]) -> None:
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
        check_exit_code(cond["exit_code"], f"{path}.exit_code")
    if "changed" in cond:
        _check_changed(cond["changed"], path, step)
    if "within_attempts" in cond and not isinstance(cond["within_attempts"], bool):
        fail(f"{path}.within_attempts must be true or false, got {quote(cond['within_attempts'])}")


def _check_changed(value: object, path: str, step: Draft) -> None:
    """``changed`` (docs/contract.md#success_when): workspace paths the step must have changed. An
    empty list asks nothing (the original reads it as absent)."""
    paths = check_str_list(value, f"{path}.changed", "relative paths")
    if not paths:
        return
    if "workspace" not in step.spec:
        # Without a workspace nothing can be measured as changed: the check could never hold.
        fail(f"{path}.changed needs a workspace, but step {quote(step.id)} has none")
    for i, rel in enumerate(paths):
        if not is_relative_path(rel):
            fail(
                f'{path}.changed[{i}] must be a relative path with no ".." component, '
                f"got {quote(rel)}"
            )


def _check_fleet_condition(cond: dict[str, Any], path: str, known: frozenset[str]) -> None:
    # A fleet requirement names no role, so "as" is optional here.
    parse_requirement(cond["fleet_has"], f"{path}.fleet_has", capabilities=known, need_as=False)
    if "min_count" in cond:
        check_int(cond["min_count"], f"{path}.min_count", 1)
