"""The verdict: ``success_when`` evaluation (docs/design.md#settle-and-the-verdict). Pure: facts in,
a verdict out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.contract import parse_requirement
from app.match import Advert, describe, satisfies
from app.states import DONE, FAILED, SKIPPED, SUCCEEDED


@dataclass(frozen=True)
class StepFacts:
    id: str
    kind: str
    state: str
    exit_code: int | None
    produced: frozenset[str]  # produced AND accepted by its schema
    chosen: bool  # a dispatch chose this step
    has_result: bool
    exhausted: bool = False  # a loop/validate_with ran out of attempts on it
    changed: frozenset[str] = frozenset()  # workspace paths its result reports as changed


def changed_paths(result: Mapping[str, Any] | None) -> frozenset[str]:
    """The paths a step's result reports in ``changed`` (docs/contract.md#success_when). The result
    is the node's word, kept as sent, so anything but a list of strings there counts as nothing
    changed."""
    changed = (result or {}).get("changed")
    if not isinstance(changed, list):
        return frozenset()
    return frozenset(p for p in changed if isinstance(p, str))


Check = dict[str, Any]


def _ran(st: StepFacts, ok: bool, note: str | None = None) -> Check:
    check: Check = {"step": st.id, "what": "ran", "want": DONE, "got": st.state, "ok": ok}
    if note is not None:
        check["note"] = note
    return check


def _all_of(st: StepFacts, what: str, want: list[str], have: frozenset[str]) -> Check:
    got = [name for name in want if name in have]
    return {"step": st.id, "what": what, "want": want, "got": got, "ok": len(got) == len(want)}


def _produced(cond: Mapping[str, Any], st: StepFacts) -> Check | None:
    """``produced``: every named artifact was produced and accepted by its schema."""
    if "produced" not in cond:
        return None
    return _all_of(st, "produced", list(cond["produced"]), st.produced)


def _exit_code(cond: Mapping[str, Any], st: StepFacts) -> Check | None:
    """``exit_code``: the step's result carries exactly this exit code."""
    if "exit_code" not in cond:
        return None
    want = cond["exit_code"]
    return {
        "step": st.id,
        "what": "exit_code",
        "want": want,
        "got": st.exit_code,
        "ok": st.exit_code == want,
    }


def _changed(cond: Mapping[str, Any], st: StepFacts) -> Check | None:
    """``changed``: the step's result reports every listed workspace path as changed (an empty
    list asks nothing, as in the original system)."""
    if not cond.get("changed"):
        return None
    check = _all_of(st, "changed", list(cond["changed"]), st.changed)
    if not check["ok"]:
        missing = dict.fromkeys(p for p in check["want"] if p not in st.changed)
        check["note"] = f"not changed during this step: {', '.join(missing)}"
    return check


def _within_attempts(cond: Mapping[str, Any], st: StepFacts) -> Check | None:
    """``within_attempts``: no loop or ``validate_with`` ran out of attempts on the step."""
    if not cond.get("within_attempts"):
        return None
    ok = not st.exhausted
    return {"step": st.id, "what": "within_attempts", "want": True, "got": ok, "ok": ok}


# One checker per kind of step condition; a condition naming none of them asks that the step ran.
STEP_CHECKERS = (_produced, _exit_code, _changed, _within_attempts)


def _step_checks(cond: Mapping[str, Any], st: StepFacts) -> list[Check]:
    """The checks of one condition on a step that has a result and was not skipped."""
    checks = [c for checker in STEP_CHECKERS if (c := checker(cond, st)) is not None]
    return checks or [_ran(st, st.state == DONE)]


def _fleet_has(cond: Mapping[str, Any], fleet: Sequence[Advert]) -> tuple[Check, str, list[str]]:
    """``fleet_has``: at least ``min_count`` live nodes meet the requirement; also the nodes."""
    role = parse_requirement(cond["fleet_has"], "success_when.fleet_has", need_as=False)
    want = int(cond.get("min_count", 1))
    nodes = sorted(a.node_id for a in fleet if satisfies(a, role))
    what = describe(role)
    check = {"what": "fleet_has", "want": want, "got": len(nodes), "ok": len(nodes) >= want}
    return {**check, "note": what}, what, nodes


def evaluate(
    success_when: Sequence[Mapping[str, Any]], steps: Sequence[StepFacts], fleet: Sequence[Advert]
) -> dict[str, Any]:
    """The run's verdict from its ``success_when`` (docs/design.md#settle-and-the-verdict): FAILED
    at once when a step FAILED; otherwise one check or more per condition, SUCCEEDED when every
    check is ok. A step skipped because no dispatch chose it passes vacuously, but not every
    conditioned step may be skipped. ``fleet`` (the live adverts) answers ``fleet_has``
    conditions."""
    failed = [st for st in steps if st.state == FAILED]
    if failed:
        return {
            "state": FAILED,
            "checks": [_ran(st, False, "a step did not complete") for st in failed],
        }
    by_id = {st.id: st for st in steps}
    checks: list[Check] = []
    matched: dict[str, list[str]] = {}
    conditioned = vacuous = 0
    for cond in success_when:
        if "fleet_has" in cond:
            check, what, nodes = _fleet_has(cond, fleet)
            checks.append(check)
            matched[what] = nodes
            continue
        st = by_id[cond["step"]]
        conditioned += 1
        if st.state == SKIPPED and not st.chosen:
            # A branch not taken is vacuously fine, unless a dispatch chose it.
            vacuous += 1
            skipped = {"step": st.id, "what": "skipped", "want": None, "got": SKIPPED, "ok": True}
            checks.append({**skipped, "note": "skipped: vacuously ok"})
        elif not st.has_result or st.state == SKIPPED:
            checks.append(_ran(st, False))
        else:
            checks.extend(_step_checks(cond, st))
    if conditioned and vacuous == conditioned:
        checks.append({"what": "any", "ok": False, "note": "every conditioned step was skipped"})
    verdict: dict[str, Any] = {
        "state": SUCCEEDED if all(c["ok"] for c in checks) else FAILED,
        "checks": checks,
    }
    if any("fleet_has" in cond for cond in success_when):
        verdict["fleet"] = {"live": len(fleet), "matched": matched}
    return verdict
