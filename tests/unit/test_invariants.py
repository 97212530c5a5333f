"""The invariant checker of tests/support/invariants.py must be able to fail: each rule is shown
here on rows made by hand to break it, next to the same picture left intact, and a picture the
Mediator made itself through its API passes every check."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.contracts import contract, one_step, role
from tests.support.invariants import check, check_after_reaper_pass, check_quiet, check_settled
from tests.support.submitter import submit

BOARD = [{"as": "dut", "capability": "board", "attrs": {}}]


def node(sql: Any, node_id: str, *, drain: str = "", live: bool = True, **attrs: str) -> None:
    caps = [{"capability": "board", "attrs": attrs}]
    sql.execute(
        "insert into nodes (node_id, capabilities, drain, expires_at)"
        " values (%s, %s, %s, now() + %s::interval)",
        (node_id, Jsonb(caps), drain, "1 hour" if live else "-1 second"),
    )


def run(
    sql: Any,
    run_id: str,
    state: str,
    *,
    nodes: list[str] | None = None,
    steps: int = 1,
    reject: dict[str, Any] | None = None,
    sealed: bool = False,
    released: bool = False,
) -> None:
    """A run of one role ``dut``, ``assigned`` to ``nodes`` when given, whose contract declares
    ``steps`` steps, all stored (PENDING, or DONE once finished); a rejected one stores none."""
    assigned = None
    if nodes is not None:
        entry: dict[str, Any] = {"as": "dut", "nodes": nodes}
        if released:
            entry["released"] = True
        assigned = [entry]
    declared = [{"id": f"s{i}", "uses": "dut", "run": ["x"]} for i in range(1, steps + 1)]
    finished = state in ("SUCCEEDED", "FAILED")
    sql.execute(
        "insert into runs (run_id, state, contract, requires, requires_key, assigned, reject,"
        " ended_at, sealed_at) values (%s, %s, %s, %s, 'k', %s, %s,"
        " case when %s then now() end, case when %s then now() end)",
        (
            run_id,
            state,
            Jsonb({"run_id": run_id, "requires": [], "steps": declared}),
            Jsonb(BOARD),
            Jsonb(assigned) if assigned is not None else None,
            Jsonb(reject) if reject is not None else None,
            finished,
            sealed,
        ),
    )
    if reject is None:
        for seq in range(1, steps + 1):
            step(
                sql,
                run_id,
                seq,
                "DONE" if finished else "PENDING",
                node=nodes[0] if nodes else None,
            )


def step(sql: Any, run_id: str, seq: int, state: str, *, node: str | None = None) -> None:
    sql.execute(
        "insert into steps (run_id, seq, step_id, kind, uses, node_id, state, spec)"
        " values (%s, %s, %s, 'run', 'dut', %s, %s, '{}'::jsonb)",
        (run_id, seq, f"s{seq}", node, state),
    )


def lease(sql: Any, node_id: str, run_id: str) -> None:
    sql.execute(
        "insert into leases (node_id, run_id, role, capability, not_after, nonce)"
        " values (%s, %s, 'dut', 'board', now() + interval '1 hour', 'n')",
        (node_id, run_id),
    )


def placed(sql: Any, run_id: str, node_id: str) -> None:
    """A RUNNING run on ``node_id`` with its lease: every check holds."""
    run(sql, run_id, "RUNNING", nodes=[node_id])
    lease(sql, node_id, run_id)


# ---------------------------------------------------------------- the good pictures


def test_a_picture_made_by_the_mediator_passes_every_check(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board", soc="imx8mp"))
    submit(client, one_step("first"), 201)
    submit(client, one_step("second"), 201)
    submit(client, one_step("third"), 202)
    submit(client, contract("never", role("dut", "scope")), 422)
    step1 = claimed(client, "n1")
    done(client, step1["run_id"], step1["seq"], "n1")  # frees n1: "third" is promoted
    assert check_settled(sql) == []


def test_hand_made_rows_that_keep_the_rules_pass(sql):
    node(sql, "n1")
    node(sql, "n2")
    placed(sql, "a", "n1")
    run(sql, "released", "RUNNING", nodes=["n2"], released=True)  # gave n2 up by a release
    run(sql, "waits", "QUEUED")  # n2 is free, but it drains
    sql.execute("update nodes set drain = 'graceful' where node_id = 'n2'")
    run(sql, "done", "SUCCEEDED", nodes=["n3"], sealed=True)
    run(sql, "rejected", "FAILED", reject={"Code": 422, "Reason": "no candidate"}, steps=0)
    assert check_settled(sql) == []


# ---------------------------------------------------------------- check(): at every moment


def test_a_node_in_live_roles_of_two_runs_is_reported(sql):
    placed(sql, "a", "n1")
    run(sql, "b", "RUNNING", nodes=["n1"])
    found = check(sql)
    assert "node n1 is assigned to live roles of 2 runs: ['a', 'b']" in found
    assert "run b is RUNNING without a lease on node n1 of its role dut (not released)" in found


def test_queue_counts_follow_runs_into_and_out_of_the_queue(client, sql):
    """The trigger on runs keeps queue_counts: queued, promoted, cancelled, deleted."""
    advertise(client, "n1", cap("board"))
    submit(client, one_step("holder"), 201)
    submit(client, one_step("a"), 202)
    submit(client, {**one_step("b"), "queue": {"priority": 3}}, 202)
    submit(client, one_step("c"), 202)
    assert check(sql) == []
    assert client.post("/v1/runs/c/cancel").status_code == 200
    assert client.post("/v1/runs/holder/cancel").status_code == 200  # "b" is promoted
    assert sql.execute("select state from runs where run_id = 'b'").fetchone()[0] == "RUNNING"
    sql.execute("delete from steps where run_id = 'a'")
    sql.execute("delete from run_events where run_id = 'a'")
    sql.execute("delete from runs where run_id = 'a'")
    assert check(sql) == []
    assert sql.execute("select coalesce(sum(queued), 0) from queue_counts").fetchone()[0] == 0


def test_a_queue_count_that_differs_from_the_queued_runs_is_reported(sql):
    run(sql, "waits", "QUEUED")
    assert check(sql) == []
    sql.execute("update queue_counts set queued = queued + 2")
    assert check(sql) == ["priority 0: 1 runs QUEUED, 3 in queue_counts"]


def test_a_running_run_without_the_lease_of_an_unreleased_role_is_reported(sql):
    run(sql, "a", "RUNNING", nodes=["n1"])
    assert check(sql) == [
        "run a is RUNNING without a lease on node n1 of its role dut (not released)"
    ]


def test_a_verifying_run_must_still_hold_its_leases(sql):
    run(sql, "a", "VERIFYING", nodes=["n1"])
    sql.execute("update steps set state = 'DONE'")
    assert check(sql) == [
        "run a is VERIFYING without a lease on node n1 of its role dut (not released)"
    ]


def test_a_lease_that_fills_no_unreleased_role_is_reported(sql):
    placed(sql, "a", "n1")
    lease(sql, "n9", "a")
    assert check(sql) == [
        "run a holds a lease on node n9, which fills none of its unreleased roles"
    ]


def test_a_queued_run_holding_a_lease_is_reported(sql):
    run(sql, "q", "QUEUED")
    lease(sql, "n1", "q")
    assert check(sql) == ["run q is QUEUED but holds a lease on n1"]


@pytest.mark.parametrize("state", ["SUCCEEDED", "FAILED"])
@pytest.mark.parametrize("open_state", ["PENDING", "CLAIMED", "ASKED"])
def test_a_finished_run_with_an_open_step_is_reported(sql, state, open_state):
    run(sql, "a", state, nodes=["n1"], sealed=True)
    sql.execute("update steps set state = %s", (open_state,))
    assert check(sql) == [f"run a is {state} but step a#01 is {open_state}"]


def test_a_queued_run_with_a_step_bound_to_a_node_or_claimed_is_reported(sql):
    run(sql, "q1", "QUEUED")
    run(sql, "q2", "QUEUED")
    sql.execute("update steps set node_id = 'n1' where run_id = 'q1'")
    sql.execute("update steps set state = 'CLAIMED', node_id = 'n2' where run_id = 'q2'")
    found = check(sql)
    assert "run q1 is QUEUED but step q1#01 is PENDING on node n1" in found
    assert "run q2 is QUEUED but step q2#01 is CLAIMED on node n2" in found


def test_a_run_row_without_its_steps_is_half_created(sql):
    run(sql, "a", "QUEUED", steps=2)
    sql.execute("delete from steps where run_id = 'a' and seq = 2")
    assert check(sql) == ["run a is half-created: 1 steps stored, 2 in its contract"]


def test_a_rejected_submit_has_no_steps(sql):
    run(sql, "r", "FAILED", reject={"Code": 422, "Reason": "no candidate"}, steps=0)
    step(sql, "r", 1, "FAILED")
    assert check(sql) == ["run r was rejected at submit but has 1 steps"]


def test_a_step_bound_to_a_node_its_run_was_never_assigned_is_reported(sql):
    placed(sql, "a", "n1")
    sql.execute("update steps set node_id = 'n7'")
    assert check(sql) == ["step a#01 is bound to n7, not assigned to a"]


def test_every_violation_is_reported_not_only_the_first(sql):
    run(sql, "a", "RUNNING", nodes=["n1"])  # no lease
    run(sql, "q", "QUEUED")
    lease(sql, "n2", "q")  # a QUEUED run holding a lease
    run(sql, "f", "FAILED", nodes=["n3"])
    sql.execute("update steps set state = 'PENDING' where run_id = 'f'")  # an open step
    assert len(check(sql)) == 3


# ---------------------------------------------------------------- after a reaper pass


def test_a_lease_of_a_finished_run_is_reported_after_a_pass(sql):
    run(sql, "a", "FAILED", nodes=["n1"], sealed=True)
    lease(sql, "n1", "a")
    assert check_after_reaper_pass(sql) == ["run a is FAILED but still holds a lease on n1"]


def test_an_unsealed_finished_run_is_reported_after_a_pass_but_not_a_rejected_submit(sql):
    run(sql, "a", "SUCCEEDED", nodes=["n1"])
    run(sql, "r", "FAILED", reject={"Code": 422, "Reason": "no candidate"}, steps=0)
    run(sql, "expired", "FAILED", nodes=["n2"], reject={"Code": 410, "Reason": "lease expired"})
    assert check_after_reaper_pass(sql) == [
        "run a is SUCCEEDED but its Record is not sealed",
        "run expired is FAILED but its Record is not sealed",
    ]


def test_a_run_left_verifying_is_reported_after_a_pass(sql):
    run(sql, "v", "VERIFYING", nodes=["n1"])
    assert check_after_reaper_pass(sql) == ["run v is still VERIFYING after a reaper pass"]


# ---------------------------------------------------------------- once quiet


def test_a_queued_run_that_fits_a_free_live_node_is_reported(sql):
    node(sql, "n1")
    run(sql, "q", "QUEUED")
    assert check_quiet(sql) == ["run q is QUEUED though free nodes fit it: ['n1']"]


def test_each_fitting_run_takes_its_nodes_as_a_scan_would(sql):
    node(sql, "n1")
    run(sql, "q1", "QUEUED")
    run(sql, "q2", "QUEUED")  # n1 goes to q1: q2 would stay queued
    assert check_quiet(sql) == ["run q1 is QUEUED though free nodes fit it: ['n1']"]


@pytest.mark.parametrize("why", ["leased", "draining", "expired", "other capability"])
def test_a_queued_run_whose_nodes_are_not_free_is_not_reported(sql, why):
    if why == "leased":
        node(sql, "n1")
        placed(sql, "holder", "n1")
    elif why == "draining":
        node(sql, "n1", drain="at-boundary")
    elif why == "expired":
        node(sql, "n1", live=False)
    else:
        sql.execute(
            "insert into nodes (node_id, capabilities, expires_at)"
            " values ('n1', '[{\"capability\": \"scope\", \"attrs\": {}}]', now() + interval '1h')"
        )
    run(sql, "q", "QUEUED")
    assert check_quiet(sql) == []


def test_a_fit_over_the_width_cap_is_not_reported(sql):
    node(sql, "n1")
    node(sql, "n2")
    sql.execute(
        "insert into runs (run_id, state, contract, requires, requires_key) values"
        " ('wide', 'QUEUED', '{\"steps\": []}', %s, 'k')",
        (Jsonb([{"as": "dut", "capability": "board", "count": 2, "attrs": {}}]),),
    )
    assert check_quiet(sql, max_per_run=1) == []
    assert check_quiet(sql) == ["run wide is QUEUED though free nodes fit it: ['n1', 'n2']"]


def test_the_checker_needs_an_autocommit_connection(sql):
    sql.autocommit = False
    try:
        with pytest.raises(AssertionError, match="autocommit"):
            check(sql)
    finally:
        sql.rollback()
        sql.autocommit = True
