"""Cancel (docs/queue.md#leaving-the-queue): a RUNNING or QUEUED run becomes FAILED with the verdict
note naming who cancelled, its open steps fail, its leases go (nodes learn it from their next
heartbeat), the queue is woken (and the wake scan logged, docs/metrics.md#logs), the Record sealed
after commit and the run's end posted to ``notify.runs_url`` (docs/configuration.md#webhooks);
cancel is idempotent."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from tests.support.actors import Submitter, cap
from tests.support.agent import advertise, claim, claimed, report
from tests.support.apps import app_on, client_of
from tests.support.contracts import contract, role
from tests.support.rows import leases, run_row
from tests.support.submitter import submit
from tests.support.webhooks import RunsHook

ALICE = {"X-Enode-Principal": "alice@example.com"}

FOUR_STEPS = [
    {"id": "flash", "uses": "dut", "run": ["flash"]},
    {"id": "boot", "uses": "dut", "run": ["boot"]},
    {"id": "check", "uses": "dut", "run": ["check"]},
    {
        "id": "approve",
        "ask": {"prompt": "Go?"},
        "out": ["decision"],
        "schema": {
            "decision": {"type": "object", "properties": {"verdict": {"enum": ["go", "stop"]}}}
        },
        "needs": [],
    },
]


def step_states(sql: Any, run_id: str) -> list[tuple[str, str]]:
    return [
        tuple(r)
        for r in sql.execute(
            "select step_id, state from steps where run_id = %s order by seq", (run_id,)
        )
    ]


def events(sql: Any, run_id: str) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in sql.execute(
            "select from_state, to_state, cause, by from run_events where run_id = %s order by id",
            (run_id,),
        )
    ]


def cancel(client: Any, run_id: str, headers: dict[str, str] | None = None) -> Any:
    return Submitter(client).cancel(run_id, headers or ALICE)


def running_with_every_step_state(client: Any, sql: Any) -> None:
    """r1 on n1: flash DONE, boot CLAIMED, check PENDING, approve ASKED."""
    advertise(client, "n1", cap("board"), instance="i1")
    submit(client, contract("r1", role("dut"), steps=FOUR_STEPS), 201)
    assert claimed(client, "n1", "i1")["name"] == "flash"
    assert report(client, "r1", 1, "n1").get_json() == {"run_id": "r1", "seq": 1, "run_state": ""}
    assert claimed(client, "n1", "i1")["name"] == "boot"
    assert step_states(sql, "r1") == [
        ("flash", "DONE"),
        ("boot", "CLAIMED"),
        ("check", "PENDING"),
        ("approve", "ASKED"),
    ]


def queued_behind_holder(client: Any) -> None:
    advertise(client, "n1", cap("board"))
    submit(client, contract("holder"), 201)
    submit(client, contract("waiter", role("dut"), steps=FOUR_STEPS), 202)


# ---------------------------------------------------------------- a RUNNING run


def test_cancel_of_a_running_run_is_200_failed_with_a_verdict_naming_the_principal(client, sql):
    running_with_every_step_state(client, sql)

    resp = cancel(client, "r1")

    assert resp.status_code == 200 and resp.get_json() == {"run_id": "r1", "state": "FAILED"}
    row = run_row(sql, "r1")
    assert row["state"] == "FAILED" and row["ended_at"] is not None
    verdict = {
        "state": "FAILED",
        "checks": [{"what": "cancelled", "ok": False, "note": "cancelled by: alice@example.com"}],
    }
    assert row["verdict"] == verdict
    view = client.get("/v1/runs/r1").get_json()
    assert view["state"] == "FAILED" and view["verdict"] == verdict and "ended_at" in view


def test_cancel_fails_pending_claimed_and_asked_steps_and_leaves_done_steps_alone(client, sql):
    running_with_every_step_state(client, sql)

    cancel(client, "r1")

    assert step_states(sql, "r1") == [
        ("flash", "DONE"),
        ("boot", "FAILED"),
        ("check", "FAILED"),
        ("approve", "FAILED"),
    ]
    assert [a for a in client.get("/v1/asks").get_json()["asks"] if a["run_id"] == "r1"] == []


def test_cancel_deletes_the_leases_and_the_node_learns_it_from_its_next_heartbeat(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("host"))
    submit(client, contract("r1", role("dut"), role("host", "host")), 201)
    beat = advertise(client, "n1", cap("board"))
    assert [lease["run_id"] for lease in beat["leases"]] == ["r1"]

    cancel(client, "r1")

    assert leases(sql) == []
    assert advertise(client, "n1", cap("board"))["leases"] == []
    assert advertise(client, "n2", cap("host"))["leases"] == []


def test_a_claim_after_cancel_hands_out_nothing_and_the_claimed_step_cannot_report(client, sql):
    running_with_every_step_state(client, sql)

    cancel(client, "r1")

    assert claim(client, "n1", "i1").status_code == 204
    late = report(client, "r1", 2, "n1")
    assert late.status_code == 409
    assert late.get_json() == {
        "error": {"code": 409, "reason": "reported a step that was not claimed (r1#02)"}
    }


def test_cancel_seals_the_record_of_a_running_run(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)
    assert client.get("/v1/runs/r1/record").status_code == 409

    cancel(client, "r1")

    assert run_row(sql, "r1")["sealed_at"] is not None and ctx.records.is_sealed("r1")
    resp = client.get("/v1/runs/r1/record")
    assert resp.status_code == 200 and resp.mimetype == "application/x-tar"


def test_cancel_records_the_change_in_the_audit_trail_with_the_principal(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)

    cancel(client, "r1")

    assert events(sql, "r1")[-1] == (
        "RUNNING",
        "FAILED",
        "cancelled by alice@example.com",
        "alice@example.com",
    )


# ---------------------------------------------------------------- a QUEUED run


def test_cancel_of_a_queued_run_fails_it_and_its_steps_and_leaves_other_leases_alone(client, sql):
    queued_behind_holder(client)

    resp = cancel(client, "waiter")

    assert resp.status_code == 200 and resp.get_json() == {"run_id": "waiter", "state": "FAILED"}
    row = run_row(sql, "waiter")
    assert row["state"] == "FAILED" and row["ended_at"] is not None
    assert row["verdict"]["checks"] == [
        {"what": "cancelled", "ok": False, "note": "cancelled by: alice@example.com"}
    ]
    assert {s for _, s in step_states(sql, "waiter")} == {"FAILED"}
    assert leases(sql) == [("n1", "holder")]
    assert run_row(sql, "holder")["state"] == "RUNNING"
    assert events(sql, "waiter")[-1][:2] == ("QUEUED", "FAILED")


def test_cancel_seals_the_record_of_a_queued_run(client, ctx, sql):
    queued_behind_holder(client)

    cancel(client, "waiter")

    assert run_row(sql, "waiter")["sealed_at"] is not None and ctx.records.is_sealed("waiter")
    assert client.get("/v1/runs/waiter/record").status_code == 200


def test_a_cancelled_queued_run_is_never_promoted(client, sql):
    queued_behind_holder(client)
    cancel(client, "waiter")

    cancel(client, "holder")

    assert run_row(sql, "waiter")["state"] == "FAILED"
    assert leases(sql) == []


# ---------------------------------------------------------------- idempotence and finished runs


def test_cancel_twice_gives_the_same_answer_and_changes_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)
    first = cancel(client, "r1")
    before = (run_row(sql, "r1"), step_states(sql, "r1"), events(sql, "r1"))

    second = cancel(client, "r1", {"X-Enode-Principal": "bob@example.com"})

    assert second.status_code == 200 and second.get_json() == first.get_json()
    assert (run_row(sql, "r1"), step_states(sql, "r1"), events(sql, "r1")) == before


def test_cancel_of_a_succeeded_run_is_200_with_its_state_unchanged(client, sql):
    advertise(client, "n1", cap("board"), instance="i1")
    submit(client, contract("r1"), 201)
    assert claim(client, "n1", "i1").status_code == 200
    assert report(client, "r1", 1, "n1").get_json()["run_state"] == "SUCCEEDED"
    before = (run_row(sql, "r1"), step_states(sql, "r1"), events(sql, "r1"))

    resp = cancel(client, "r1")

    assert resp.status_code == 200 and resp.get_json() == {"run_id": "r1", "state": "SUCCEEDED"}
    assert (run_row(sql, "r1"), step_states(sql, "r1"), events(sql, "r1")) == before


def test_cancel_of_a_run_rejected_at_submit_is_200_failed_and_keeps_its_reject(client, sql):
    assert client.post("/v1/runs", json=contract("r1")).status_code == 422
    before = run_row(sql, "r1")

    resp = cancel(client, "r1")

    assert resp.status_code == 200 and resp.get_json() == {"run_id": "r1", "state": "FAILED"}
    after = run_row(sql, "r1")
    assert after == before and after["verdict"] is None
    assert after["reject"] == {"Code": 422, "As": "dut", "Reason": "need 1, fleet has 0 - board"}


def test_cancel_of_an_unknown_run_is_404_in_the_json_error_shape(client, sql):
    resp = cancel(client, "no-such-run")

    assert resp.status_code == 404 and resp.is_json
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["code"] == 404
    assert isinstance(body["error"]["reason"], str) and body["error"]["reason"]
    assert sql.execute("select count(*) from runs").fetchone() == (0,)


# ---------------------------------------------------------------- the wake after cancel


def test_cancel_promotes_a_queued_run_within_the_same_request(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("holder"), 201)
    submit(client, contract("waiter"), 202)

    resp = cancel(client, "holder")

    assert resp.get_json() == {"run_id": "holder", "state": "FAILED"}
    # Read the rows straight after the answer, with no other request in between.
    assert run_row(sql, "waiter")["state"] == "RUNNING"
    assert leases(sql) == [("n1", "waiter")]
    view = client.get("/v1/runs/waiter").get_json()
    assert view["state"] == "RUNNING"
    assert view["assigned"] == [{"as": "dut", "nodes": [{"node": "n1", "label": None}]}]


@pytest.mark.parametrize("config_overrides", [{"log.level": "info"}])
def test_the_wake_scan_of_a_cancel_logs_its_cause_queued_promoted_and_duration(client):
    advertise(client, "n1", cap())
    submit(client, contract("r1", role("dut")), 201)
    submit(client, contract("r2", role("dut")), 202)

    with structlog.testing.capture_logs() as logs:
        assert client.post("/v1/runs/r1/cancel").status_code == 200

    scans = [e for e in logs if e["event"] == "wake scan"]
    assert len(scans) == 1, logs
    scan = scans[0]
    assert "r1/n1" in scan["cause"]
    assert scan["queued"] == 1
    assert scan["promoted"] == 1
    assert isinstance(scan["ms"], (int, float)) and scan["ms"] >= 0


# ------------------------------------------------ the runs webhook (docs/configuration.md#webhooks)


def test_a_cancel_posts_the_run_end_to_notify_runs_url(db_url, tmp_path):
    hook = RunsHook()
    try:
        with app_on(db_url, tmp_path / "records", **{"notify.runs_url": hook.url}) as app:
            client = client_of(app)
            advertise(client, "n1", cap())
            submit(client, contract("r1", role("dut")), 201)

            resp = client.post(
                "/v1/runs/r1/cancel", headers={"X-Enode-Principal": "alice@example.com"}
            )

            assert resp.status_code == 200
            assert hook.arrival("r1").wait(10), "no run webhook arrived"
            assert hook.bodies == {
                "r1": [
                    {
                        "event": "run",
                        "run_id": "r1",
                        "state": "FAILED",
                        "verdict": {
                            "state": "FAILED",
                            "checks": [
                                {
                                    "what": "cancelled",
                                    "ok": False,
                                    "note": "cancelled by: alice@example.com",
                                }
                            ],
                        },
                    }
                ]
            }
    finally:
        hook.close()
