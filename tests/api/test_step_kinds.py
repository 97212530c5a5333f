"""Step kinds and step fields as they act on execution (docs/contract.md#steps): ``loop`` and
``validate_with`` rollbacks, ``dispatch``, ``release`` and ``acquire`` steps, and the audit events
they cause (docs/api.md#get-v1runsrun_idevents--a-runs-audit-trail).

Where a lease insert must wait on another transaction's uncommitted lease, the test polls
pg_stat_activity for the blocked backend (there is no event for that)."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from app.config import to_libpq_url
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, nothing_to_claim, put_blob, report
from tests.support.apps import client_of
from tests.support.concurrency import Background, await_condition
from tests.support.contracts import acquire_run, contract, role
from tests.support.rows import attempts, leases, rows, run_row, scalar, states, step_rows
from tests.support.scenes import queued_behind_a_freed_scope
from tests.support.submitter import submit

# One app for the module (see the ``app`` fixture): nearly every test here claims.
one_app_per_module = True


def blob_json(client: Any, run_id: str, name: str) -> Any:
    resp = client.get(f"/v1/runs/{run_id}/blob/{name}")
    assert resp.status_code == 200, resp.get_json()
    return json.loads(resp.data)


# ---------------------------------------------------------------- loop


def loop_run(
    run_id: str, until: dict[str, Any] | None = None, max_: int = 3, **top: Any
) -> dict[str, Any]:
    """build -> test (loops back to build until its exit code is 0) -> after."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {"id": "build", "uses": "dut", "run": ["make"]},
            {
                "id": "test",
                "uses": "dut",
                "run": ["make", "check"],
                "out": ["report.json"],
                "schema": {"report.json": {"type": "object", "required": ["ok"]}},
                "loop": {"back_to": "build", "max": max_, "until": until or {"exit_code": 0}},
            },
            {"id": "after", "uses": "dut", "run": ["publish"]},
        ],
        **top,
    )


def through_build(client: Any, run_id: str = "r1") -> None:
    claimed(client, "n1")
    done(client, run_id, 1, "n1")
    assert claimed(client, "n1")["name"] == "test"


def test_a_loop_with_until_unmet_resets_back_to_through_itself_with_attempt_plus_one(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, loop_run("r1"), 201)
    through_build(client)

    resp = report(client, "r1", 2, "n1", exit_code=1)

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 2, "rolled_back": True}
    assert attempts(sql, "r1") == {
        "build": ("PENDING", 1),
        "test": ("PENDING", 1),
        "after": ("PENDING", 0),
    }
    steps = step_rows(sql, "r1")
    assert steps["test"]["exit_code"] is None and steps["test"]["started_at"] is None
    assert steps["build"]["ended_at"] is None
    assert run_row(sql, "r1")["state"] == "RUNNING"


def test_a_rolled_back_step_is_claimed_again_with_its_new_attempt(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, loop_run("r1"), 201)
    through_build(client)
    report(client, "r1", 2, "n1", exit_code=1)

    body = claimed(client, "n1")

    assert (body["name"], body["attempt"]) == ("build", 1)


def test_a_loop_rollback_wakes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, loop_run("r1"), 201)
    through_build(client)
    queued_behind_a_freed_scope(client, sql)

    reply = report(client, "r1", 2, "n1", exit_code=1).get_json()

    assert reply["rolled_back"] is True
    assert run_row(sql, "waiter")["state"] == "QUEUED"
    # The freed scope was there to be found: the next result that is not a rollback wakes it.
    claimed(client, "n1")
    done(client, "r1", 1, "n1")
    assert run_row(sql, "waiter")["state"] == "RUNNING"


def test_a_loop_rollback_is_no_run_state_change(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, loop_run("r1"), 201)
    through_build(client)

    report(client, "r1", 2, "n1", exit_code=1)

    events = client.get("/v1/runs/r1/events").get_json()["events"]
    assert [(e["from"], e["to"]) for e in events] == [(None, "RUNNING")]


def test_a_loop_with_until_met_goes_on(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, loop_run("r1"), 201)
    through_build(client)

    resp = report(client, "r1", 2, "n1", exit_code=0)

    assert resp.get_json() == {"run_id": "r1", "seq": 2, "run_state": ""}
    assert attempts(sql, "r1") == {
        "build": ("DONE", 0),
        "test": ("DONE", 0),
        "after": ("PENDING", 0),
    }
    assert claimed(client, "n1")["name"] == "after"


def test_a_loop_until_produced_is_met_by_an_accepted_blob(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, loop_run("r1", until={"produced": ["report.json"]}), 201)
    through_build(client)
    assert put_blob(client, "r1", 2, "report.json", b'{"ok": true}') == 204

    reply = done(client, "r1", 2, "n1", exit_code=1, produced=["report.json"])

    assert reply == {"run_id": "r1", "seq": 2, "run_state": ""}
    assert states(sql, "r1")["test"] == "DONE"


def test_a_loop_until_produced_is_unmet_by_a_blob_its_schema_rejected(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, loop_run("r1", until={"produced": ["report.json"]}), 201)
    through_build(client)
    assert put_blob(client, "r1", 2, "report.json", b'{"nope": 1}') == 422

    reply = done(client, "r1", 2, "n1", exit_code=0, produced=["report.json"])

    assert reply == {"run_id": "r1", "seq": 2, "rolled_back": True}
    assert attempts(sql, "r1")["test"] == ("PENDING", 1)


def test_a_loop_at_its_max_leaves_the_step_done_and_the_run_goes_on(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, loop_run("r1", max_=2), 201)
    through_build(client)
    assert report(client, "r1", 2, "n1", exit_code=1).get_json()["rolled_back"] is True
    through_build(client)

    resp = report(client, "r1", 2, "n1", exit_code=1)

    assert resp.get_json() == {"run_id": "r1", "seq": 2, "run_state": ""}
    assert attempts(sql, "r1") == {
        "build": ("DONE", 1),
        "test": ("DONE", 1),
        "after": ("PENDING", 0),
    }
    assert step_rows(sql, "r1")["test"]["exit_code"] == 1
    assert claimed(client, "n1")["name"] == "after"


def test_a_loop_that_ran_out_of_attempts_fails_within_attempts(client, sql):
    advertise(client, "n1", cap("board"))
    doc = loop_run("r1", max_=2, success_when=[{"step": "test", "within_attempts": True}])
    submit(client, doc, 201)
    for _ in range(2):
        through_build(client)
        report(client, "r1", 2, "n1", exit_code=1)
    claimed(client, "n1")

    reply = done(client, "r1", 3, "n1")

    assert reply["run_state"] == "FAILED"
    verdict = run_row(sql, "r1")["verdict"]
    assert verdict["state"] == "FAILED"
    assert [(c["step"], c["what"], c["ok"]) for c in verdict["checks"]] == [
        ("test", "within_attempts", False)
    ]


def test_a_loop_met_before_its_max_passes_within_attempts(client, sql):
    advertise(client, "n1", cap("board"))
    doc = loop_run("r1", max_=3, success_when=[{"step": "test", "within_attempts": True}])
    submit(client, doc, 201)
    through_build(client)
    report(client, "r1", 2, "n1", exit_code=1)
    through_build(client)
    done(client, "r1", 2, "n1", exit_code=0)
    claimed(client, "n1")

    reply = done(client, "r1", 3, "n1")

    assert reply["run_state"] == "SUCCEEDED"
    checks = run_row(sql, "r1")["verdict"]["checks"]
    assert [(c["what"], c["ok"]) for c in checks] == [("within_attempts", True)]


def test_a_loop_rollback_leaves_an_acquire_step_in_its_range_done(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    doc = contract(
        "r1",
        role("dut"),
        steps=[
            {"id": "prep", "uses": "dut", "run": ["prep"]},
            {
                "id": "grab",
                "acquire": {
                    "want": {"as": "scope", "capability": "scope"},
                    "acquired": "measure",
                    "unavailable": "fallback",
                },
            },
            {
                "id": "check",
                "uses": "dut",
                "run": ["check"],
                "needs": ["grab"],
                "loop": {"back_to": "prep", "max": 2, "until": {"exit_code": 0}},
            },
            {"id": "measure", "uses": "scope", "run": ["measure"]},
            {"id": "fallback", "uses": "dut", "run": ["fallback"]},
        ],
    )
    submit(client, doc, 201)
    claimed(client, "n1")
    done(client, "r1", 1, "n1")
    assert claimed(client, "n1")["name"] == "check"

    reply = report(client, "r1", 3, "n1", exit_code=1).get_json()

    assert reply["rolled_back"] is True
    assert attempts(sql, "r1") == {
        "prep": ("PENDING", 1),
        "grab": ("DONE", 0),
        "check": ("PENDING", 1),
        "measure": ("PENDING", 0),
        "fallback": ("SKIPPED", 0),
    }
    assert leases(sql) == [("n1", "r1"), ("s1", "r1")]


def test_a_loop_rollback_keeps_the_branch_an_acquire_did_not_take_skipped(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    doc = contract(
        "r1",
        role("dut"),
        steps=[
            {"id": "prep", "uses": "dut", "run": ["prep"]},
            {
                "id": "grab",
                "acquire": {
                    "want": {"as": "scope", "capability": "scope"},
                    "acquired": "measure",
                    "unavailable": "fallback",
                },
            },
            {"id": "measure", "uses": "scope", "run": ["measure"]},
            {"id": "fallback", "uses": "dut", "run": ["fallback"], "needs": ["grab"]},
            {
                "id": "check",
                "uses": "dut",
                "run": ["check"],
                "needs": ["measure", "fallback"],
                "loop": {"back_to": "prep", "max": 2, "until": {"exit_code": 0}},
            },
        ],
    )
    submit(client, doc, 201)
    claimed(client, "n1")
    done(client, "r1", 1, "n1")
    assert claimed(client, "s1")["name"] == "measure"
    done(client, "r1", 3, "s1")
    assert claimed(client, "n1")["name"] == "check"

    assert report(client, "r1", 5, "n1", exit_code=1).get_json()["rolled_back"] is True

    # The acquire is not done again, so its decision stands: the fallback branch is not run.
    assert attempts(sql, "r1") == {
        "prep": ("PENDING", 1),
        "grab": ("DONE", 0),
        "measure": ("PENDING", 1),
        "fallback": ("SKIPPED", 0),
        "check": ("PENDING", 1),
    }


def test_a_loop_rollback_inside_a_dispatched_branch_keeps_the_other_branch_skipped(client, sql):
    advertise(client, "n1", cap("board"))
    doc = contract(
        "r1",
        role("dut"),
        steps=[
            {
                "id": "triage",
                "uses": "dut",
                "run": ["triage"],
                "out": ["triage.json"],
                "dispatch": {"from": "triage.json.lane", "to": ["fast", "slow"]},
            },
            {"id": "fast", "uses": "dut", "run": ["fast"], "needs": ["triage"]},
            {"id": "slow", "uses": "dut", "run": ["slow"], "needs": ["triage"]},
            {
                "id": "check",
                "uses": "dut",
                "run": ["check"],
                "needs": ["fast", "slow"],
                "loop": {"back_to": "fast", "max": 2, "until": {"exit_code": 0}},
            },
        ],
    )
    submit(client, doc, 201)
    claimed(client, "n1")
    assert put_blob(client, "r1", 1, "triage.json", b'{"lane": "fast"}') == 204
    done(client, "r1", 1, "n1", produced=["triage.json"])
    assert claimed(client, "n1")["name"] == "fast"
    done(client, "r1", 2, "n1")
    assert claimed(client, "n1")["name"] == "check"

    assert report(client, "r1", 4, "n1", exit_code=1).get_json()["rolled_back"] is True

    # triage is before the loop and is not asked again: its choice stands.
    assert attempts(sql, "r1") == {
        "triage": ("DONE", 0),
        "fast": ("PENDING", 1),
        "slow": ("SKIPPED", 0),
        "check": ("PENDING", 1),
    }
    view = client.get("/v1/runs/r1").get_json()
    assert {st["id"]: st["chosen"] for st in view["steps"]} == {
        "triage": False,
        "fast": True,
        "slow": False,
        "check": False,
    }
    assert claimed(client, "n1")["name"] == "fast"


# ---------------------------------------------------------------- validate_with


def validated_run(run_id: str, max_attempts: int | None = 2, **top: Any) -> dict[str, Any]:
    """flash (validated by verify) -> boot -> verify."""
    flash: dict[str, Any] = {
        "id": "flash",
        "uses": "dut",
        "run": ["flash"],
        "validate_with": "verify",
    }
    if max_attempts is not None:
        flash["max_attempts"] = max_attempts
    return contract(
        run_id,
        role("dut"),
        steps=[
            flash,
            {"id": "boot", "uses": "dut", "run": ["boot"]},
            {"id": "verify", "uses": "dut", "run": ["verify"]},
        ],
        **top,
    )


def up_to_verify(client: Any, run_id: str = "r1") -> None:
    for seq in (1, 2):
        claimed(client, "n1")
        done(client, run_id, seq, "n1")
    assert claimed(client, "n1")["name"] == "verify"


def test_a_validator_with_a_nonzero_exit_resets_the_validated_step_through_itself(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, validated_run("r1"), 201)
    up_to_verify(client)

    resp = report(client, "r1", 3, "n1", exit_code=2)

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 3, "rolled_back": True}
    assert attempts(sql, "r1") == {
        "flash": ("PENDING", 1),
        "boot": ("PENDING", 1),
        "verify": ("PENDING", 1),
    }
    assert (claimed(client, "n1")["name"], run_row(sql, "r1")["state"]) == ("flash", "RUNNING")


def test_a_validator_that_reports_an_error_resets_instead_of_failing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, validated_run("r1"), 201)
    up_to_verify(client)

    resp = report(client, "r1", 3, "n1", exit_code=None, error="verify: board did not answer")

    assert resp.get_json() == {"run_id": "r1", "seq": 3, "rolled_back": True}
    assert attempts(sql, "r1")["verify"] == ("PENDING", 1)
    assert run_row(sql, "r1")["state"] == "RUNNING"


def test_a_validator_rollback_wakes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, validated_run("r1"), 201)
    up_to_verify(client)
    queued_behind_a_freed_scope(client, sql)

    assert report(client, "r1", 3, "n1", exit_code=2).get_json()["rolled_back"] is True

    assert run_row(sql, "waiter")["state"] == "QUEUED"


def test_a_validator_that_passes_lets_the_run_succeed_on_the_first_attempt(client, sql):
    advertise(client, "n1", cap("board"))
    submit(
        client, validated_run("r1", success_when=[{"step": "flash", "within_attempts": True}]), 201
    )
    up_to_verify(client)

    reply = done(client, "r1", 3, "n1", exit_code=0)

    assert reply["run_state"] == "SUCCEEDED"
    assert attempts(sql, "r1") == {"flash": ("DONE", 0), "boot": ("DONE", 0), "verify": ("DONE", 0)}


def test_a_validator_failing_at_max_attempts_no_longer_rolls_back(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, validated_run("r1", max_attempts=2), 201)
    up_to_verify(client)
    report(client, "r1", 3, "n1", exit_code=2)
    up_to_verify(client)

    resp = report(client, "r1", 3, "n1", exit_code=2)

    assert "rolled_back" not in resp.get_json()
    assert attempts(sql, "r1") == {"flash": ("DONE", 1), "boot": ("DONE", 1), "verify": ("DONE", 1)}


def test_a_validated_step_out_of_attempts_fails_within_attempts(client, sql):
    advertise(client, "n1", cap("board"))
    doc = validated_run(
        "r1", max_attempts=2, success_when=[{"step": "flash", "within_attempts": True}]
    )
    submit(client, doc, 201)
    up_to_verify(client)
    report(client, "r1", 3, "n1", exit_code=2)
    up_to_verify(client)

    reply = done(client, "r1", 3, "n1", exit_code=2)

    assert reply["run_state"] == "FAILED"
    verdict = run_row(sql, "r1")["verdict"]
    assert [(c["step"], c["what"], c["got"], c["ok"]) for c in verdict["checks"]] == [
        ("flash", "within_attempts", False, False)
    ]


def test_a_validator_error_at_max_attempts_fails_the_run(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, validated_run("r1", max_attempts=2), 201)
    up_to_verify(client)
    report(client, "r1", 3, "n1", exit_code=None, error="broken")
    up_to_verify(client)

    reply = report(client, "r1", 3, "n1", exit_code=None, error="broken again").get_json()

    assert reply == {"run_id": "r1", "seq": 3, "run_state": "FAILED"}
    checks = run_row(sql, "r1")["verdict"]["checks"]
    assert [(c["step"], c["what"], c["note"]) for c in checks] == [
        ("verify", "ran", "a step did not complete")
    ]


def test_max_attempts_defaults_to_one_so_a_failing_validator_does_not_roll_back(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, validated_run("r1", max_attempts=None), 201)
    up_to_verify(client)

    reply = report(client, "r1", 3, "n1", exit_code=2).get_json()

    assert "rolled_back" not in reply
    assert attempts(sql, "r1")["flash"] == ("DONE", 0)


# ---------------------------------------------------------------- dispatch


def dispatch_run(run_id: str, **top: Any) -> dict[str, Any]:
    """triage dispatches on triage.json route.lane to fast or slow; slow-report needs only slow;
    summary needs both."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {
                "id": "triage",
                "uses": "dut",
                "run": ["triage"],
                "out": ["triage.json"],
                "dispatch": {"from": "triage.json.route.lane", "to": ["fast", "slow"]},
            },
            {"id": "fast", "uses": "dut", "run": ["fast"]},
            {"id": "slow", "uses": "dut", "run": ["slow"]},
            {"id": "slow-report", "uses": "dut", "run": ["report"], "needs": ["slow"]},
            {"id": "summary", "uses": "dut", "run": ["summary"], "needs": ["fast", "slow"]},
        ],
        **top,
    )


def dispatched(client: Any, lane: Any, run_id: str = "r1") -> Any:
    claimed(client, "n1")
    data = json.dumps({"route": {"lane": lane}}).encode()
    assert put_blob(client, run_id, 1, "triage.json", data) == 204
    return report(client, run_id, 1, "n1", exit_code=0, produced=["triage.json"])


def test_dispatch_picks_the_target_named_in_the_produced_blob_and_skips_the_other(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, dispatch_run("r1"), 201)

    resp = dispatched(client, "fast")

    assert resp.status_code == 200 and resp.get_json()["run_state"] == ""
    got = states(sql, "r1")
    assert (got["triage"], got["fast"], got["slow"]) == ("DONE", "PENDING", "SKIPPED")
    assert claimed(client, "n1")["name"] == "fast"


def test_dispatch_skips_propagate_to_steps_whose_needs_are_all_skipped(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, dispatch_run("r1"), 201)

    dispatched(client, "fast")

    got = states(sql, "r1")
    assert (got["slow-report"], got["summary"]) == ("SKIPPED", "PENDING")


def test_the_run_view_marks_the_step_a_dispatch_chose(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, dispatch_run("r1"), 201)

    dispatched(client, "slow")

    steps = client.get("/v1/runs/r1").get_json()["steps"]
    assert {s["id"]: (s["state"], s["chosen"]) for s in steps} == {
        "triage": ("DONE", False),
        "fast": ("SKIPPED", False),
        "slow": ("PENDING", True),
        "slow-report": ("PENDING", False),
        "summary": ("PENDING", False),
    }


def test_a_dispatch_value_not_in_to_fails_the_step_and_still_answers_200(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, dispatch_run("r1"), 201)

    resp = dispatched(client, "medium")

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": "FAILED"}
    triage = step_rows(sql, "r1")["triage"]
    assert triage["state"] == "FAILED" and "medium" in triage["error"]
    assert run_row(sql, "r1")["verdict"]["checks"][0]["step"] == "triage"


def test_a_dispatch_value_that_is_not_a_string_fails_the_step(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, dispatch_run("r1"), 201)

    resp = dispatched(client, ["fast"])

    assert resp.status_code == 200 and resp.get_json()["run_state"] == "FAILED"
    assert states(sql, "r1")["triage"] == "FAILED"


def test_a_dispatch_whose_blob_was_never_stored_fails_the_step(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, dispatch_run("r1"), 201)
    claimed(client, "n1")

    resp = report(client, "r1", 1, "n1", exit_code=0, produced=["triage.json"])

    assert resp.status_code == 200 and resp.get_json()["run_state"] == "FAILED"
    assert states(sql, "r1")["triage"] == "FAILED"


# ---------------------------------------------------------------- release


def release_run(run_id: str, releasing: str = "dut") -> dict[str, Any]:
    """flash on the board, then a step on ``releasing``'s node releases the board, then analyse on
    the host."""
    steps = [{"id": "flash", "uses": "dut", "run": ["flash"]}]
    if releasing == "dut":
        steps[0]["release"] = ["dut"]
    else:
        steps.append({"id": "unplug", "uses": "host", "run": ["unplug"], "release": ["dut"]})
    steps.append({"id": "analyse", "uses": "host", "run": ["analyse"]})
    return contract(run_id, role("dut"), role("host", "agent.reason"), steps=steps)


def board_and_host(client: Any) -> None:
    advertise(client, "n1", cap("board"))
    advertise(client, "h1", cap("agent.reason"))


def test_a_release_deletes_the_released_roles_lease_mid_run(client, sql):
    board_and_host(client)
    submit(client, release_run("r1"), 201)
    claimed(client, "n1")

    reply = done(client, "r1", 1, "n1")

    assert reply == {"run_id": "r1", "seq": 1, "run_state": ""}
    assert leases(sql) == [("h1", "r1")]
    assert run_row(sql, "r1")["state"] == "RUNNING"


def test_a_released_node_no_longer_finds_the_lease_in_its_heartbeat_reply(client, sql):
    board_and_host(client)
    submit(client, release_run("r1"), 201)
    assert [lease["run_id"] for lease in advertise(client, "n1", cap("board"))["leases"]] == ["r1"]
    claimed(client, "n1")

    done(client, "r1", 1, "n1")

    assert advertise(client, "n1", cap("board"))["leases"] == []
    assert [
        lease["run_id"] for lease in advertise(client, "h1", cap("agent.reason"))["leases"]
    ] == ["r1"]


def test_a_release_promotes_a_run_queued_for_that_node_while_the_releasing_run_goes_on(client, sql):
    board_and_host(client)
    submit(client, release_run("r1"), 201)
    submit(client, contract("r2"), 202)
    claimed(client, "n1")

    reply = done(client, "r1", 1, "n1")

    assert reply["run_state"] == ""
    assert run_row(sql, "r2")["state"] == "RUNNING"
    assert run_row(sql, "r1")["state"] == "RUNNING"
    assert leases(sql) == [("h1", "r1"), ("n1", "r2")]
    assert claimed(client, "h1")["name"] == "analyse"
    assert claimed(client, "n1")["run_id"] == "r2"


def test_a_run_promoted_by_a_release_names_the_released_node_in_its_event(client, sql):
    board_and_host(client)
    submit(client, release_run("r1", releasing="host"), 201)
    submit(client, contract("r2"), 202)
    claimed(client, "n1")
    done(client, "r1", 1, "n1")
    claimed(client, "h1")

    done(client, "r1", 2, "h1")

    events = client.get("/v1/runs/r2/events").get_json()["events"]
    assert [(e["from"], e["to"]) for e in events] == [(None, "QUEUED"), ("QUEUED", "RUNNING")]
    assert events[1]["cause"] == "promoted: released by r1/n1"


def test_a_release_keeps_a_node_that_also_fills_a_kept_role(client, sql):
    advertise(client, "n1", cap("board"))
    doc = contract(
        "r1",
        role("dut"),
        role("probe"),
        steps=[
            {"id": "flash", "uses": "dut", "run": ["flash"], "release": ["dut"]},
            {"id": "measure", "uses": "probe", "run": ["measure"]},
        ],
    )
    submit(client, doc, 201)
    submit(client, contract("r2"), 202)
    claimed(client, "n1")

    done(client, "r1", 1, "n1")

    assert leases(sql) == [("n1", "r1")]
    assert run_row(sql, "r2")["state"] == "QUEUED"
    assert claimed(client, "n1")["name"] == "measure"


# ---------------------------------------------------------------- acquire


def through_prep(client: Any, run_id: str = "r1") -> dict[str, Any]:
    claimed(client, "n1")
    return done(client, run_id, 1, "n1")


def test_an_acquire_step_leases_a_free_node_until_the_runs_not_after(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run("r1"), 201)
    assert leases(sql) == [("n1", "r1")]
    sql.execute("update leases set not_after = now() + interval '17 minutes' where run_id = 'r1'")

    through_prep(client)

    got = rows(sql, "select node_id, run_id, not_after from leases order by node_id")
    assert [(r["node_id"], r["run_id"]) for r in got] == [("n1", "r1"), ("s1", "r1")]
    assert got[1]["not_after"] == got[0]["not_after"]


def test_an_acquired_node_finds_the_lease_in_its_heartbeat_reply(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run("r1"), 201)

    through_prep(client)

    reply = advertise(client, "s1", cap("scope"))
    assert [(x["run_id"], x["node"], x["capability"]) for x in reply["leases"]] == [
        ("r1", "s1", "scope")
    ]
    assert len(reply["leases"][0]["nonce"]) == 32


def test_an_acquired_node_is_bound_to_the_new_roles_steps(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run("r1"), 201)
    assert step_rows(sql, "r1")["measure"]["node_id"] is None

    through_prep(client)

    assert step_rows(sql, "r1")["measure"]["node_id"] == "s1"
    body = claimed(client, "s1")
    assert (body["name"], body["lease"]["node"]) == ("measure", "s1")


def test_an_acquire_that_got_a_node_skips_the_unavailable_target_and_is_done(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run("r1"), 201)

    reply = through_prep(client)

    assert reply["run_state"] == ""
    assert states(sql, "r1") == {
        "prep": "DONE",
        "grab": "DONE",
        "measure": "PENDING",
        "fallback": "SKIPPED",
    }
    grab = step_rows(sql, "r1")["grab"]
    assert grab["started_at"] is not None and grab["ended_at"] is not None


def test_an_acquire_stores_its_outcome_as_a_blob_named_after_the_step(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run("r1"), 201)

    through_prep(client)

    assert blob_json(client, "r1", "grab") == {"state": "acquired", "node": "s1"}


def test_an_acquire_with_no_candidate_is_unavailable_and_skips_the_acquired_target(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, acquire_run("r1"), 201)

    reply = through_prep(client)

    assert reply["run_state"] == ""
    assert blob_json(client, "r1", "grab") == {"state": "unavailable"}
    assert states(sql, "r1") == {
        "prep": "DONE",
        "grab": "DONE",
        "measure": "SKIPPED",
        "fallback": "PENDING",
    }
    assert leases(sql) == [("n1", "r1")]
    assert claimed(client, "n1")["name"] == "fallback"


def test_an_acquire_whose_only_candidate_is_busy_is_unavailable_and_the_result_goes_on(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, contract("holder", role("probe", "scope")), 201)
    submit(client, acquire_run("r1"), 201)

    reply = through_prep(client)

    assert reply == {"run_id": "r1", "seq": 1, "run_state": ""}
    assert blob_json(client, "r1", "grab") == {"state": "unavailable"}
    assert states(sql, "r1")["grab"] == "DONE"
    assert states(sql, "r1")["measure"] == "SKIPPED"
    assert leases(sql) == [("n1", "r1"), ("s1", "holder")]


def test_an_acquire_does_not_take_a_draining_node(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"), policy={"drain": "graceful"})
    submit(client, acquire_run("r1"), 201)

    through_prep(client)

    assert blob_json(client, "r1", "grab") == {"state": "unavailable"}
    assert leases(sql) == [("n1", "r1")]


def test_an_acquire_does_not_take_a_node_whose_advert_expired(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run("r1"), 201)
    sql.execute("update nodes set expires_at = now() - interval '1 second' where node_id = 's1'")

    through_prep(client)

    assert blob_json(client, "r1", "grab") == {"state": "unavailable"}
    assert leases(sql) == [("n1", "r1")]


def test_an_acquire_step_whose_needs_are_met_at_creation_runs_at_submit(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    doc = acquire_run("r1")
    doc["steps"][1]["needs"] = []

    submit(client, doc, 201)

    assert states(sql, "r1")["grab"] == "DONE"
    assert leases(sql) == [("n1", "r1"), ("s1", "r1")]
    assert claimed(client, "s1")["name"] == "measure"


def test_a_queued_run_acquires_nothing_until_it_is_promoted(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, contract("first"), 201)
    doc = acquire_run("r1")
    doc["steps"][1]["needs"] = []
    submit(client, doc, 202)
    assert states(sql, "r1")["grab"] == "PENDING" and leases(sql) == [("n1", "first")]
    claimed(client, "n1")

    done(client, "first", 1, "n1")

    assert run_row(sql, "r1")["state"] == "RUNNING"
    assert states(sql, "r1")["grab"] == "DONE"
    assert leases(sql) == [("n1", "r1"), ("s1", "r1")]


def test_an_acquire_step_is_never_handed_to_a_node(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run("r1"), 201)
    claimed(client, "n1")

    assert nothing_to_claim(client, "n1") and nothing_to_claim(client, "s1")
    assert states(sql, "r1")["grab"] == "PENDING"


def test_an_acquire_whose_lease_insert_meets_a_concurrent_lease_means_unavailable(
    app, client, sql, db_url
):
    advertise(client, "n0", cap("other"))
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, contract("r0", role("x", "other")), 201)
    doc = contract(
        "r1",
        role("dut"),
        steps=[
            {"id": "prep", "uses": "dut", "run": ["prep"]},
            {
                "id": "get-scope",
                "acquire": {
                    "want": {"as": "probe", "capability": "scope"},
                    "acquired": "with-scope",
                    "unavailable": "without-scope",
                },
                "needs": ["prep"],
            },
            {"id": "with-scope", "uses": "probe", "run": ["measure"], "needs": ["get-scope"]},
            {"id": "without-scope", "uses": "dut", "run": ["guess"], "needs": ["get-scope"]},
        ],
    )
    submit(client, doc, 201)
    assert claimed(client, "n1")["name"] == "prep"

    with psycopg.connect(to_libpq_url(db_url)) as other:
        # Another transaction takes s1 for r0 and has not committed yet.
        other.execute(
            "insert into leases (node_id, run_id, role, capability, not_after, nonce)"
            " values ('s1', 'r0', 'probe', 'scope', now() + interval '1 hour', %s)",
            ("f" * 32,),
        )
        reporting = Background(lambda: report(client_of(app), "r1", 1, "n1"))
        await_condition(
            lambda: (
                scalar(
                    sql,
                    "select count(*) from pg_stat_activity where datname = current_database()"
                    " and wait_event_type = 'Lock' and query ilike %s",
                    "insert into leases%",
                )
                > 0
                or reporting.done.is_set()
            ),
            "the acquire's lease insert to wait on the uncommitted lease",
        )
        assert not reporting.done.is_set(), "the result did not wait on the lease insert"
        other.commit()

        resp = reporting.result()

    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": ""}
    assert attempts(sql, "r1") == {
        "prep": ("DONE", 0),
        "get-scope": ("DONE", 0),
        "with-scope": ("SKIPPED", 0),
        "without-scope": ("PENDING", 0),
    }
    blob = client.get("/v1/runs/r1/blob/get-scope")
    assert blob.status_code == 200 and json.loads(blob.data) == {"state": "unavailable"}
    assert scalar(sql, "select state from runs where run_id = 'r1'") == "RUNNING"
    assert leases(sql) == [("n0", "r0"), ("n1", "r1"), ("s1", "r0")]


# ---------------------------------------------------------------- kinds in the run view


def test_the_run_view_names_the_kind_of_every_step(client, sql):
    advertise(client, "n1", cap("board"))
    doc = contract(
        "r1",
        role("dut"),
        steps=[
            {"id": "build", "uses": "dut", "run": ["make"]},
            {"id": "review", "uses": "dut", "agent": {}, "in": {"prompt": "Review the diff"}},
            {
                "id": "grab",
                "acquire": {
                    "want": {"as": "scope", "capability": "scope"},
                    "acquired": "measure",
                    "unavailable": "approve",
                },
            },
            {"id": "measure", "uses": "scope", "run": ["measure"]},
            {
                "id": "approve",
                "ask": {"prompt": "Ship it?"},
                "out": ["decision"],
                "schema": {
                    "decision": {"type": "object", "properties": {"ok": {"type": "boolean"}}}
                },
            },
        ],
    )
    submit(client, doc, 201)

    steps = client.get("/v1/runs/r1").get_json()["steps"]

    assert [(s["id"], s["kind"]) for s in steps] == [
        ("build", "run"),
        ("review", "agent"),
        ("grab", "acquire"),
        ("measure", "run"),
        ("approve", "ask"),
    ]
    assert "uses" not in steps[2] and "uses" not in steps[4]
