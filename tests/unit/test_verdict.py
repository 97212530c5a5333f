"""Unit tests of the verdict rules (docs/contract.md#success_when). ``app.verdict.evaluate`` is
pure: step facts and the live fleet in, a verdict out."""

from __future__ import annotations

from typing import Any

import pytest

from app.match import Advert, Capability
from app.verdict import StepFacts, changed_paths, evaluate

NOT_COMPLETE = "a step did not complete"


def fact(
    step_id: str,
    state: str = "DONE",
    *,
    exit_code: int | None = 0,
    produced: tuple[str, ...] = (),
    chosen: bool = False,
    exhausted: bool = False,
    kind: str = "run",
    changed: tuple[str, ...] = (),
) -> StepFacts:
    return StepFacts(
        id=step_id,
        kind=kind,
        state=state,
        exit_code=exit_code,
        produced=frozenset(produced),
        chosen=chosen,
        has_result=state == "DONE",
        exhausted=exhausted,
        changed=frozenset(changed),
    )


def node(node_id: str, capability: str, **attrs: str) -> Advert:
    return Advert(node_id, (Capability(capability, attrs),))


def checks_of(verdict: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(c.get("step"), c["what"], c["ok"]) for c in verdict["checks"]]


# ---------------------------------------------------------------- failed steps, no success_when


def test_a_failed_step_fails_the_run_with_a_ran_check_for_each_failed_step():
    steps = [fact("a", "FAILED"), fact("b"), fact("c", "FAILED")]

    verdict = evaluate([], steps, [])

    assert verdict == {
        "state": "FAILED",
        "checks": [
            {
                "step": "a",
                "what": "ran",
                "want": "DONE",
                "got": "FAILED",
                "ok": False,
                "note": NOT_COMPLETE,
            },
            {
                "step": "c",
                "what": "ran",
                "want": "DONE",
                "got": "FAILED",
                "ok": False,
                "note": NOT_COMPLETE,
            },
        ],
    }


def test_a_failed_step_fails_the_run_even_when_every_condition_holds():
    steps = [fact("a", "FAILED"), fact("b", exit_code=0)]

    verdict = evaluate([{"step": "b", "exit_code": 0}], steps, [])

    assert verdict["state"] == "FAILED"
    assert checks_of(verdict) == [("a", "ran", False)]


def test_without_success_when_nothing_failed_is_success_whatever_the_exit_codes():
    steps = [fact("a", exit_code=3), fact("b", "SKIPPED", exit_code=None)]

    assert evaluate([], steps, []) == {"state": "SUCCEEDED", "checks": []}


# ---------------------------------------------------------------- produced and exit_code


def test_produced_holds_when_every_named_output_was_produced():
    verdict = evaluate(
        [{"step": "a", "produced": ["x.json", "y.log"]}],
        [fact("a", produced=("x.json", "y.log", "z"))],
        [],
    )

    assert verdict == {
        "state": "SUCCEEDED",
        "checks": [
            {
                "step": "a",
                "what": "produced",
                "want": ["x.json", "y.log"],
                "got": ["x.json", "y.log"],
                "ok": True,
            }
        ],
    }


def test_produced_fails_and_lists_only_the_outputs_that_were_produced():
    verdict = evaluate(
        [{"step": "a", "produced": ["x.json", "y.log"]}], [fact("a", produced=("y.log",))], []
    )

    assert verdict["state"] == "FAILED"
    assert verdict["checks"] == [
        {
            "step": "a",
            "what": "produced",
            "want": ["x.json", "y.log"],
            "got": ["y.log"],
            "ok": False,
        }
    ]


def test_exit_code_compares_with_the_reported_exit_code():
    verdict = evaluate([{"step": "a", "exit_code": 0}], [fact("a", exit_code=1)], [])

    assert verdict == {
        "state": "FAILED",
        "checks": [{"step": "a", "what": "exit_code", "want": 0, "got": 1, "ok": False}],
    }


def test_a_nonzero_exit_code_can_be_the_one_wanted():
    verdict = evaluate([{"step": "a", "exit_code": 2}], [fact("a", exit_code=2)], [])

    assert verdict["state"] == "SUCCEEDED"


def test_a_missing_exit_code_is_not_the_one_wanted():
    verdict = evaluate([{"step": "a", "exit_code": 0}], [fact("a", exit_code=None)], [])

    assert verdict["state"] == "FAILED"
    assert verdict["checks"][0]["got"] is None


def test_a_condition_with_produced_and_exit_code_adds_a_check_for_each():
    verdict = evaluate(
        [{"step": "a", "exit_code": 0, "produced": ["r.json"]}],
        [fact("a", exit_code=0, produced=())],
        [],
    )

    assert verdict["state"] == "FAILED"
    assert sorted(checks_of(verdict)) == [("a", "exit_code", True), ("a", "produced", False)]


def test_a_condition_naming_only_a_step_checks_that_it_ran():
    verdict = evaluate([{"step": "a"}], [fact("a", exit_code=9)], [])

    assert verdict == {
        "state": "SUCCEEDED",
        "checks": [{"step": "a", "what": "ran", "want": "DONE", "got": "DONE", "ok": True}],
    }


def test_the_checks_follow_the_order_of_the_conditions():
    conds = [{"step": "b", "exit_code": 0}, {"step": "a", "exit_code": 0}]

    verdict = evaluate(conds, [fact("a"), fact("b")], [])

    assert [c["step"] for c in verdict["checks"]] == ["b", "a"]


def test_the_run_succeeds_only_when_every_check_holds():
    conds = [{"step": "a", "exit_code": 0}, {"step": "b", "exit_code": 0}]

    verdict = evaluate(conds, [fact("a", exit_code=0), fact("b", exit_code=1)], [])

    assert verdict["state"] == "FAILED"
    assert checks_of(verdict) == [("a", "exit_code", True), ("b", "exit_code", False)]


# ---------------------------------------------------------------- skipped steps and "any"


def test_a_skipped_steps_condition_is_vacuously_ok():
    conds = [{"step": "a", "exit_code": 0, "produced": ["x"]}, {"step": "b", "exit_code": 0}]
    steps = [fact("a", "SKIPPED", exit_code=None), fact("b", exit_code=0)]

    verdict = evaluate(conds, steps, [])

    assert verdict["state"] == "SUCCEEDED"
    assert [(c["step"], c["ok"]) for c in verdict["checks"]] == [("a", True), ("b", True)]


def test_a_skipped_step_that_a_dispatch_chose_fails_ran():
    conds = [{"step": "a", "exit_code": 0}, {"step": "b", "exit_code": 0}]
    steps = [fact("a", "SKIPPED", exit_code=None, chosen=True), fact("b", exit_code=0)]

    verdict = evaluate(conds, steps, [])

    assert verdict["state"] == "FAILED"
    assert ("a", "ran", False) in checks_of(verdict)


def test_a_step_with_no_result_fails_ran():
    verdict = evaluate(
        [{"step": "a", "produced": ["x"]}], [fact("a", "PENDING", exit_code=None)], []
    )

    assert verdict["state"] == "FAILED"
    assert verdict["checks"] == [
        {"step": "a", "what": "ran", "want": "DONE", "got": "PENDING", "ok": False}
    ]


def test_a_run_whose_every_conditioned_step_was_skipped_fails_any():
    conds = [{"step": "a", "exit_code": 0}, {"step": "b", "produced": ["x"]}]
    steps = [fact("a", "SKIPPED", exit_code=None), fact("b", "SKIPPED", exit_code=None), fact("c")]

    verdict = evaluate(conds, steps, [])

    assert verdict["state"] == "FAILED"
    assert [c["what"] for c in verdict["checks"] if not c["ok"]] == ["any"]


def test_one_conditioned_step_that_ran_is_enough_to_avoid_any():
    conds = [{"step": "a", "exit_code": 0}, {"step": "b", "exit_code": 0}]
    steps = [fact("a", "SKIPPED", exit_code=None), fact("b", exit_code=0)]

    verdict = evaluate(conds, steps, [])

    assert "any" not in [c["what"] for c in verdict["checks"]]


def test_fleet_conditions_alone_never_fail_any():
    conds = [{"fleet_has": {"capability": "scope"}}]

    verdict = evaluate(conds, [fact("a", "SKIPPED", exit_code=None)], [node("s1", "scope")])

    assert verdict["state"] == "SUCCEEDED"


# ---------------------------------------------------------------- fleet_has


def test_fleet_has_counts_the_adverts_that_satisfy_the_requirement():
    fleet = [
        node("s1", "scope", bw="1g"),
        node("s2", "scope", bw="10g"),
        node("s3", "scope", bw="1g"),
        node("b1", "board", bw="1g"),
    ]
    conds = [{"fleet_has": {"capability": "scope", "bw": "1g"}, "min_count": 2}]

    verdict = evaluate(conds, [fact("a")], fleet)

    assert verdict["state"] == "SUCCEEDED"
    check = verdict["checks"][0]
    assert (check["what"], check["want"], check["got"], check["ok"]) == ("fleet_has", 2, 2, True)


def test_fleet_has_below_min_count_fails():
    conds = [{"fleet_has": {"capability": "scope"}, "min_count": 3}]

    verdict = evaluate(conds, [fact("a")], [node("s1", "scope"), node("s2", "scope")])

    assert verdict["state"] == "FAILED"
    check = verdict["checks"][0]
    assert (check["what"], check["want"], check["got"], check["ok"]) == ("fleet_has", 3, 2, False)


def test_fleet_has_without_min_count_wants_one_node():
    conds = [{"fleet_has": {"capability": "scope"}}]

    assert evaluate(conds, [fact("a")], [])["state"] == "FAILED"
    assert evaluate(conds, [fact("a")], [node("s1", "scope")])["state"] == "SUCCEEDED"


def test_the_counted_fleet_is_stored_with_the_verdict():
    conds = [{"fleet_has": {"capability": "scope"}, "min_count": 1}]
    fleet = [node("s2", "scope"), node("s1", "scope"), node("b1", "board")]

    verdict = evaluate(conds, [fact("a")], fleet)

    assert "fleet" in verdict
    stored = repr(verdict["fleet"])
    assert "'s1'" in stored and "'s2'" in stored and "'b1'" not in stored


def test_no_fleet_is_stored_without_a_fleet_condition():
    verdict = evaluate([{"step": "a"}], [fact("a")], [node("s1", "scope")])

    assert "fleet" not in verdict


# ---------------------------------------------------------------- within_attempts


def test_within_attempts_fails_for_a_step_that_ran_out_of_attempts():
    verdict = evaluate([{"step": "a", "within_attempts": True}], [fact("a", exhausted=True)], [])

    assert verdict["state"] == "FAILED"
    assert checks_of(verdict) == [("a", "within_attempts", False)]


def test_within_attempts_holds_for_a_step_that_did_not_run_out():
    verdict = evaluate([{"step": "a", "within_attempts": True}], [fact("a")], [])

    assert verdict["state"] == "SUCCEEDED"
    assert checks_of(verdict) == [("a", "within_attempts", True)]


# ---------------------------------------------------------- changed (docs/contract.md#success_when)


def test_changed_holds_when_every_listed_path_is_in_the_results_changed():
    step = fact("a", changed=("src/a.c", "src/b.c", "README"))

    verdict = evaluate([{"step": "a", "changed": ["src/a.c", "src/b.c"]}], [step], [])

    assert verdict == {
        "state": "SUCCEEDED",
        "checks": [
            {
                "step": "a",
                "what": "changed",
                "want": ["src/a.c", "src/b.c"],
                "got": ["src/a.c", "src/b.c"],
                "ok": True,
            }
        ],
    }


def test_changed_fails_and_names_the_paths_not_changed_in_the_listed_order():
    step = fact("a", changed=("b",))

    verdict = evaluate([{"step": "a", "changed": ["c", "b", "a"]}], [step], [])

    assert verdict == {
        "state": "FAILED",
        "checks": [
            {
                "step": "a",
                "what": "changed",
                "want": ["c", "b", "a"],
                "got": ["b"],
                "ok": False,
                "note": "not changed during this step: c, a",
            }
        ],
    }


def test_changed_fails_for_a_step_whose_result_reported_nothing_changed():
    verdict = evaluate([{"step": "a", "changed": ["x"]}], [fact("a")], [])

    assert verdict["checks"] == [
        {
            "step": "a",
            "what": "changed",
            "want": ["x"],
            "got": [],
            "ok": False,
            "note": "not changed during this step: x",
        }
    ]


def test_changed_comes_after_produced_and_exit_code_and_before_within_attempts():
    cond = {
        "step": "a",
        "within_attempts": True,
        "changed": ["x"],
        "exit_code": 0,
        "produced": ["r"],
    }

    verdict = evaluate([cond], [fact("a", produced=("r",), changed=("x",))], [])

    assert checks_of(verdict) == [
        ("a", "produced", True),
        ("a", "exit_code", True),
        ("a", "changed", True),
        ("a", "within_attempts", True),
    ]


def test_an_empty_changed_list_asks_nothing_so_the_step_is_checked_to_have_ran():
    verdict = evaluate([{"step": "a", "changed": []}], [fact("a")], [])

    assert checks_of(verdict) == [("a", "ran", True)]


def test_a_skipped_step_with_a_changed_condition_is_vacuously_ok():
    verdict = evaluate(
        [{"step": "a", "changed": ["x"]}, {"step": "b"}], [fact("a", "SKIPPED"), fact("b")], []
    )

    assert checks_of(verdict) == [("a", "skipped", True), ("b", "ran", True)]


def test_changed_paths_are_the_strings_of_the_results_changed_list():
    assert changed_paths({"changed": ["a", 5, "b", None]}) == frozenset({"a", "b"})


@pytest.mark.parametrize(
    "result",
    [None, {}, {"changed": None}, {"changed": "a"}, {"changed": {"a": 1}}, {"changed": 3}],
    ids=["no-result", "no-changed", "null", "string", "object", "number"],
)
def test_changed_paths_of_a_result_without_a_list_are_none(result):
    assert changed_paths(result) == frozenset()
