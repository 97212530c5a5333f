"""The verdict: ``success_when`` evaluation (SPEC §8 settle). Pure: facts in, a verdict out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.contract import parse_requirement
from app.match import Advert, describe, satisfies


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
    """The paths a step's result reports in ``changed`` (SPEC §19.9). The result is the node's
    word, kept as sent, so anything but a list of strings there counts as nothing changed."""
    changed = (result or {}).get("changed")
    if not isinstance(changed, list):
        return frozenset()
    return frozenset(p for p in changed if isinstance(p, str))


def evaluate(
    success_when: Sequence[Mapping[str, Any]], steps: Sequence[StepFacts], fleet: Sequence[Advert]
) -> dict[str, Any]:
    failed = [st for st in steps if st.state == "FAILED"]
    if failed:
        # Any step FAILED -> the run FAILED: a step did not complete.
        failures = [
            {
                "step": st.id,
                "what": "ran",
                "want": "DONE",
                "got": "FAILED",
                "ok": False,
                "note": "a step did not complete",
            }
            for st in failed
        ]
        return {"state": "FAILED", "checks": failures}
    by_id = {st.id: st for st in steps}
    checks: list[dict[str, Any]] = []
    fleet_info: dict[str, Any] | None = None
    conditioned = vacuous = 0
    for cond in success_when:
        if "fleet_has" in cond:
            role = parse_requirement(cond["fleet_has"], "success_when.fleet_has", need_as=False)
            want = int(cond.get("min_count", 1))
            nodes = sorted(a.node_id for a in fleet if satisfies(a, role))
            checks.append(
                {
                    "what": "fleet_has",
                    "want": want,
                    "got": len(nodes),
                    "ok": len(nodes) >= want,
                    "note": describe(role),
                }
            )
            fleet_info = fleet_info or {"live": len(fleet), "matched": {}}
            fleet_info["matched"][describe(role)] = nodes
            continue
        st = by_id[cond["step"]]
        conditioned += 1
        if st.state == "SKIPPED" and not st.chosen:
            # A branch not taken is vacuously fine, unless a dispatch chose it.
            vacuous += 1
            checks.append(
                {
                    "step": st.id,
                    "what": "skipped",
                    "want": None,
                    "got": "SKIPPED",
                    "ok": True,
                    "note": "skipped: vacuously ok",
                }
            )
            continue
        if not st.has_result or st.state == "SKIPPED":
            checks.append(
                {"step": st.id, "what": "ran", "want": "DONE", "got": st.state, "ok": False}
            )
            continue
        judged = False
        if "produced" in cond:
            want_names = list(cond["produced"])
            got = [n for n in want_names if n in st.produced]
            checks.append(
                {
                    "step": st.id,
                    "what": "produced",
                    "want": want_names,
                    "got": got,
                    "ok": len(got) == len(want_names),
                }
            )
            judged = True
        if "exit_code" in cond:
            checks.append(
                {
                    "step": st.id,
                    "what": "exit_code",
                    "want": cond["exit_code"],
                    "got": st.exit_code,
                    "ok": st.exit_code == cond["exit_code"],
                }
            )
            judged = True
        if cond.get("changed"):  # an empty list asks nothing, as in the original system
            want_paths = list(cond["changed"])
            changed = [p for p in want_paths if p in st.changed]
            check: dict[str, Any] = {
                "step": st.id,
                "what": "changed",
                "want": want_paths,
                "got": changed,
                "ok": len(changed) == len(want_paths),
            }
            if not check["ok"]:
                missing = dict.fromkeys(p for p in want_paths if p not in st.changed)
                check["note"] = f"not changed during this step: {', '.join(missing)}"
            checks.append(check)
            judged = True
        if cond.get("within_attempts"):
            checks.append(
                {
                    "step": st.id,
                    "what": "within_attempts",
                    "want": True,
                    "got": not st.exhausted,
                    "ok": not st.exhausted,
                }
            )
            judged = True
        if not judged:
            checks.append(
                {
                    "step": st.id,
                    "what": "ran",
                    "want": "DONE",
                    "got": st.state,
                    "ok": st.state == "DONE",
                }
            )
    if conditioned and vacuous == conditioned:
        checks.append({"what": "any", "ok": False, "note": "every conditioned step was skipped"})
    verdict: dict[str, Any] = {
        "state": "SUCCEEDED" if all(c["ok"] for c in checks) else "FAILED",
        "checks": checks,
    }
    if fleet_info is not None:
        verdict["fleet"] = fleet_info
    return verdict
