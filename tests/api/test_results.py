"""Results (docs/api.md#post-v1runsrun_idstepsseqresult--report-a-steps-result): step state
transitions through the HTTP API, the 409 for anything not claimed by the reporting node,
lease-nonce fencing, the wakes a result makes (wake point 1 of docs/design.md#wake-points), the
at-boundary drain (docs/operators.md#graceful-and-at-boundary) and the run view of steps
(docs/api.md#get-v1runsrun_id--the-run-view)."""

from __future__ import annotations

from typing import Any

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, report
from tests.support.contracts import build_then_test, contract, one_step, role, two_steps
from tests.support.rows import attempts, leases, one, rows, run_row, states, step_rows, transitions
from tests.support.scenes import queued_behind_a_freed_scope
from tests.support.submitter import submit

# One app for the module (see the ``app`` fixture): nearly every test here claims.
one_app_per_module = True
DID_NOT_COMPLETE = "a step did not complete"


# ---------------------------------------------------------------- helpers


def assert_not_claimed(resp: Any, step_id: str) -> None:
    """The 409 for a result not claimed by the reporting node, exact
    (docs/api.md#post-v1runsrun_idstepsseqresult--report-a-steps-result)."""
    assert resp.status_code == 409
    assert resp.get_json() == {
        "error": {"code": 409, "reason": f"reported a step that was not claimed ({step_id})"}
    }


def snapshot(sql: Any) -> tuple[Any, ...]:
    """Every row that a result could change, to compare before and after a refused report."""
    return (
        rows(sql, "select * from runs order by run_id"),
        rows(sql, "select * from steps order by run_id, seq"),
        rows(sql, "select * from leases order by node_id"),
        rows(sql, "select * from run_events order by id"),
        rows(sql, "select * from blobs order by run_id, seq, attempt, name"),
    )


# ---------------------------------------------------------------- transitions


def test_a_claim_makes_a_pending_step_claimed_with_started_at(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    assert states(sql, "r1") == {"flash": "PENDING", "boot": "PENDING"}

    body = claimed(client, "n1")

    assert body["step_id"] == "r1#01" and "attempt" not in body
    row = step_rows(sql, "r1")["flash"]
    assert row["state"] == "CLAIMED" and row["started_at"] is not None and row["ended_at"] is None


def test_a_result_with_a_nonzero_exit_code_makes_the_step_done_and_the_run_goes_on(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")

    resp = report(client, "r1", 1, "n1", exit_code=3)

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": ""}
    flash = step_rows(sql, "r1")["flash"]
    assert flash["state"] == "DONE" and flash["exit_code"] == 3 and flash["ended_at"] is not None
    assert run_row(sql, "r1")["state"] == "RUNNING"
    assert claimed(client, "n1")["name"] == "boot"


def test_a_result_with_an_error_fails_the_step_and_the_run_with_check_ran(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")

    resp = report(client, "r1", 1, "n1", exit_code=0, error="flash-image: device not found")

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": "FAILED"}
    run = run_row(sql, "r1")
    assert run["state"] == "FAILED" and run["ended_at"] is not None
    assert run["verdict"] == {
        "state": "FAILED",
        "checks": [
            {
                "step": "flash",
                "what": "ran",
                "want": "DONE",
                "got": "FAILED",
                "ok": False,
                "note": DID_NOT_COMPLETE,
            }
        ],
    }


def test_a_failed_step_fails_the_other_open_steps_of_its_run(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")

    report(client, "r1", 1, "n1", exit_code=None, error="broken")

    steps = step_rows(sql, "r1")
    assert steps["flash"]["state"] == "FAILED" and steps["flash"]["error"] == "broken"
    assert steps["boot"]["state"] == "FAILED" and steps["boot"]["ended_at"] is not None


def test_a_failed_step_deletes_the_leases_of_its_run(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "h1", cap("agent.reason"))
    doc = contract(
        "r1",
        role("dut"),
        role("host", "agent.reason"),
        steps=[
            {"id": "flash", "uses": "host", "run": ["flash-image"]},
            {"id": "boot", "uses": "dut", "run": ["boot-test"]},
        ],
    )
    submit(client, doc, 201)
    assert leases(sql) == [("h1", "r1"), ("n1", "r1")]
    claimed(client, "h1")

    report(client, "r1", 1, "h1", exit_code=None, error="broken")

    assert leases(sql) == []
    assert advertise(client, "n1", cap("board"))["leases"] == []


def test_a_failed_step_ends_the_run_running_to_failed_without_verifying(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")

    report(client, "r1", 1, "n1", exit_code=None, error="broken")

    assert transitions(sql, "r1") == [(None, "RUNNING"), ("RUNNING", "FAILED")]


def test_an_empty_error_is_not_a_failure(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")

    resp = report(client, "r1", 1, "n1", exit_code=0, error="")

    assert resp.status_code == 200 and resp.get_json()["run_state"] == ""
    assert states(sql, "r1") == {"flash": "DONE", "boot": "PENDING"}


def test_the_last_result_settles_the_run_and_the_reply_names_the_final_state(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    done(client, "r1", 1, "n1")
    claimed(client, "n1")

    reply = done(client, "r1", 2, "n1")

    assert reply == {"run_id": "r1", "seq": 2, "run_state": "SUCCEEDED"}
    assert run_row(sql, "r1")["state"] == "SUCCEEDED"


# ---------------------------------------------------------------- 409: not claimed by that node


def test_a_result_by_another_node_is_409_and_changes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    before = snapshot(sql)

    resp = report(client, "r1", 1, "n2", exit_code=0)

    assert_not_claimed(resp, "r1#01")
    assert snapshot(sql) == before


def test_a_result_for_a_step_never_claimed_is_409_and_changes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    before = snapshot(sql)

    resp = report(client, "r1", 1, "n1", exit_code=0)

    assert_not_claimed(resp, "r1#01")
    assert snapshot(sql) == before


def test_a_duplicate_of_an_accepted_result_is_409_and_changes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    done(client, "r1", 1, "n1", exit_code=0)
    before = snapshot(sql)

    resp = report(client, "r1", 1, "n1", exit_code=7, error="late retry")

    assert_not_claimed(resp, "r1#01")
    assert snapshot(sql) == before


def test_a_result_for_an_unknown_run_is_409_and_changes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    before = snapshot(sql)

    resp = report(client, "nope", 1, "n1", exit_code=0)

    assert_not_claimed(resp, "nope#01")
    assert snapshot(sql) == before


def test_a_result_for_a_step_the_run_does_not_have_is_409(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    before = snapshot(sql)

    resp = report(client, "r1", 12, "n1", exit_code=0)

    assert_not_claimed(resp, "r1#12")
    assert snapshot(sql) == before


def test_a_result_for_a_claimed_step_of_a_cancelled_run_is_409_and_changes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    assert client.post("/v1/runs/r1/cancel").status_code == 200
    before = snapshot(sql)

    resp = report(client, "r1", 1, "n1", exit_code=0)

    assert_not_claimed(resp, "r1#01")
    assert snapshot(sql) == before


def test_a_result_with_a_nonce_of_an_earlier_lease_is_409_and_changes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    old_nonce = claimed(client, "n1")["lease"]["nonce"]
    # The node's lease for this run is now another one (it lost it and was granted it anew).
    sql.execute("update leases set nonce = %s where node_id = 'n1'", ("b" * 32,))
    before = snapshot(sql)

    resp = report(client, "r1", 1, "n1", exit_code=0, nonce=old_nonce)

    assert resp.status_code == 409
    assert resp.get_json()["error"]["code"] == 409
    assert snapshot(sql) == before


def test_a_result_with_the_current_lease_nonce_is_accepted(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    nonce = claimed(client, "n1")["lease"]["nonce"]
    assert [r["nonce"] for r in rows(sql, "select nonce from leases")] == [nonce]

    resp = report(client, "r1", 1, "n1", exit_code=0, nonce=nonce)

    assert resp.status_code == 200 and resp.get_json()["run_state"] == ""
    assert states(sql, "r1")["flash"] == "DONE"


# ---------------------------------------------------------------- wakes (wake point 1)


def test_a_result_that_ends_its_run_promotes_a_queued_run_in_the_same_request(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, one_step("first"), 201)
    submit(client, one_step("second"), 202)
    claimed(client, "n1")

    reply = done(client, "first", 1, "n1")

    assert reply["run_state"] == "SUCCEEDED"
    assert run_row(sql, "second")["state"] == "RUNNING"
    assert leases(sql) == [("n1", "second")]
    assert claimed(client, "n1")["run_id"] == "second"


def test_a_result_while_its_run_goes_on_still_wakes_the_queue(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    queued_behind_a_freed_scope(client, sql)
    claimed(client, "n1")

    reply = done(client, "r1", 1, "n1")

    assert reply["run_state"] == ""
    assert run_row(sql, "waiter")["state"] == "RUNNING"
    assert leases(sql) == [("n1", "r1"), ("x1", "waiter")]


def test_a_refused_result_wakes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    queued_behind_a_freed_scope(client, sql)

    assert report(client, "r1", 1, "n1", exit_code=0).status_code == 409

    assert run_row(sql, "waiter")["state"] == "QUEUED"


# ----------------------------------- at-boundary drain (docs/operators.md#graceful-and-at-boundary)


def test_a_result_from_an_at_boundary_draining_node_cancels_its_live_run(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    advertise(client, "n1", cap("board"), policy={"drain": "at-boundary"})

    resp = report(client, "r1", 1, "n1", exit_code=0)

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": "FAILED"}
    run = run_row(sql, "r1")
    assert run["state"] == "FAILED" and run["ended_at"] is not None
    assert run["verdict"] == {
        "state": "FAILED",
        "checks": [{"what": "cancelled", "ok": False, "note": "cancelled by: drain:n1"}],
    }
    assert states(sql, "r1") == {"flash": "DONE", "boot": "FAILED"}
    assert leases(sql) == []


def test_an_at_boundary_drain_cancel_is_an_audit_event_caused_by_the_drain(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    advertise(client, "n1", cap("board"), policy={"drain": "at-boundary"})

    report(client, "r1", 1, "n1", exit_code=0)

    events = client.get("/v1/runs/r1/events").get_json()["events"]
    assert [(e["from"], e["to"]) for e in events] == [(None, "RUNNING"), ("RUNNING", "FAILED")]
    assert events[-1]["cause"] == "drain:n1"


def test_a_result_from_a_gracefully_draining_node_does_not_cancel_its_run(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    advertise(client, "n1", cap("board"), policy={"drain": "graceful"})

    reply = done(client, "r1", 1, "n1")

    assert reply["run_state"] == ""
    assert run_row(sql, "r1")["state"] == "RUNNING"
    assert claimed(client, "n1")["name"] == "boot"


def test_the_last_result_from_an_at_boundary_draining_node_gets_its_verdict(client, sql):
    # The run has no step left to stop before: the boundary is its end, and its verdict stands.
    advertise(client, "n1", cap("board"))
    submit(client, one_step("r1"), 201)
    claimed(client, "n1")
    advertise(client, "n1", cap("board"), policy={"drain": "at-boundary"})

    reply = done(client, "r1", 1, "n1")

    assert reply["run_state"] == "SUCCEEDED"
    assert run_row(sql, "r1")["verdict"]["state"] == "SUCCEEDED"


def test_an_at_boundary_drain_cancels_the_run_instead_of_rolling_its_loop_back(client, sql):
    advertise(client, "n1", cap())
    submit(client, build_then_test("r1"), 201)
    assert claimed(client, "n1")["name"] == "build"
    assert report(client, "r1", 1, "n1").status_code == 200
    assert claimed(client, "n1")["name"] == "test"
    advertise(client, "n1", cap(), policy={"drain": "at-boundary"})

    resp = report(client, "r1", 2, "n1", exit_code=1)  # would roll back to build

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 2, "run_state": "FAILED"}
    run = one(sql, "select state, ended_at, verdict from runs where run_id = 'r1'")
    assert run["state"] == "FAILED" and run["ended_at"] is not None
    assert run["verdict"] == {
        "state": "FAILED",
        "checks": [{"what": "cancelled", "ok": False, "note": "cancelled by: drain:n1"}],
    }
    assert leases(sql) == []
    assert not [s for s, _ in attempts(sql, "r1").values() if s in ("PENDING", "CLAIMED")]


# ------------------------------- the run view of steps (docs/api.md#get-v1runsrun_id--the-run-view)


def test_the_run_view_shows_each_step_with_kind_chosen_and_times_and_no_attempt_0(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    done(client, "r1", 1, "n1")
    claimed(client, "n1")

    steps = client.get("/v1/runs/r1").get_json()["steps"]

    flash, boot = steps
    assert (flash["seq"], flash["id"], flash["kind"], flash["state"]) == (1, "flash", "run", "DONE")
    assert (boot["seq"], boot["id"], boot["kind"], boot["state"]) == (2, "boot", "run", "CLAIMED")
    assert "attempt" not in flash and flash["chosen"] is False and flash["node"] == "n1"
    assert flash["needs"] == [] and boot["needs"] == ["flash"]
    assert flash["started_at"].endswith("Z") and flash["ended_at"] >= flash["started_at"]
    assert boot["started_at"].endswith("Z") and "ended_at" not in boot


def test_the_run_view_of_a_pending_step_has_no_times(client):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)

    steps = client.get("/v1/runs/r1").get_json()["steps"]

    assert [s["state"] for s in steps] == ["PENDING", "PENDING"]
    assert all("started_at" not in s and "ended_at" not in s for s in steps)
    assert all("attempt" not in s and s["chosen"] is False for s in steps)
