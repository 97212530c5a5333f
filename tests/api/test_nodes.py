"""Node adverts (docs/queue.md#heartbeats-what-a-node-learns) and the fleet views (GET /v1/nodes,
GET /v1/capabilities: docs/api.md#readers).

Time passes only in the database: ``expires_at`` and ``not_after`` are moved with SQL, and every
time is checked against the database clock (``now()``), never the test's own."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest

from app.wire import parse_ts
from tests.support.actors import cap
from tests.support.agent import advertise, claim
from tests.support.contracts import contract, role, two_steps
from tests.support.rows import leases, one, scalar
from tests.support.submitter import state_of, submit

RENEW = 20
FACTOR = 4
WINDOW = RENEW * FACTOR  # renew_seconds × not_after_factor, far from lease.ttl_seconds (3600)
SLACK = 5.0  # seconds of tolerance against the database clock (a slow shared machine)
RESTARTED = "node restarted; in-flight step cannot be trusted"


pytestmark = pytest.mark.config({"lease.renew_seconds": RENEW, "lease.not_after_factor": FACTOR})


# ---------------------------------------------------------------- rows, as an operator reads them


def node_row(sql: Any, node_id: str) -> dict[str, Any]:
    return one(sql, "select * from nodes where node_id = %s", node_id)


def seconds_ahead(sql: Any, column: str, table: str, key: str, value: str) -> float:
    """How far ``column`` lies ahead of the database's ``now()``, in seconds."""
    return float(
        scalar(
            sql, f"select extract(epoch from {column} - now()) from {table} where {key} = %s", value
        )
    )


def lease_not_after(sql: Any, node_id: str) -> datetime:
    return scalar(sql, "select not_after from leases where node_id = %s", node_id)


def post_advert(client: Any, body: Any, **headers: str) -> Any:
    return client.post("/v1/nodes", json=body, headers=headers)


# ---------------------------------------------------------------- the reply


def test_an_advert_replies_with_the_nodes_leases_renew_seconds_and_stored_drain(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)

    reply = advertise(client, "n1", cap("board"))

    lease = one(sql, "select * from leases where node_id = 'n1'")
    assert set(reply) == {"leases", "renew_seconds", "drain"}
    assert reply["renew_seconds"] == RENEW and reply["drain"] == ""
    assert len(reply["leases"]) == 1
    got = reply["leases"][0]
    assert set(got) == {"run_id", "node", "capability", "not_after", "nonce"}
    assert (got["run_id"], got["node"], got["capability"]) == ("r1", "n1", "board")
    assert got["nonce"] == lease["nonce"] and re.fullmatch("[0-9a-f]{32}", got["nonce"])
    assert got["not_after"].endswith("Z") and parse_ts(got["not_after"]) == lease["not_after"]


def test_a_node_without_a_lease_gets_an_empty_lease_list(client):
    reply = advertise(client, "n1", cap("board"))

    assert reply == {"leases": [], "renew_seconds": RENEW, "drain": ""}


def test_a_lease_names_the_capability_of_the_first_role_the_node_fills(client, sql):
    both = (cap("board"), cap("agent.reason"))
    advertise(client, "n1", *both)
    submit(client, contract("r1", role("dut", "board"), role("host", "agent.reason")), 201)
    first = advertise(client, "n1", *both)["leases"]
    assert client.post("/v1/runs/r1/cancel").status_code == 200

    submit(client, contract("r2", role("host", "agent.reason"), role("dut", "board")), 201)
    second = advertise(client, "n1", *both)["leases"]

    assert [(x["run_id"], x["capability"]) for x in first] == [("r1", "board")]
    assert [(x["run_id"], x["capability"]) for x in second] == [("r2", "agent.reason")]


def test_the_lease_of_a_cancelled_run_is_missing_from_the_next_reply(client):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)
    assert [x["run_id"] for x in advertise(client, "n1", cap("board"))["leases"]] == ["r1"]

    assert client.post("/v1/runs/r1/cancel").status_code == 200

    assert advertise(client, "n1", cap("board"))["leases"] == []


# ---------------------------------------------------------------- the upsert


def test_a_second_advert_replaces_the_first_completely(client, sql):
    advertise(client, "n1", cap("board", soc="imx8mp"), cap("fpga"), label="Bench 1", instance="i1")

    advertise(client, "n1", cap("board", soc="rk3588"), instance="i2")

    row = node_row(sql, "n1")
    assert row["label"] is None and row["instance"] == "i2"
    assert row["capabilities"] == [{"capability": "board", "attrs": {"soc": "rk3588"}}]
    # The matcher sees only the new advert: the old capability is gone from the fleet.
    resp = submit(client, contract("r1", role("dut", "fpga")), 422)
    assert resp.get_json()["error"]["code"] == 422
    assert scalar(sql, "select count(*) from nodes") == 1


def test_an_advert_stores_the_principal_and_times_of_the_database_clock(client, sql):
    advertise(client, "n1", cap("board"))
    sql.execute("update nodes set seen_at = now() - interval '1 hour', expires_at = now()")

    resp = post_advert(
        client,
        {"node_id": "n1", "capabilities": [cap("board")]},
        **{"X-Enode-Principal": "lab@example.com"},
    )

    assert resp.status_code == 200
    assert node_row(sql, "n1")["principal"] == "lab@example.com"
    assert abs(seconds_ahead(sql, "seen_at", "nodes", "node_id", "n1")) < SLACK
    assert abs(seconds_ahead(sql, "expires_at", "nodes", "node_id", "n1") - WINDOW) < SLACK


def test_a_node_whose_advert_expired_is_no_candidate(client, sql):
    advertise(client, "n1", cap("board"))
    sql.execute("update nodes set expires_at = now() - interval '1 second'")

    resp = submit(client, contract("r1"), 422)

    assert resp.get_json()["error"]["code"] == 422
    assert state_of(client, "r1") == "FAILED" and leases(sql) == []


def test_an_advert_without_node_id_is_400_node_id_is_missing(client, sql):
    resp = post_advert(client, {"capabilities": [cap("board")]})

    assert resp.status_code == 400
    assert resp.get_json() == {"error": {"code": 400, "reason": "node_id is missing"}}
    assert scalar(sql, "select count(*) from nodes") == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"node_id": "n1", "capabilities": "board"}, "capabilities"),
        ({"node_id": "n1", "capabilities": [{"attrs": {}}]}, "capability"),
        ({"node_id": "n1", "capabilities": [{"capability": "board", "attrs": ["soc"]}]}, "attrs"),
        (
            {"node_id": "n1", "capabilities": [{"capability": "board", "attrs": {"soc": 8}}]},
            "attrs",
        ),
        ({"node_id": 5, "capabilities": []}, "node_id"),
        ({"node_id": "n1", "label": 5, "capabilities": []}, "label"),
    ],
    ids=[
        "capabilities-a-string",
        "capability-missing",
        "attrs-a-list",
        "attrs-value-a-number",
        "node_id-a-number",
        "label-a-number",
    ],
)
def test_a_bad_advert_body_is_400_naming_the_field_and_stores_nothing(client, sql, body, field):
    resp = post_advert(client, body)

    assert resp.status_code == 400, resp.get_json()
    err = resp.get_json()["error"]
    assert err["code"] == 400 and field in err["reason"], err
    assert scalar(sql, "select count(*) from nodes") == 0


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]"], ids=["not-json", "a-list"])
def test_an_advert_body_that_is_not_a_json_object_is_400(client, sql, raw):
    resp = client.post("/v1/nodes", data=raw, content_type="application/json")

    assert resp.status_code == 400
    assert resp.get_json()["error"]["code"] == 400
    assert scalar(sql, "select count(*) from nodes") == 0


# ---------------------------------------------------------------- drain values


@pytest.mark.parametrize("drain", ["soon", 3, None])
def test_an_unknown_drain_value_is_folded_to_empty_and_the_node_stays_in_the_fleet(
    client, sql, drain
):
    resp = post_advert(
        client, {"node_id": "n1", "capabilities": [cap("board")], "policy": {"drain": drain}}
    )

    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json()["drain"] == ""
    assert node_row(sql, "n1")["drain"] == ""
    # Not draining: the node takes new work.
    submit(client, contract("r1"), 201)


@pytest.mark.parametrize("drain", ["graceful", "at-boundary"])
def test_a_drain_value_is_stored_and_echoed(client, sql, drain):
    reply = advertise(client, "n1", cap("board"), policy={"drain": drain})

    assert reply["drain"] == drain
    assert node_row(sql, "n1")["drain"] == drain


def test_an_advert_without_policy_lifts_a_previous_drain(client, sql):
    advertise(client, "n1", cap("board"), policy={"drain": "graceful"})

    reply = advertise(client, "n1", cap("board"))

    assert reply["drain"] == "" and node_row(sql, "n1")["drain"] == ""


# ---------------------------------------------------------------- renewal


def test_an_advert_renews_the_nodes_lease_to_now_plus_renew_times_factor(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)
    sql.execute("update leases set not_after = now() + interval '10 seconds' where node_id = 'n1'")
    before = lease_not_after(sql, "n1")

    reply = advertise(client, "n1", cap("board"))

    after = lease_not_after(sql, "n1")
    assert after > before
    assert abs(seconds_ahead(sql, "not_after", "leases", "node_id", "n1") - WINDOW) < SLACK
    assert parse_ts(reply["leases"][0]["not_after"]) == after


def test_an_advert_renews_a_lease_that_already_passed_its_not_after(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)
    sql.execute("update leases set not_after = now() - interval '1 minute' where node_id = 'n1'")

    advertise(client, "n1", cap("board"))

    assert abs(seconds_ahead(sql, "not_after", "leases", "node_id", "n1") - WINDOW) < SLACK
    assert state_of(client, "r1") == "RUNNING"


def test_renewal_leaves_the_leases_of_other_nodes_alone(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    submit(client, contract("r1", role("dut", count=2)), 201)
    sql.execute("update leases set not_after = now() + interval '10 seconds'")
    before = lease_not_after(sql, "n2")

    advertise(client, "n1", cap("board"))

    assert lease_not_after(sql, "n2") == before
    assert abs(seconds_ahead(sql, "not_after", "leases", "node_id", "n1") - WINDOW) < SLACK


def test_renewal_skips_the_lease_of_a_finished_run(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)
    # A run that ended without its lease being deleted (a crash between two statements).
    sql.execute("update runs set state = 'FAILED', ended_at = now() where run_id = 'r1'")
    sql.execute("update leases set not_after = now() + interval '10 seconds' where node_id = 'n1'")
    before = lease_not_after(sql, "n1")

    reply = advertise(client, "n1", cap("board"))

    assert lease_not_after(sql, "n1") == before
    assert reply["leases"] == []


# ---------------------------------------------------------------- restart detection


def claimed_on_n1(client: Any, sql: Any, instance: str = "i1") -> None:
    """r1 RUNNING on n1 with its first step CLAIMED by ``instance``."""
    advertise(client, "n1", cap("board"), instance=instance)
    submit(client, two_steps("r1"), 201)
    resp = claim(client, "n1", instance)
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "r1#01"
    assert scalar(sql, "select state from steps where run_id = 'r1' and seq = 1") == "CLAIMED"


def test_a_new_instance_fails_the_step_claimed_by_the_old_one_and_its_run(client, sql):
    claimed_on_n1(client, sql)

    reply = advertise(client, "n1", cap("board"), instance="i2")

    assert scalar(sql, "select state from steps where run_id = 'r1' and seq = 1") == "FAILED"
    assert scalar(sql, "select error from steps where run_id = 'r1' and seq = 1") == RESTARTED
    assert scalar(sql, "select state from steps where run_id = 'r1' and seq = 2") == "FAILED"
    view = client.get("/v1/runs/r1").get_json()
    assert view["state"] == "FAILED" and view["ended_at"] is not None
    assert leases(sql) == []
    assert reply["leases"] == []
    assert (
        scalar(
            sql, "select count(*) from run_events where run_id = 'r1' and cause = 'node restarted'"
        )
        == 1
    )


def test_the_same_instance_re_advertising_changes_nothing(client, sql):
    claimed_on_n1(client, sql)

    reply = advertise(client, "n1", cap("board"), instance="i1")

    assert scalar(sql, "select state from steps where run_id = 'r1' and seq = 1") == "CLAIMED"
    assert state_of(client, "r1") == "RUNNING"
    assert leases(sql) == [("n1", "r1")]
    assert [x["run_id"] for x in reply["leases"]] == ["r1"]


def test_an_advert_without_instance_changes_nothing(client, sql):
    claimed_on_n1(client, sql)

    reply = advertise(client, "n1", cap("board"))

    assert scalar(sql, "select state from steps where run_id = 'r1' and seq = 1") == "CLAIMED"
    assert state_of(client, "r1") == "RUNNING"
    assert leases(sql) == [("n1", "r1")]
    assert [x["run_id"] for x in reply["leases"]] == ["r1"]


def test_a_restart_of_one_node_leaves_the_step_claimed_on_another_alone(client, sql):
    claimed_on_n1(client, sql)
    advertise(client, "n2", cap("host"), instance="h1")
    submit(client, contract("r2", role("dut", "host")), 201)
    assert claim(client, "n2", "h1").status_code == 200

    advertise(client, "n1", cap("board"), instance="i2")

    assert scalar(sql, "select state from steps where run_id = 'r2' and seq = 1") == "CLAIMED"
    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n2", "r2")]


# ---------------------------------------------------------------- drain


def test_a_draining_node_keeps_its_lease(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)

    reply = advertise(client, "n1", cap("board"), policy={"drain": "graceful"})

    assert reply["drain"] == "graceful"
    assert [x["run_id"] for x in reply["leases"]] == ["r1"]
    assert leases(sql) == [("n1", "r1")]
    assert state_of(client, "r1") == "RUNNING"


@pytest.mark.parametrize("drain", ["graceful", "at-boundary"])
def test_a_submit_needing_a_draining_node_queues_though_the_node_holds_no_lease(client, sql, drain):
    advertise(client, "n1", cap("board"), policy={"drain": drain})

    resp = submit(client, contract("r1"), 202)

    assert resp.get_json()["state"] == "QUEUED"
    assert leases(sql) == []


def test_a_submit_skips_a_draining_node_for_a_free_one(client, sql):
    advertise(client, "n1", cap("board"), policy={"drain": "graceful"})
    advertise(client, "n2", cap("board"))

    submit(client, contract("r1"), 201)

    assert leases(sql) == [("n2", "r1")]


def test_a_draining_node_is_not_given_to_a_queued_run_when_it_frees(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)
    submit(client, contract("r2"), 202)
    advertise(client, "n1", cap("board"), policy={"drain": "graceful"})

    assert client.post("/v1/runs/r1/cancel").status_code == 200

    assert state_of(client, "r2") == "QUEUED"
    assert leases(sql) == []


def test_a_draining_node_is_not_acquired(client, sql):
    advertise(client, "n1", cap("board", soc="a"))
    advertise(client, "n2", cap("board", soc="b"), policy={"drain": "graceful"})
    doc = contract(
        "r1",
        role("dut", soc="a"),
        steps=[
            {
                "id": "grab",
                "acquire": {
                    "want": {"as": "extra", "capability": "board", "soc": "b"},
                    "acquired": "with-extra",
                    "unavailable": "without-extra",
                },
            },
            {"id": "with-extra", "uses": "extra", "run": ["true"]},
            {"id": "without-extra", "uses": "dut", "run": ["true"]},
        ],
    )

    submit(client, doc, 201)

    states = dict(sql.execute("select step_id, state from steps where run_id = 'r1'").fetchall())
    assert states == {"grab": "DONE", "with-extra": "SKIPPED", "without-extra": "PENDING"}
    assert leases(sql) == [("n1", "r1")]


def test_a_draining_node_still_shows_in_dry_run_capabilities_and_the_node_list(client):
    advertise(client, "n1", cap("board", soc="a"), policy={"drain": "graceful"})

    dry = client.post("/v1/runs/dry-run", json=contract("r1", role("dut", soc="a")))
    caps = client.get("/v1/capabilities").get_json()["capabilities"]
    nodes = client.get("/v1/nodes").get_json()["nodes"]

    assert dry.status_code == 200 and dry.get_json()["state"] == "DRY_RUN"
    assert dry.get_json()["assigned"][0]["nodes"][0]["node"] == "n1"
    assert [(c["capability"], c["nodes"]) for c in caps] == [("board", 1)]
    assert [(n["node_id"], n["draining"]) for n in nodes] == [("n1", True)]


def test_at_boundary_drain_cancels_the_run_when_the_node_reports_a_step(client, sql):
    advertise(client, "n1", cap("board"), instance="i1")
    submit(client, two_steps("r1"), 201)
    assert claim(client, "n1", "i1").status_code == 200
    advertise(client, "n1", cap("board"), instance="i1", policy={"drain": "at-boundary"})

    resp = client.post(
        "/v1/runs/r1/steps/1/result", json={"node": "n1", "exit_code": 0, "produced": []}
    )

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": "FAILED"}
    view = client.get("/v1/runs/r1").get_json()
    assert view["state"] == "FAILED"
    notes = [c.get("note") for c in view["verdict"]["checks"]]
    assert "cancelled by: drain:n1" in notes
    assert [s["state"] for s in view["steps"]] == ["DONE", "FAILED"]
    assert leases(sql) == []


def test_graceful_drain_lets_the_run_go_on_after_a_step_result(client, sql):
    advertise(client, "n1", cap("board"), instance="i1")
    submit(client, two_steps("r1"), 201)
    assert claim(client, "n1", "i1").status_code == 200
    advertise(client, "n1", cap("board"), instance="i1", policy={"drain": "graceful"})

    resp = client.post(
        "/v1/runs/r1/steps/1/result", json={"node": "n1", "exit_code": 0, "produced": []}
    )

    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": ""}
    assert state_of(client, "r1") == "RUNNING"
    assert leases(sql) == [("n1", "r1")]
    assert claim(client, "n1", "i1").get_json()["step_id"] == "r1#02"


# ---------------------------------------------------------------- GET /v1/nodes


NODE_KEYS = {
    "node_id",
    "label",
    "instance",
    "capabilities",
    "seen_at",
    "expires_at",
    "live",
    "lease",
    "draining",
    "drain_mode",
    "hold",
    "health",
}


def test_the_node_list_shows_live_nodes_by_node_id_with_lease_and_drain(client, sql):
    advertise(client, "n2", cap("board", soc="b"), label="Bench 2", instance="i2")
    advertise(client, "n1", cap("board", soc="a"), cap("fpga"), label="Bench 1", instance="i1")
    advertise(client, "n3", cap("host"), policy={"drain": "graceful"})
    submit(client, contract("r1", role("dut", soc="a")), 201)

    resp = client.get("/v1/nodes")

    assert resp.status_code == 200
    body = resp.get_json()
    assert set(body) == {"observed_at", "nodes"} and body["observed_at"].endswith("Z")
    nodes = body["nodes"]
    assert [n["node_id"] for n in nodes] == ["n1", "n2", "n3"]
    assert all(set(n) == NODE_KEYS for n in nodes)
    n1, n2, n3 = nodes
    assert (n1["label"], n1["instance"], n1["live"]) == ("Bench 1", "i1", True)
    assert n1["capabilities"] == [
        {"capability": "board", "attrs": {"soc": "a"}},
        {"capability": "fpga", "attrs": {}},
    ]
    lease = one(sql, "select * from leases where node_id = 'n1'")
    assert n1["lease"] == {"run_id": "r1", "not_after": n1["lease"]["not_after"]}
    assert parse_ts(n1["lease"]["not_after"]) == lease["not_after"]
    row = node_row(sql, "n1")
    assert (
        parse_ts(n1["seen_at"]) == row["seen_at"]
        and parse_ts(n1["expires_at"]) == row["expires_at"]
    )
    assert n2["lease"] is None and n2["live"] is True and not n2["draining"]
    assert n1["draining"] is False and n1["drain_mode"] is None
    assert (
        n3["draining"] is True
        and n3["drain_mode"] == "graceful"
        and n3["label"] is None
        and n3["instance"] is None
    )


def test_a_node_whose_advert_expired_but_holds_a_lease_is_listed_not_live(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1"), 201)
    sql.execute("update nodes set expires_at = now() - interval '1 second'")

    nodes = client.get("/v1/nodes").get_json()["nodes"]

    assert [(n["node_id"], n["live"]) for n in nodes] == [("n1", False)]
    assert nodes[0]["lease"]["run_id"] == "r1"


def test_a_node_whose_advert_expired_without_a_lease_is_not_listed(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    sql.execute("update nodes set expires_at = now() - interval '1 second' where node_id = 'n1'")

    nodes = client.get("/v1/nodes").get_json()["nodes"]

    assert [n["node_id"] for n in nodes] == ["n2"]


@pytest.mark.parametrize("query", ["?live=true", "?x"])
def test_the_node_list_with_any_query_parameter_is_400(client, query):
    advertise(client, "n1", cap("board"))

    resp = client.get("/v1/nodes" + query)

    assert resp.status_code == 400
    err = resp.get_json()["error"]
    assert err["code"] == 400 and err["reason"]


# ---------------------------------------------------------------- GET /v1/capabilities


def test_capabilities_count_nodes_and_collect_attribute_values_over_live_adverts(client, sql):
    advertise(client, "n1", cap("board", soc="imx8mp", ram="4g"))
    advertise(client, "n2", cap("board", soc="rk3588"), cap("agent.reason", model="m1"))
    advertise(client, "n3", cap("board", soc="imx8mp"))
    advertise(client, "old", cap("board", soc="am62"), cap("fpga"))
    sql.execute("update nodes set expires_at = now() - interval '1 second' where node_id = 'old'")

    resp = client.get("/v1/capabilities")

    assert resp.status_code == 200
    body = resp.get_json()
    assert set(body) == {"capabilities"}
    got = {c["capability"]: c for c in body["capabilities"]}
    assert set(got) == {"board", "agent.reason"}
    assert all(set(c) == {"capability", "nodes", "attrs"} for c in got.values())
    assert got["board"]["nodes"] == 3
    assert {k: sorted(v) for k, v in got["board"]["attrs"].items()} == {
        "soc": ["imx8mp", "rk3588"],
        "ram": ["4g"],
    }
    assert got["agent.reason"] == {
        "capability": "agent.reason",
        "nodes": 1,
        "attrs": {"model": ["m1"]},
    }


def test_capabilities_of_an_empty_fleet_are_an_empty_list(client):
    resp = client.get("/v1/capabilities")

    assert resp.status_code == 200 and resp.get_json() == {"capabilities": []}
