"""The state machine of runs and steps (docs/design.md#states), walked pair by pair against
``app/states.py``, the database's CHECK constraints on the state columns, and the audit trail of
real runs checked against the same machine."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest

from app.states import (
    RUN_STATES,
    RUN_TRANSITIONS,
    STEP_STATES,
    STEP_TRANSITIONS,
    IllegalTransition,
    check_run_change,
    check_step_change,
    run_may_become,
    step_may_become,
)
from app.store.runs import set_run_state, settle_run
from app.store.steps import fail_step, update_step
from tests.support.actors import cap
from tests.support.agent import advertise, claim, done
from tests.support.contracts import contract, role
from tests.support.submitter import submit

# The run states of docs/design.md#states, written out from the text rather than copied from
# the code:
# "QUEUED -> RUNNING -> VERIFYING -> SUCCEEDED | FAILED; QUEUED -> FAILED (cancel);
#  RUNNING -> FAILED (step failed, cancel, lease expired, node restarted); a rejected submit is born
#  FAILED." A new run (None) is born QUEUED, RUNNING (placed) or FAILED (rejected).
DOC_RUN_STATES = {"QUEUED", "RUNNING", "VERIFYING", "SUCCEEDED", "FAILED"}
DOC_RUN_ALLOWED = {
    (None, "QUEUED"),
    (None, "RUNNING"),
    (None, "FAILED"),
    ("QUEUED", "RUNNING"),
    ("QUEUED", "FAILED"),
    ("RUNNING", "VERIFYING"),
    ("RUNNING", "FAILED"),
    ("VERIFYING", "SUCCEEDED"),
    ("VERIFYING", "FAILED"),
}

# "PENDING -> CLAIMED -> DONE | FAILED, PENDING -> ASKED -> DONE | FAILED (ask steps),
#  PENDING -> DONE (acquire steps), PENDING -> SKIPPED (branch not taken), and back to PENDING with
#  attempt + 1 on a rollback." Open steps (PENDING, CLAIMED, ASKED) become FAILED on cancel and in the
#  reaper. The rollback clause is unconditional: any state a step reaches from PENDING may
#  be reset to PENDING.
DOC_STEP_STATES = {"PENDING", "CLAIMED", "ASKED", "DONE", "FAILED", "SKIPPED"}
DOC_STEP_ALLOWED = {
    ("PENDING", "CLAIMED"),
    ("PENDING", "ASKED"),
    ("PENDING", "DONE"),
    ("PENDING", "SKIPPED"),
    ("PENDING", "FAILED"),
    ("CLAIMED", "DONE"),
    ("CLAIMED", "FAILED"),
    ("ASKED", "DONE"),
    ("ASKED", "FAILED"),
    ("CLAIMED", "PENDING"),
    ("ASKED", "PENDING"),
    ("DONE", "PENDING"),
    ("FAILED", "PENDING"),
    ("SKIPPED", "PENDING"),
}

RUN_PAIRS = list(itertools.product([None, *sorted(DOC_RUN_STATES)], sorted(DOC_RUN_STATES)))
STEP_PAIRS = list(itertools.product(sorted(DOC_STEP_STATES), sorted(DOC_STEP_STATES)))


def _name(pair: tuple[str | None, str]) -> str:
    return f"{pair[0] or 'new'}->{pair[1]}"


def test_the_run_states_are_exactly_those_of_the_spec_with_no_cancelled_or_dry_run():
    assert set(RUN_STATES) == DOC_RUN_STATES
    assert set(RUN_TRANSITIONS) == DOC_RUN_STATES | {None}


def test_the_step_states_are_exactly_those_of_the_spec_with_no_cancelled():
    assert set(STEP_STATES) == DOC_STEP_STATES
    assert set(STEP_TRANSITIONS) == DOC_STEP_STATES


@pytest.mark.parametrize("pair", RUN_PAIRS, ids=_name)
def test_a_run_transition_is_allowed_exactly_when_the_spec_allows_it(pair):
    old, new = pair
    assert run_may_become(old, new) is (pair in DOC_RUN_ALLOWED)
    assert (new in RUN_TRANSITIONS[old]) is (pair in DOC_RUN_ALLOWED)


@pytest.mark.parametrize("pair", STEP_PAIRS, ids=_name)
def test_a_step_transition_is_allowed_exactly_when_the_spec_allows_it(pair):
    old, new = pair
    assert step_may_become(old, new) is (pair in DOC_STEP_ALLOWED)
    assert (new in STEP_TRANSITIONS[old]) is (pair in DOC_STEP_ALLOWED)


@pytest.mark.parametrize("old", ["SUCCEEDED", "FAILED"])
def test_a_finished_run_never_changes_state_again(old):
    assert RUN_TRANSITIONS[old] == frozenset()
    assert not any(run_may_become(old, new) for new in [*DOC_RUN_STATES, "DRY_RUN"])


def test_dry_run_is_never_a_state_a_run_can_take():
    assert not any(run_may_become(old, "DRY_RUN") for old in [None, *DOC_RUN_STATES])


def test_a_run_reaches_succeeded_only_through_verifying():
    sources = {old for old, new in DOC_RUN_ALLOWED if new == "SUCCEEDED"}
    assert {old for old in [None, *DOC_RUN_STATES] if run_may_become(old, "SUCCEEDED")} == sources
    assert sources == {"VERIFYING"}


# ------------------------------------------------------------------ CHECK constraints


def _insert_run(sql, run_id: str, state: str) -> None:
    sql.execute(
        "INSERT INTO runs (run_id, state, contract, requires, requires_key)"
        " VALUES (%s, %s, '{}'::jsonb, '[]'::jsonb, 'k')",
        (run_id, state),
    )


def _insert_step(sql, run_id: str, seq: int, state: str) -> None:
    sql.execute(
        "INSERT INTO steps (run_id, seq, step_id, kind, spec, state)"
        " VALUES (%s, %s, %s, 'run', '{}'::jsonb, %s)",
        (run_id, seq, f"s{seq}", state),
    )


@pytest.mark.parametrize("state", ["CANCELLED", "DRY_RUN", "running", ""])
def test_the_database_rejects_a_run_state_outside_the_machine(sql, state):
    with pytest.raises(psycopg.errors.CheckViolation):
        _insert_run(sql, "r1", state)
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_the_database_rejects_updating_a_run_to_an_unknown_state(sql):
    _insert_run(sql, "r1", "RUNNING")
    with pytest.raises(psycopg.errors.CheckViolation):
        sql.execute("UPDATE runs SET state = 'CANCELLED' WHERE run_id = 'r1'")
    assert sql.execute("SELECT state FROM runs").fetchall() == [("RUNNING",)]


def test_the_database_accepts_every_run_state_of_the_machine(sql):
    for state in sorted(DOC_RUN_STATES):
        _insert_run(sql, f"r-{state}", state)
    assert {r[0] for r in sql.execute("SELECT state FROM runs")} == DOC_RUN_STATES


@pytest.mark.parametrize("state", ["CANCELLED", "RUNNING", "pending", ""])
def test_the_database_rejects_a_step_state_outside_the_machine(sql, state):
    _insert_run(sql, "r1", "RUNNING")
    with pytest.raises(psycopg.errors.CheckViolation):
        _insert_step(sql, "r1", 1, state)
    assert sql.execute("SELECT count(*) FROM steps").fetchone() == (0,)


def test_the_database_rejects_updating_a_step_to_an_unknown_state(sql):
    _insert_run(sql, "r1", "RUNNING")
    _insert_step(sql, "r1", 1, "CLAIMED")
    with pytest.raises(psycopg.errors.CheckViolation):
        sql.execute("UPDATE steps SET state = 'CANCELLED' WHERE run_id = 'r1'")
    assert sql.execute("SELECT state FROM steps").fetchall() == [("CLAIMED",)]


def test_the_database_accepts_every_step_state_of_the_machine(sql):
    _insert_run(sql, "r1", "RUNNING")
    for seq, state in enumerate(sorted(DOC_STEP_STATES), start=1):
        _insert_step(sql, "r1", seq, state)
    assert {r[0] for r in sql.execute("SELECT state FROM steps")} == DOC_STEP_STATES


# ------------------------------------------------------------------ the audit trail obeys the machine


def test_every_state_change_recorded_for_real_runs_is_a_transition_the_spec_allows(client, sql):
    advertise(client, "n1", cap("board"), instance="i1")
    # placed, then succeeds: new -> RUNNING -> VERIFYING -> SUCCEEDED
    submit(client, contract("ok"), 201)
    # queued behind it, promoted when it ends, then fails by an error: QUEUED -> RUNNING -> FAILED
    submit(client, contract("later"), 202)
    # queued and cancelled while waiting: QUEUED -> FAILED
    submit(client, contract("cancelled"), 202)
    assert client.post("/v1/runs/cancelled/cancel").status_code == 200
    # rejected at submit: born FAILED
    assert submit(client, contract("rejected", role("dut", "no-such-thing"))).status_code == 422
    assert claim(client, "n1", "i1").get_json()["run_id"] == "ok"
    assert done(client, "ok", 1, "n1", exit_code=0)["run_state"] == "SUCCEEDED"
    assert claim(client, "n1", "i1").get_json()["run_id"] == "later"
    assert done(client, "later", 1, "n1", exit_code=None, error="boom")["run_state"] == "FAILED"

    rows = sql.execute("SELECT run_id, from_state, to_state FROM run_events ORDER BY id").fetchall()
    trails: dict[str, list[tuple[str | None, str]]] = {}
    for run_id, old, new in rows:
        trails.setdefault(run_id, []).append((old, new))
    assert trails == {
        "ok": [(None, "RUNNING"), ("RUNNING", "VERIFYING"), ("VERIFYING", "SUCCEEDED")],
        "later": [(None, "QUEUED"), ("QUEUED", "RUNNING"), ("RUNNING", "FAILED")],
        "cancelled": [(None, "QUEUED"), ("QUEUED", "FAILED")],
        "rejected": [(None, "FAILED")],
    }
    assert all((old, new) in DOC_RUN_ALLOWED for old, new in itertools.chain(*trails.values()))


# Transitions are checked where they are written: a guarded write asking for a change the tables
# forbid raises before it sends a statement (the session is never touched).
UNUSED_SESSION: Any = None


@pytest.mark.parametrize(
    "write",
    [
        lambda: update_step(UNUSED_SESSION, "r", 1, ["DONE"], state="FAILED"),
        lambda: update_step(UNUSED_SESSION, "r", 1, ["PENDING", "SKIPPED"], state="SKIPPED"),
        lambda: fail_step(UNUSED_SESSION, "r", 1, from_states=["PENDING", "DONE"], error="x"),
        lambda: set_run_state(UNUSED_SESSION, "r", ["QUEUED"], "VERIFYING"),
        lambda: settle_run(UNUSED_SESSION, "r", from_states=["SUCCEEDED"], state="FAILED"),
        lambda: settle_run(UNUSED_SESSION, "r", from_states=["RUNNING"], state="SUCCEEDED"),
    ],
)
def test_a_write_of_a_forbidden_transition_fails_loudly(write):
    with pytest.raises(IllegalTransition):
        write()


@pytest.mark.parametrize(("old", "new"), list(itertools.product(STEP_STATES, STEP_STATES)))
def test_check_step_change_follows_the_table(old, new):
    if step_may_become(old, new):
        check_step_change([old], new)
    else:
        with pytest.raises(IllegalTransition, match=f"from {old} to {new}"):
            check_step_change([old], new)


@pytest.mark.parametrize(("old", "new"), list(itertools.product((None, *RUN_STATES), RUN_STATES)))
def test_check_run_change_follows_the_table(old, new):
    if run_may_become(old, new):
        check_run_change([old], new)
    else:
        with pytest.raises(IllegalTransition):
            check_run_change([old], new)


def test_templates_take_the_states_from_app_states() -> None:
    """The pages name a state only through ``states`` (app/states.py, a Jinja global): a renamed
    or added state cannot be missed by a template that spelled it out."""
    import re
    from pathlib import Path

    from app.states import RUN_STATES, STEP_STATES

    names = "|".join(sorted(set(RUN_STATES) | set(STEP_STATES)))
    spelled = re.compile(rf"""["' ]({names})["' ]""")
    templates = Path(__file__).resolve().parents[2] / "app" / "templates"
    found = [
        f"{path.name}:{n}"
        for path in sorted(templates.rglob("*.html"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if spelled.search(line)
    ]
    assert found == []
