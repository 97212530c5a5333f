"""The verdict through the HTTP API (docs/contract.md#success_when): every ``success_when`` rule,
VERIFYING in the audit trail (docs/api.md#get-v1runsrun_idevents--a-runs-audit-trail), what a
finished run leaves behind (ended_at, no leases, a sealed Record) and the ``notify.runs_url``
announcement (docs/configuration.md#webhooks), received by a real local server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, put_blob, report
from tests.support.contracts import contract, role
from tests.support.rows import leases, run_row, states, transitions
from tests.support.submitter import submit
from tests.support.webhooks import RunsHook

# One app for the module (see the ``app`` fixture), announcing its runs to ``hook``.
one_app_per_module = True


# ---------------------------------------------------------------- the runs_url receiver


@pytest.fixture(scope="module")
def hook() -> Iterator[RunsHook]:
    receiver = RunsHook()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture(scope="module")
def module_config(hook: RunsHook) -> dict[str, Any]:
    return {"notify.runs_url": hook.url}


# ---------------------------------------------------------------- contracts


def boot_run(run_id: str, success_when: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One run step on the board that may produce result.json (schema: an object with ok)."""
    doc = contract(
        run_id,
        role("dut"),
        steps=[
            {
                "id": "boot",
                "uses": "dut",
                "run": ["boot-test"],
                "out": ["result.json", "console.log"],
                "schema": {"result.json": {"type": "object", "required": ["ok"]}},
            }
        ],
    )
    if success_when is not None:
        doc["success_when"] = success_when
    return doc


def pick_run(
    run_id: str, success_when: list[dict[str, Any]], b_needs_a: bool = False
) -> dict[str, Any]:
    """pick dispatches on pick.json lane to a or b."""
    b: dict[str, Any] = {"id": "b", "uses": "dut", "run": ["b"]}
    if b_needs_a:
        b["needs"] = ["a"]
    return contract(
        run_id,
        role("dut"),
        steps=[
            {
                "id": "pick",
                "uses": "dut",
                "run": ["pick"],
                "out": ["pick.json"],
                "dispatch": {"from": "pick.json.lane", "to": ["a", "b"]},
            },
            {"id": "a", "uses": "dut", "run": ["a"]},
            b,
        ],
        success_when=success_when,
    )


def pick(client: Any, lane: str, run_id: str = "r1") -> dict[str, Any]:
    claimed(client, "n1")
    assert put_blob(client, run_id, 1, "pick.json", json.dumps({"lane": lane}).encode()) == 204
    return done(client, run_id, 1, "n1", produced=["pick.json"])


def finish_boot(client: Any, run_id: str = "r1", **result: Any) -> dict[str, Any]:
    claimed(client, "n1")
    return done(client, run_id, 1, "n1", **result)


# ---------------------------------------------------------------- no success_when


def test_without_success_when_a_run_succeeds_when_nothing_failed_whatever_its_exit_codes(
    client, sql
):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1"), 201)

    reply = finish_boot(client, exit_code=5)

    assert reply["run_state"] == "SUCCEEDED"
    assert run_row(sql, "r1")["verdict"] == {"state": "SUCCEEDED", "checks": []}
    assert client.get("/v1/runs/r1").get_json()["verdict"] == {"state": "SUCCEEDED", "checks": []}


# ---------------------------------------------------------------- exit_code and produced


def test_an_exit_code_condition_compares_with_the_reported_exit_code(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1", [{"step": "boot", "exit_code": 0}]), 201)

    reply = finish_boot(client, exit_code=2)

    assert reply["run_state"] == "FAILED"
    assert run_row(sql, "r1")["verdict"] == {
        "state": "FAILED",
        "checks": [{"step": "boot", "what": "exit_code", "want": 0, "got": 2, "ok": False}],
    }


def test_an_exit_code_condition_that_holds_makes_the_run_succeed(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1", [{"step": "boot", "exit_code": 0}]), 201)

    reply = finish_boot(client, exit_code=0)

    assert reply["run_state"] == "SUCCEEDED"
    checks = run_row(sql, "r1")["verdict"]["checks"]
    assert checks == [{"step": "boot", "what": "exit_code", "want": 0, "got": 0, "ok": True}]


def test_a_produced_condition_holds_for_a_blob_its_schema_accepted(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1", [{"step": "boot", "produced": ["result.json"]}]), 201)
    claimed(client, "n1")
    assert put_blob(client, "r1", 1, "result.json", b'{"ok": true}') == 204

    reply = done(client, "r1", 1, "n1", produced=["result.json"])

    assert reply["run_state"] == "SUCCEEDED"
    checks = run_row(sql, "r1")["verdict"]["checks"]
    assert checks == [
        {
            "step": "boot",
            "what": "produced",
            "want": ["result.json"],
            "got": ["result.json"],
            "ok": True,
        }
    ]


def test_a_blob_rejected_by_its_schema_was_not_produced(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1", [{"step": "boot", "produced": ["result.json"]}]), 201)
    claimed(client, "n1")
    assert put_blob(client, "r1", 1, "result.json", b'{"nope": 1}') == 422

    reply = done(client, "r1", 1, "n1", produced=["result.json"])

    assert reply["run_state"] == "FAILED"
    checks = run_row(sql, "r1")["verdict"]["checks"]
    assert checks == [
        {"step": "boot", "what": "produced", "want": ["result.json"], "got": [], "ok": False}
    ]


def test_a_produced_condition_fails_for_an_output_the_step_did_not_produce(client, sql):
    advertise(client, "n1", cap("board"))
    doc = boot_run("r1", [{"step": "boot", "produced": ["result.json", "console.log"]}])
    submit(client, doc, 201)
    claimed(client, "n1")
    assert put_blob(client, "r1", 1, "result.json", b'{"ok": false}') == 204

    reply = done(client, "r1", 1, "n1", produced=["result.json"])

    assert reply["run_state"] == "FAILED"
    check = run_row(sql, "r1")["verdict"]["checks"][0]
    assert (check["got"], check["ok"]) == (["result.json"], False)


# ---------------------------------------------------------------- skipped steps


def test_a_skipped_steps_condition_is_vacuously_ok(client, sql):
    advertise(client, "n1", cap("board"))
    doc = pick_run("r1", [{"step": "a", "exit_code": 0}, {"step": "b", "exit_code": 0}])
    submit(client, doc, 201)
    pick(client, "b")
    claimed(client, "n1")

    reply = done(client, "r1", 3, "n1", exit_code=0)

    assert reply["run_state"] == "SUCCEEDED"
    checks = run_row(sql, "r1")["verdict"]["checks"]
    assert [(c["step"], c["ok"]) for c in checks] == [("a", True), ("b", True)]


def test_a_step_a_dispatch_chose_that_ended_skipped_has_no_result_and_fails_ran(client, sql):
    advertise(client, "n1", cap("board"))
    # b needs only a: choosing b skips a, and the skip reaches b, although the dispatch chose b.
    submit(client, pick_run("r1", [{"step": "b"}], b_needs_a=True), 201)

    reply = pick(client, "b")

    assert states(sql, "r1") == {"pick": "DONE", "a": "SKIPPED", "b": "SKIPPED"}
    assert reply["run_state"] == "FAILED"
    checks = run_row(sql, "r1")["verdict"]["checks"]
    assert [(c["step"], c["what"], c["ok"]) for c in checks] == [("b", "ran", False)]


def test_a_run_whose_every_conditioned_step_was_skipped_fails_any(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, pick_run("r1", [{"step": "a", "exit_code": 0}]), 201)
    pick(client, "b")
    claimed(client, "n1")

    reply = done(client, "r1", 3, "n1", exit_code=0)

    assert reply["run_state"] == "FAILED"
    verdict = run_row(sql, "r1")["verdict"]
    assert verdict["state"] == "FAILED"
    assert [c["what"] for c in verdict["checks"] if not c["ok"]] == ["any"]


# ---------------------------------------------------------------- fleet_has


def fleet_run(run_id: str) -> dict[str, Any]:
    return boot_run(run_id, [{"fleet_has": {"capability": "scope"}, "min_count": 2}])


def test_fleet_has_counts_the_live_adverts_when_the_verdict_is_made(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    advertise(client, "s2", cap("scope"))
    submit(client, fleet_run("r1"), 201)
    sql.execute("update nodes set expires_at = now() - interval '1 second' where node_id = 's2'")

    reply = finish_boot(client, exit_code=0)

    assert reply["run_state"] == "FAILED"
    check = run_row(sql, "r1")["verdict"]["checks"][0]
    assert (check["what"], check["want"], check["got"], check["ok"]) == ("fleet_has", 2, 1, False)


def test_fleet_has_counts_a_node_that_advertised_after_submit(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, fleet_run("r1"), 201)
    advertise(client, "s2", cap("scope"))

    reply = finish_boot(client, exit_code=0)

    assert reply["run_state"] == "SUCCEEDED"
    check = run_row(sql, "r1")["verdict"]["checks"][0]
    assert (check["what"], check["got"], check["ok"]) == ("fleet_has", 2, True)


def test_the_fleet_that_was_counted_is_stored_with_the_verdict(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    advertise(client, "s2", cap("scope"))
    advertise(client, "s3", cap("scope"))
    submit(client, fleet_run("r1"), 201)
    sql.execute("update nodes set expires_at = now() - interval '1 second' where node_id = 's3'")

    finish_boot(client, exit_code=0)

    verdict = run_row(sql, "r1")["verdict"]
    assert "fleet" in verdict
    stored = json.dumps(verdict["fleet"])
    assert '"s1"' in stored and '"s2"' in stored and '"s3"' not in stored


# ---------------------------------------------------------------- VERIFYING and what a finished run leaves


def test_a_verdict_is_reached_through_verifying_in_the_audit_trail(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1"), 201)

    finish_boot(client, exit_code=0)

    assert transitions(sql, "r1") == [
        (None, "RUNNING"),
        ("RUNNING", "VERIFYING"),
        ("VERIFYING", "SUCCEEDED"),
    ]


def test_a_failing_verdict_goes_from_verifying_to_failed(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1", [{"step": "boot", "exit_code": 0}]), 201)

    finish_boot(client, exit_code=1)

    assert transitions(sql, "r1") == [
        (None, "RUNNING"),
        ("RUNNING", "VERIFYING"),
        ("VERIFYING", "FAILED"),
    ]


def test_a_run_with_a_verdict_has_ended_at_and_no_leases(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1"), 201)
    assert leases(sql) == [("n1", "r1")]

    finish_boot(client, exit_code=0)

    run = run_row(sql, "r1")
    assert run["ended_at"] is not None and run["ended_at"] >= run["created_at"]
    assert leases(sql) == []
    assert advertise(client, "n1", cap("board"))["leases"] == []


def test_a_run_with_a_verdict_has_a_sealed_record(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("r1"), 201)
    assert client.get("/v1/runs/r1/record").status_code == 409

    finish_boot(client, exit_code=0)

    assert run_row(sql, "r1")["sealed_at"] is not None
    assert (ctx.records.path("r1") / "SHA256SUMS").is_file()
    assert json.loads((ctx.records.path("r1") / "verdict.json").read_text())["state"] == "SUCCEEDED"
    assert client.get("/v1/runs/r1/record").status_code == 200


def test_a_run_that_ends_by_its_verdict_is_announced_to_runs_url(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("hooked-1", [{"step": "boot", "exit_code": 0}]), 201)
    arrived = hook.arrival("hooked-1")

    finish_boot(client, "hooked-1", exit_code=0)

    assert arrived.wait(10)
    assert hook.bodies["hooked-1"] == [
        {
            "event": "run",
            "run_id": "hooked-1",
            "state": "SUCCEEDED",
            "verdict": run_row(sql, "hooked-1")["verdict"],
        }
    ]


def test_a_run_failed_by_a_step_is_announced_to_runs_url(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, boot_run("hooked-2"), 201)
    arrived = hook.arrival("hooked-2")
    claimed(client, "n1")

    report(client, "hooked-2", 1, "n1", exit_code=None, error="board on fire")

    assert arrived.wait(10)
    body = hook.bodies["hooked-2"][0]
    assert (body["event"], body["state"]) == ("run", "FAILED")
    assert body["verdict"] == run_row(sql, "hooked-2")["verdict"]
