"""Claiming steps (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node) and the long poll
in one process (wake point 1 of docs/design.md#wake-points as it reaches a waiting claim, a
rollback's notification, and the slow re-check and the listener's reconnect that catch a lost one).

Claims here use ``?wait=0`` unless the test is about long polling. Time passes only in the
database; a waiting claim is awaited with threads and Events, never with a sleep.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import WaitingClaim, advertise, claim, claimed, report
from tests.support.concurrency import apps_on, connect, race, waiting_lock_held
from tests.support.contracts import (
    build_then_test,
    chain_over_two_nodes,
    contract,
    role,
    two_free_steps,
    two_steps,
)
from tests.support.rows import leases_of, step_row
from tests.support.submitter import submit

# The slow re-check is a safety net for a lost notification; set far above every bound asserted
# below so that a waiting claim answered in time can only have been woken by a notification.
RECHECK = 30.0


pytestmark = pytest.mark.config({"claim.recheck_seconds": RECHECK})


# ---------------------------------------------------------------- helpers


# What a claim changes on its step row.
CLAIM_COLUMNS = "state, node_id, attempt, started_at, claimed_instance, envelope_key"


def step_states(sql: Any, run_id: str) -> list[tuple[int, str]]:
    return sql.execute(
        "select seq, state from steps where run_id = %s order by seq", (run_id,)
    ).fetchall()


def two_free_steps_on(run_id: str, slot: str) -> dict[str, Any]:
    """:func:`two_free_steps` on the board with that slot (one node per run in a race)."""
    doc = two_free_steps(run_id)
    doc["requires"] = [role("dut", slot=slot)]
    return doc


def two_nodes(client: Any) -> None:
    advertise(client, "node-a", cap("agent.reason"))
    advertise(client, "node-b", cap("board"))


# ---------------------------------------------------------------- the claim rule


def test_a_claim_hands_out_the_pending_step_and_marks_it_claimed_by_that_instance(client, sql):
    advertise(client, "n1", cap())
    submit(client, contract("run-1", role("dut")), 201)

    resp = claim(client, "n1", "i1")

    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert (body["step_id"], body["run_id"], body["seq"]) == ("run-1#01", "run-1", 1)
    row = step_row(sql, "run-1", 1)
    assert row["state"] == "CLAIMED" and row["claimed_instance"] == "i1"
    assert row["started_at"] is not None
    assert row["envelope_key"] and body["envelope_key"] == row["envelope_key"]


def test_each_claim_gets_a_fresh_envelope_key(client, sql):
    advertise(client, "n1", cap())
    submit(client, two_free_steps(), 201)

    first = claim(client, "n1").get_json()
    second = claim(client, "n1").get_json()

    keys = {first["envelope_key"], second["envelope_key"]}
    assert len(keys) == 2 and None not in keys
    assert {step_row(sql, "run-1", k)["envelope_key"] for k in (1, 2)} == keys


def test_a_node_with_nothing_claimable_gets_204_at_once_with_wait_0(client):
    advertise(client, "n1", cap())

    started = time.monotonic()
    resp = claim(client, "n1", "i1", wait=0)

    assert resp.status_code == 204 and resp.data == b""
    assert time.monotonic() - started < 2.0


def test_a_step_whose_need_is_not_done_is_not_claimed(client, sql):
    two_nodes(client)
    submit(client, chain_over_two_nodes(), 201)

    resp = claim(client, "node-b", "b1")

    assert resp.status_code == 204
    assert step_states(sql, "run-1") == [(1, "PENDING"), (2, "PENDING")]


def test_a_step_becomes_claimable_once_its_need_is_done(client):
    two_nodes(client)
    submit(client, chain_over_two_nodes(), 201)
    assert claim(client, "node-a", "a1").get_json()["seq"] == 1
    assert claim(client, "node-b", "b1").status_code == 204
    assert report(client, "run-1", 1, "node-a").status_code == 200

    resp = claim(client, "node-b", "b1")

    assert resp.status_code == 200 and resp.get_json()["step_id"] == "run-1#02"


def test_a_step_whose_needs_are_one_skipped_and_one_done_is_claimable(client, sql):
    # No probe node exists: the acquire step finds none, so "with-probe" is SKIPPED and
    # "without-probe" runs. "final" needs both: one SKIPPED, one DONE.
    advertise(client, "n1", cap())
    doc = contract(
        "run-1",
        role("dut"),
        steps=[
            {
                "id": "get-probe",
                "acquire": {
                    "want": {"as": "probe", "capability": "probe"},
                    "acquired": "with-probe",
                    "unavailable": "without-probe",
                },
                "needs": [],
            },
            {"id": "with-probe", "uses": "probe", "run": ["measure"]},
            {"id": "without-probe", "uses": "dut", "run": ["estimate"], "needs": ["get-probe"]},
            {
                "id": "final",
                "uses": "dut",
                "run": ["report"],
                "needs": ["with-probe", "without-probe"],
            },
        ],
    )
    submit(client, doc, 201)
    assert step_states(sql, "run-1") == [
        (1, "DONE"),
        (2, "SKIPPED"),
        (3, "PENDING"),
        (4, "PENDING"),
    ]
    assert claim(client, "n1", "i1").get_json()["name"] == "without-probe"
    assert report(client, "run-1", 3, "n1").get_json()["run_state"] == ""

    resp = claim(client, "n1", "i1")

    assert resp.status_code == 200 and resp.get_json()["name"] == "final"


def test_steps_of_a_run_are_handed_out_in_seq_order(client):
    advertise(client, "n1", cap())
    doc = contract(
        "run-1",
        role("dut"),
        steps=[{"id": f"s{k}", "uses": "dut", "run": ["true"], "needs": []} for k in range(1, 5)],
    )
    submit(client, doc, 201)

    seqs = [claim(client, "n1").get_json()["seq"] for _ in range(4)]

    assert seqs == [1, 2, 3, 4]
    assert claim(client, "n1").status_code == 204


def test_a_step_of_another_node_is_not_handed_out(client, sql):
    two_nodes(client)
    doc = contract(
        "run-1",
        role("host", "agent.reason"),
        role("dut"),
        steps=[{"id": "boot", "uses": "dut", "run": ["boot"]}],
    )
    submit(client, doc, 201)

    assert claim(client, "node-a", "a1").status_code == 204
    assert step_row(sql, "run-1", 1)["state"] == "PENDING"
    assert claim(client, "node-b", "b1").get_json()["step_id"] == "run-1#01"


def test_a_step_whose_run_no_longer_holds_a_lease_on_the_node_is_not_handed_out(client, sql):
    advertise(client, "n1", cap())
    submit(client, contract("run-1", role("dut")), 201)
    sql.execute("delete from leases where run_id = 'run-1'")

    resp = claim(client, "n1", "i1")

    assert resp.status_code == 204
    assert step_row(sql, "run-1", 1)["state"] == "PENDING"


def test_a_step_is_not_handed_out_when_its_node_is_leased_to_another_run(client, sql):
    # The step is bound to n1, but the lease on n1 belongs to a different run: a claim joins the
    # lease of the step's own run.
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    submit(client, contract("run-1", role("dut")), 201)
    submit(client, contract("run-2", role("dut")), 201)
    assert leases_of(sql, "run-1") == ["n1"] and leases_of(sql, "run-2") == ["n2"]
    sql.execute("update steps set node_id = 'n2' where run_id = 'run-1'")
    assert claim(client, "n2").get_json()["run_id"] == "run-2"

    resp = claim(client, "n2")

    assert resp.status_code == 204
    assert step_row(sql, "run-1", 1)["state"] == "PENDING"


def test_a_pending_ask_step_is_never_claimed(client, sql):
    advertise(client, "n1", cap())
    doc = contract(
        "run-1",
        role("dut"),
        steps=[
            {
                "id": "sign-off",
                "ask": {"prompt": "ok?"},
                "out": ["decision"],
                "schema": {
                    "decision": {"type": "object", "properties": {"ok": {"type": "boolean"}}}
                },
            },
            {"id": "boot", "uses": "dut", "run": ["boot"]},
        ],
    )
    submit(client, doc, 201)
    # Even bound to the node, pending and with its needs met, an ask step is for a person.
    sql.execute(
        "update steps set state = 'PENDING', node_id = 'n1', asked_at = null"
        " where run_id = 'run-1' and seq = 1"
    )

    resp = claim(client, "n1", "i1")

    assert resp.status_code == 204
    assert step_states(sql, "run-1") == [(1, "PENDING"), (2, "PENDING")]


def test_a_pending_acquire_step_is_never_claimed(client, sql):
    advertise(client, "n1", cap())
    doc = contract(
        "run-1",
        role("dut"),
        steps=[
            {
                "id": "get-probe",
                "acquire": {
                    "want": {"as": "probe", "capability": "probe"},
                    "acquired": "with-probe",
                    "unavailable": "without-probe",
                },
                "needs": [],
            },
            {"id": "with-probe", "uses": "probe", "run": ["measure"]},
            {"id": "without-probe", "uses": "dut", "run": ["estimate"], "needs": ["get-probe"]},
        ],
    )
    submit(client, doc, 201)
    # Put the acquire step back as if not yet done, bound to the node: still the Mediator's.
    sql.execute(
        "update steps set state = 'PENDING', node_id = 'n1' where run_id = 'run-1' and seq = 1"
    )
    sql.execute("update steps set state = 'PENDING' where run_id = 'run-1' and seq = 3")

    resp = claim(client, "n1", "i1")

    assert resp.status_code == 204
    assert step_row(sql, "run-1", 1)["state"] == "PENDING"


def test_the_steps_of_a_queued_run_are_never_claimed(client, sql):
    advertise(client, "n1", cap())
    submit(client, contract("run-a", role("dut")), 201)
    submit(client, contract("run-b", role("dut")), 202)
    # Hold the scan gate so the cancel frees n1 without promoting run-b: a QUEUED run next to a
    # free node, as between a release and its wake scan.
    with waiting_lock_held(sql):
        assert client.post("/v1/runs/run-a/cancel").status_code == 200

        resp = claim(client, "n1", "i1")

        assert resp.status_code == 204
        assert sql.execute("select state from runs where run_id = 'run-b'").fetchone() == (
            "QUEUED",
        )
        assert step_states(sql, "run-b") == [(1, "PENDING")]


def test_a_pending_step_of_a_run_that_is_no_longer_running_is_not_claimed(client, sql):
    # A run that ended while its step rows and lease were left behind (a crash before the
    # reaper's clean-up): the run's state decides, not the step's.
    advertise(client, "n1", cap())
    submit(client, contract("run-1", role("dut")), 201)
    sql.execute("update runs set state = 'FAILED', ended_at = now() where run_id = 'run-1'")
    assert leases_of(sql, "run-1") == ["n1"]

    resp = claim(client, "n1", "i1")

    assert resp.status_code == 204
    assert step_row(sql, "run-1", 1)["state"] == "PENDING"


# ---------------------------------------------------------------- one step at a time per instance


def test_an_instance_holding_a_claimed_step_gets_the_same_step_again_unchanged(client, sql):
    advertise(client, "n1", cap())
    submit(client, two_free_steps(), 201)
    first = claim(client, "n1", "i1")
    assert first.status_code == 200
    before = step_row(sql, "run-1", 1, CLAIM_COLUMNS)

    again = claim(client, "n1", "i1")

    assert again.status_code == 200
    assert again.get_json() == first.get_json()
    assert again.get_json()["envelope_key"] == before["envelope_key"]
    assert "attempt" not in again.get_json() and before["attempt"] == 0
    assert step_row(sql, "run-1", 1, CLAIM_COLUMNS) == before


def test_an_instance_holding_a_claimed_step_gets_nothing_else_though_another_is_claimable(
    client, sql
):
    advertise(client, "n1", cap())
    submit(client, two_free_steps(), 201)
    assert claim(client, "n1", "i1").get_json()["seq"] == 1

    for _ in range(2):
        assert claim(client, "n1", "i1").get_json()["seq"] == 1

    assert step_states(sql, "run-1") == [(1, "CLAIMED"), (2, "PENDING")]


def test_an_instance_gets_the_next_step_once_its_held_step_is_reported(client):
    advertise(client, "n1", cap())
    submit(client, two_free_steps(), 201)
    assert claim(client, "n1", "i1").get_json()["seq"] == 1
    assert report(client, "run-1", 1, "n1").status_code == 200

    resp = claim(client, "n1", "i1")

    assert resp.status_code == 200 and resp.get_json()["seq"] == 2


def test_a_claim_without_the_instance_header_gets_no_redelivery_but_the_next_step(client, sql):
    advertise(client, "n1", cap())
    submit(client, two_free_steps(), 201)
    held = claim(client, "n1", "i1").get_json()

    resp = claim(client, "n1", None)

    assert resp.status_code == 200
    assert resp.get_json()["seq"] == 2 and resp.get_json()["envelope_key"] != held["envelope_key"]
    assert step_row(sql, "run-1", 1)["envelope_key"] == held["envelope_key"]
    assert step_row(sql, "run-1", 2)["claimed_instance"] is None


def test_a_claim_without_the_instance_header_gets_204_when_only_a_held_step_exists(client, sql):
    advertise(client, "n1", cap())
    submit(client, contract("run-1", role("dut")), 201)
    held = claim(client, "n1", None).get_json()
    assert held["seq"] == 1

    resp = claim(client, "n1", None)

    assert resp.status_code == 204
    row = step_row(sql, "run-1", 1)
    assert row["state"] == "CLAIMED" and row["envelope_key"] == held["envelope_key"]


# ---------------------------------------------------------------- the claim body


def test_the_claim_body_carries_the_step_the_requester_and_the_lease(client, sql):
    advertise(client, "n1", cap("board", soc="imx8mp"))
    doc = contract(
        "kernel-7",
        role("dut", soc="imx8mp"),
        steps=[
            {
                "id": "boot",
                "uses": "dut",
                "run": ["boot-test", "--fast"],
                "env": ["CI", "BUILD_ID"],
                "collect": {"result.json": "out/result.json"},
                "workspace": {"repo": "https://git.example.com/k.git", "rev": "abc123"},
                "in": {"prompt": "boot it"},
                "out": ["result.json"],
                "schema": {"result.json": {"type": "object", "required": ["ok"]}},
            }
        ],
    )
    resp = client.post("/v1/runs", json=doc, headers={"X-Enode-Principal": "alice@example.com"})
    assert resp.status_code == 201, resp.get_json()

    body = claim(client, "n1", "i1").get_json()

    lease = sql.execute(
        "select run_id, node_id, capability, not_after, nonce from leases where node_id = 'n1'"
    ).fetchone()
    assert {k: v for k, v in body.items() if k not in ("lease", "envelope_key")} == {
        "step_id": "kernel-7#01",
        "run_id": "kernel-7",
        "seq": 1,
        "name": "boot",
        "uses": "dut",
        "kind": "run",
        "run": ["boot-test", "--fast"],
        "env": ["CI", "BUILD_ID"],
        "collect": {"result.json": "out/result.json"},
        "workspace": {"repo": "https://git.example.com/k.git", "rev": "abc123"},
        "in": {"prompt": "boot it"},
        "out": ["result.json"],
        "schema": {"result.json": {"type": "object", "required": ["ok"]}},
        "requester": "alice@example.com",
    }
    got = body["lease"]
    assert (got["run_id"], got["node"], got["capability"], got["nonce"]) == (
        lease[0],
        lease[1],
        lease[2],
        lease[4],
    )
    assert got["capability"] == "board" and len(got["nonce"]) == 32
    assert got["not_after"].endswith("Z")
    assert datetime.fromisoformat(got["not_after"].replace("Z", "+00:00")) == lease[3]


def test_the_step_id_numbers_the_seq_with_two_digits(client):
    advertise(client, "n1", cap())
    doc = contract(
        "run-1",
        role("dut"),
        steps=[{"id": f"s{k}", "uses": "dut", "run": ["true"]} for k in range(1, 13)],
    )
    submit(client, doc, 201)
    assert claim(client, "n1", "i1").get_json()["step_id"] == "run-1#01"
    for seq in range(1, 12):
        assert report(client, "run-1", seq, "n1").status_code == 200
        body = claim(client, "n1", "i1").get_json()
        assert body["seq"] == seq + 1

    assert body["step_id"] == "run-1#12"


def test_the_claim_body_of_an_agent_step_carries_agent_and_no_run(client):
    advertise(client, "n1", cap("agent.reason"))
    agent = {"model": "m-1", "max_turns": 5}
    doc = contract(
        "run-1",
        role("host", "agent.reason"),
        steps=[{"id": "think", "uses": "host", "agent": agent, "in": {"prompt": "fix it"}}],
    )
    submit(client, doc, 201)

    body = claim(client, "n1", "i1").get_json()

    assert body["kind"] == "agent" and body["agent"] == agent and "run" not in body
    assert body["in"] == {"prompt": "fix it"}


def test_a_redelivered_claim_carries_the_current_lease(client, sql):
    advertise(client, "n1", cap())
    submit(client, contract("run-1", role("dut")), 201)
    first = claim(client, "n1", "i1").get_json()
    # A heartbeat renews the lease in between: the redelivery shows the lease as it is now.
    advertise(client, "n1", cap(), instance="i1")
    not_after = sql.execute("select not_after from leases where node_id = 'n1'").fetchone()[0]

    again = claim(client, "n1", "i1").get_json()

    assert again["envelope_key"] == first["envelope_key"]
    assert again["lease"]["nonce"] == first["lease"]["nonce"]
    assert datetime.fromisoformat(again["lease"]["not_after"].replace("Z", "+00:00")) == not_after


# ---------------------------------------------------------------- FOR UPDATE SKIP LOCKED

ROUNDS = 5


def test_two_claims_racing_for_two_claimable_steps_get_two_different_steps(fresh_db_url, tmp_path):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        for i in range(ROUNDS):
            node = f"n{i:02d}"
            advertise(admin, node, cap("board", slot=node))
            submit(admin, two_free_steps_on(f"run-{i}", node), 201)
        for i in range(ROUNDS):
            node, clients = f"n{i:02d}", (apps.client(0), apps.client(1))

            resps = race(*((lambda c=c, n=node: claim(c, n)) for c in clients))

            assert [r.status_code for r in resps] == [200, 200], [r.get_json() for r in resps]
            assert sorted(r.get_json()["seq"] for r in resps) == [1, 2]
            assert len({r.get_json()["envelope_key"] for r in resps}) == 2
            assert step_states(sql, f"run-{i}") == [(1, "CLAIMED"), (2, "CLAIMED")]


def test_two_claims_racing_for_one_claimable_step_give_it_to_exactly_one(fresh_db_url, tmp_path):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        for i in range(ROUNDS):
            node = f"n{i:02d}"
            advertise(admin, node, cap("board", slot=node))
            submit(admin, contract(f"run-{i}", role("dut", slot=node)), 201)
        for i in range(ROUNDS):
            node, clients = f"n{i:02d}", (apps.client(0), apps.client(1))

            resps = race(*((lambda c=c, n=node: claim(c, n)) for c in clients))

            assert sorted(r.status_code for r in resps) == [200, 204]
            winner = next(r for r in resps if r.status_code == 200).get_json()
            assert winner["step_id"] == f"run-{i}#01"
            assert step_states(sql, f"run-{i}") == [(1, "CLAIMED")]
            assert sql.execute(
                "select envelope_key from steps where run_id = %s", (f"run-{i}",)
            ).fetchone() == (winner["envelope_key"],)


# ---------------------------------------------------------------- a claim racing a cancel


def test_a_claim_racing_a_cancel_leaves_nothing_claimable_and_no_lease(fresh_db_url, tmp_path):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        for i in range(ROUNDS):
            node = f"n{i:02d}"
            advertise(admin, node, cap("board", slot=node))
            submit(admin, two_free_steps_on(f"run-{i}", node), 201)
        for i in range(ROUNDS):
            node, run_id = f"n{i:02d}", f"run-{i}"
            claimer, canceller = apps.client(0), apps.client(1)

            got, cancelled = race(
                lambda c=claimer, n=node: claim(c, n, "i1"),
                lambda c=canceller, r=run_id: c.post(f"/v1/runs/{r}/cancel"),
            )

            assert got.status_code in (200, 204)
            assert cancelled.status_code == 200 and cancelled.get_json() == {
                "run_id": run_id,
                "state": "FAILED",
            }
            assert claim(claimer, node, "i1").status_code == 204
            assert claim(claimer, node).status_code == 204
            assert leases_of(sql, run_id) == []
            assert step_states(sql, run_id) == [(1, "FAILED"), (2, "FAILED")]


def test_a_claim_after_a_cancel_gets_204_and_the_run_has_no_lease(client, sql):
    advertise(client, "n1", cap())
    submit(client, two_free_steps(), 201)
    assert claim(client, "n1", "i1").get_json()["seq"] == 1

    assert client.post("/v1/runs/run-1/cancel").status_code == 200

    assert claim(client, "n1", "i1").status_code == 204
    assert claim(client, "n1").status_code == 204
    assert leases_of(sql, "run-1") == []


# ---------------------------------------------------------------- long poll in one process


def test_a_waiting_claim_is_answered_soon_after_a_result_makes_its_step_claimable(app, client, ctx):
    two_nodes(client)
    submit(client, chain_over_two_nodes(), 201)
    waiting = WaitingClaim(app, "node-b", "b1", wait=10).start(ctx)
    assert not waiting.done.is_set()
    assert claim(client, "node-a", "a1").get_json()["seq"] == 1

    assert report(client, "run-1", 1, "node-a").status_code == 200
    reported = time.monotonic()

    resp = waiting.result()
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "run-1#02"
    assert waiting.answered - reported < 2.0


def test_a_waiting_claim_is_answered_when_a_run_is_placed_on_its_node(app, client, ctx):
    advertise(client, "n1", cap())
    waiting = WaitingClaim(app, "n1", "i1", wait=10).start(ctx)

    submit(client, contract("run-1", role("dut")), 201)
    submitted = time.monotonic()

    resp = waiting.result()
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "run-1#01"
    assert waiting.answered - submitted < 2.0


def test_a_waiting_claim_is_answered_when_a_result_promotes_a_queued_run_onto_its_node(
    app, client, ctx, sql
):
    # Wake point 1 (docs/design.md#wake-points): the result frees n1, the wake promotes run-b, and
    # the claim that was waiting on n1 gets run-b's step.
    advertise(client, "n1", cap())
    submit(client, contract("run-a", role("dut")), 201)
    submit(client, contract("run-b", role("dut")), 202)
    assert claim(client, "n1", "i1").get_json()["run_id"] == "run-a"
    waiting = WaitingClaim(app, "n1", None, wait=10).start(ctx)

    assert report(client, "run-a", 1, "n1").get_json()["run_state"] == "SUCCEEDED"
    reported = time.monotonic()

    resp = waiting.result()
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "run-b#01"
    assert waiting.answered - reported < 2.0
    assert sql.execute("select state from runs where run_id = 'run-b'").fetchone() == ("RUNNING",)


def test_a_waiting_claim_answers_204_after_the_wait_when_nothing_comes(app, client, ctx):
    advertise(client, "n1", cap())

    waiting = WaitingClaim(app, "n1", "i1", wait=1).start(ctx)

    resp = waiting.result()
    assert resp.status_code == 204
    assert 0.9 <= waiting.answered - waiting.started < 1.0 + 3.0


@pytest.mark.parametrize(
    "config_overrides", [{"claim.long_poll_seconds": 1.0, "claim.recheck_seconds": RECHECK}]
)
def test_a_claim_without_wait_long_polls_for_the_configured_window_then_answers_204(
    app, client, ctx
):
    advertise(client, "n1", cap())

    waiting = WaitingClaim(app, "n1", "i1", wait=None).start(ctx)

    resp = waiting.result()
    assert resp.status_code == 204
    assert 0.9 <= waiting.answered - waiting.started < 1.0 + 3.0


@pytest.mark.parametrize(
    "config_overrides",
    [{"claim.long_poll_jitter": 0.5, "claim.recheck_seconds": RECHECK}],
)
def test_claims_that_wait_together_end_spread_over_the_last_jitter_of_their_window(
    app, client, ctx
):
    nodes = [f"n{i}" for i in range(8)]
    for node in nodes:
        advertise(client, node, cap())

    waiting = [WaitingClaim(app, node, wait=2).start(ctx) for node in nodes]

    held = [w.answered - w.started for w in waiting if w.result().status_code == 204]
    assert len(held) == len(nodes)
    assert all(1.0 - 0.1 <= h < 2.0 + 3.0 for h in held), held
    # Eight draws in a one-second spread: all within 50 ms of each other has odds of 1e-9.
    assert max(held) - min(held) > 0.05, held


def test_a_waiting_claim_is_not_answered_by_work_for_another_node(app, client, ctx):
    two_nodes(client)
    waiting = WaitingClaim(app, "node-b", "b1", wait=1).start(ctx)

    submit(
        client,
        contract(
            "run-1",
            role("host", "agent.reason"),
            steps=[{"id": "build", "uses": "host", "run": ["build"]}],
        ),
        201,
    )

    assert waiting.result().status_code == 204
    assert claim(client, "node-a", "a1").get_json()["step_id"] == "run-1#01"


def test_a_waiting_claim_is_answered_soon_after_a_rollback_resets_a_step_of_its_node(
    app, client, ctx
):
    advertise(client, "n1", cap())
    submit(client, build_then_test("r1"), 201)
    assert claimed(client, "n1")["name"] == "build"
    assert report(client, "r1", 1, "n1").status_code == 200
    assert claimed(client, "n1")["name"] == "test"
    waiting = WaitingClaim(app, "n1", wait=10).start(ctx)
    assert not waiting.done.is_set()

    resp = report(client, "r1", 2, "n1", exit_code=1)
    reported = time.monotonic()

    assert resp.get_json() == {"run_id": "r1", "seq": 2, "rolled_back": True}
    got = waiting.result(20.0)
    assert got.status_code == 200
    assert (got.get_json()["step_id"], got.get_json()["attempt"]) == ("r1#01", 1)
    assert waiting.answered - reported < 3.0


# ---------------------------------------------------------------- a lost notification


@pytest.mark.parametrize("config_overrides", [{"claim.recheck_seconds": 0.3}])
def test_a_step_made_claimable_without_a_notification_is_found_by_the_slow_recheck(
    app, client, ctx, sql
):
    advertise(client, "n1", cap())
    submit(client, two_steps("r1"), 201)
    assert claimed(client, "n1")["seq"] == 1
    waiting = WaitingClaim(app, "n1", wait=10).start(ctx)
    assert not waiting.done.is_set()

    # A lost notification: the step becomes claimable and nobody says so.
    sql.execute("update steps set state = 'DONE', ended_at = now() where run_id = 'r1' and seq = 1")
    changed = time.monotonic()

    resp = waiting.result(20.0)
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "r1#02"
    assert waiting.answered - changed < 5.0


def test_a_listener_that_reconnects_rechecks_the_waiting_claims_at_once(app, client, ctx, sql):
    advertise(client, "n1", cap())
    submit(client, two_steps("r1"), 201)
    assert claimed(client, "n1")["seq"] == 1
    waiting = WaitingClaim(app, "n1", wait=15).start(ctx)
    assert not waiting.done.is_set()
    # Claimable now, without a notification (as if sent while the listener was away).
    sql.execute("update steps set state = 'DONE', ended_at = now() where run_id = 'r1' and seq = 1")

    terminated = sql.execute(
        "select pg_terminate_backend(pid) from pg_stat_activity"
        " where application_name = 'mediator-listener' and datname = current_database()"
    ).fetchall()
    cut = time.monotonic()

    assert terminated == [(True,)]
    resp = waiting.result(20.0)
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "r1#02"
    assert waiting.answered - cut < 8.0
