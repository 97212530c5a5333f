"""Submit, dry-run and the queue (docs/contract.md#requirements-and-how-runs-are-placed,
docs/queue.md#on-submit-placed-queued-or-rejected,
docs/queue.md#promotion-the-request-that-frees-a-node-promotes), through the HTTP API on a real
PostgreSQL.

Every submit outcome of the table in docs/queue.md#on-submit-placed-queued-or-rejected, arrival
order and head-of-line skipping of the wake scan, the width cap at submit and at promotion, a
promotion whose node was taken meanwhile, what a QUEUED run holds (nothing) and how its wait is
explained, the scan that submit runs itself after queueing (the submit window), and the request log
of a submit (docs/metrics.md#logs)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
import structlog

from app.match import candidate_order
from app.services.queue import Outcome, promote
from app.store.nodes import live_adverts
from app.store.queue import queued_shape_heads
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.concurrency import (
    submit_held_after_its_read,
)
from tests.support.contracts import contract, role
from tests.support.rows import attempts, find_run, leases, one, run_row, run_state, scalar
from tests.support.submitter import submit
from tests.support.wire import error_body

HEX32 = re.compile(r"[0-9a-f]{32}")
DRAINING = {"policy": {"drain": "graceful"}}
WIDTH_CAP_1 = pytest.mark.parametrize("config_overrides", [{"lease.max_per_run": 1}], ids=["cap1"])


# ---------------------------------------------------------------- rows, read like an operator


def step_layout(sql: Any, run_id: str) -> list[tuple[Any, ...]]:
    """(seq, id, kind, uses, state, node_id, needs) by seq."""
    return [
        tuple(r)
        for r in sql.execute(
            "select seq, step_id, kind, uses, state, node_id, needs from steps"
            " where run_id = %s order by seq",
            (run_id,),
        )
    ]


def count(sql: Any, table: str, run_id: str) -> int:
    return sql.execute(f"select count(*) from {table} where run_id = %s", (run_id,)).fetchone()[0]


def record_exists(ctx: Any, run_id: str) -> bool:
    return ctx.records.path(run_id).exists()


def rfc3339(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def db_now(sql: Any) -> datetime:
    return sql.execute("select now()").fetchone()[0]


def hold(client: Any, run_id: str, *roles: dict[str, Any]) -> None:
    """A RUNNING run that holds the nodes its roles match first."""
    assert submit(client, contract(run_id, *roles), 201).get_json()["state"] == "RUNNING"


# ---------------------------------------------------------------- 400: invalid contract


def test_an_invalid_contract_is_400_naming_the_field_and_stores_nothing(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    doc = contract("bad-1", role("dut"), steps=[{"id": "boot", "uses": "dutt", "run": ["boot"]}])

    resp = client.post("/v1/runs", json=doc)

    assert resp.status_code == 400
    assert resp.get_json() == error_body(400, 'step "boot" uses undeclared role "dutt"')
    assert find_run(sql, "bad-1") is None
    assert sql.execute("select count(*) from run_events").fetchone() == (0,)
    assert sql.execute("select count(*) from steps").fetchone() == (0,)
    assert not record_exists(ctx, "bad-1")


# ------------------------ 422: no candidate (docs/contract.md#requirements-and-how-runs-are-placed)


def test_no_candidate_in_the_live_fleet_is_422_and_a_failed_row_with_its_reject_and_no_steps(
    client, ctx, sql
):
    advertise(client, "n1", cap("board", soc="imx8mm"))

    resp = client.post("/v1/runs", json=contract("r1", role("dut", soc="imx8mp")))

    reason = "need 1, fleet has 0 - board soc=imx8mp"
    assert resp.status_code == 422 and resp.get_json() == error_body(422, reason)
    row = run_row(sql, "r1")
    assert row["state"] == "FAILED" and row["ended_at"] is not None
    assert row["reject"] == {"Code": 422, "As": "dut", "Reason": reason}
    assert step_layout(sql, "r1") == [] and leases(sql) == []
    view = client.get("/v1/runs/r1").get_json()
    assert view["state"] == "FAILED" and view["steps"] == []
    assert view["reject"] == {"Code": 422, "As": "dut", "Reason": reason}


def test_a_role_wanting_more_nodes_than_the_fleet_has_is_422_need_n_fleet_has_m(client, sql):
    advertise(client, "n1", cap("board"))

    resp = client.post("/v1/runs", json=contract("r1", role("dut", count=2)))

    assert resp.get_json() == error_body(422, "need 2, fleet has 1 - board")
    assert run_state(sql, "r1") == "FAILED"


def test_a_node_whose_advert_expired_is_not_a_candidate(client, sql):
    advertise(client, "n1", cap("board"))
    sql.execute("update nodes set expires_at = now() - interval '1 second'")

    resp = client.post("/v1/runs", json=contract("r1"))

    assert resp.status_code == 422 and resp.get_json() == error_body(
        422, "need 1, fleet has 0 - board"
    )
    assert leases(sql) == []


def test_a_role_no_node_can_ever_fill_is_422_even_when_an_earlier_role_is_only_busy(client, sql):
    # Pass 1 for every role before any role in pass 2; a permanent rejection wins
    # (docs/design.md#matcher-and-width-cap).
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))

    resp = client.post("/v1/runs", json=contract("r1", role("dut"), role("gpu", "gpu")))

    reason = "need 1, fleet has 0 - gpu"
    assert resp.status_code == 422 and resp.get_json() == error_body(422, reason)
    assert run_row(sql, "r1")["reject"] == {"Code": 422, "As": "gpu", "Reason": reason}


# ---------------------------------------------------------------- 422: width cap at submit


@WIDTH_CAP_1
def test_the_width_cap_at_submit_is_422_and_a_failed_row_with_the_reason(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("host"))

    resp = client.post("/v1/runs", json=contract("wide", role("dut"), role("host", "host")))

    reason = "requires exceeds the width limit: 2 nodes, limit 1"
    assert resp.status_code == 422 and resp.get_json() == error_body(422, reason)
    row = run_row(sql, "wide")
    assert row["state"] == "FAILED" and row["ended_at"] is not None
    assert row["reject"]["Code"] == 422 and row["reject"]["Reason"] == reason
    assert step_layout(sql, "wide") == [] and leases(sql) == []
    view = client.get("/v1/runs/wide").get_json()
    assert view["state"] == "FAILED" and view["reject"]["Reason"] == reason


@WIDTH_CAP_1
def test_one_node_filling_two_roles_takes_one_lease_and_counts_once_for_the_width_cap(client, sql):
    advertise(client, "n1", cap("board"), cap("host"))

    body = submit(client, contract("folded", role("dut"), role("host", "host")), 201).get_json()

    assert body["state"] == "RUNNING"
    assert [(a["as"], [n["node"] for n in a["nodes"]]) for a in body["assigned"]] == [
        ("dut", ["n1"]),
        ("host", ["n1"]),
    ]
    assert leases(sql) == [("n1", "folded")]


# ---------------------------------------------------------------- dry-run


def test_a_dry_run_is_200_with_the_assignment_ignoring_busy_and_draining_nodes_and_stores_nothing(
    client, ctx, sql
):
    advertise(client, "n1", cap("board"), label="Board 1")
    advertise(client, "n2", cap("host"), label="Host 2", **DRAINING)
    hold(client, "holder", role("dut"))
    doc = contract("try-1", role("dut"), role("host", "host"))

    resp = client.post("/v1/runs/dry-run", json=doc)

    assert resp.status_code == 200
    assert resp.get_json() == {
        "run_id": "try-1",
        "state": "DRY_RUN",
        "team": "default",
        "assigned": [
            {"as": "dut", "nodes": [{"node": "n1", "label": "Board 1"}]},
            {"as": "host", "nodes": [{"node": "n2", "label": "Host 2"}]},
        ],
        "warnings": [],
    }
    assert find_run(sql, "try-1") is None and not record_exists(ctx, "try-1")
    assert count(sql, "run_events", "try-1") == 0
    assert leases(sql) == [("n1", "holder")]


def test_a_dry_run_with_no_candidate_is_422_and_stores_no_failed_row(client, ctx, sql):
    advertise(client, "n1", cap("board"))

    resp = client.post("/v1/runs/dry-run", json=contract("try-1", role("gpu", "gpu")))

    assert resp.status_code == 422 and resp.get_json() == error_body(
        422, "need 1, fleet has 0 - gpu"
    )
    assert find_run(sql, "try-1") is None and not record_exists(ctx, "try-1")


def test_a_dry_run_of_an_invalid_contract_is_400(client, sql):
    resp = client.post("/v1/runs/dry-run", json={"run_id": "try-1", "steps": []})

    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == 400
    assert "requires" in resp.get_json()["error"]["reason"]
    assert find_run(sql, "try-1") is None


@WIDTH_CAP_1
def test_a_dry_run_over_the_width_cap_is_422_and_stores_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("host"))

    doc = contract("try-1", role("dut"), role("host", "host"))

    resp = client.post("/v1/runs/dry-run", json=doc)

    reason = "requires exceeds the width limit: 2 nodes, limit 1"
    assert resp.status_code == 422 and resp.get_json() == error_body(422, reason)
    assert find_run(sql, "try-1") is None


# ---------------------------------------------------------------- 202: all busy or draining


def test_a_run_whose_candidates_are_all_busy_is_queued_202_holding_no_lease(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))

    resp = client.post("/v1/runs", json=contract("waiter"))

    assert resp.status_code == 202
    body = resp.get_json()
    assert body["run_id"] == "waiter" and body["state"] == "QUEUED" and "assigned" not in body
    row = run_row(sql, "waiter")
    assert row["state"] == "QUEUED" and row["assigned"] is None and row["reject"] is None
    assert leases(sql) == [("n1", "holder")]
    assert record_exists(ctx, "waiter")


def test_a_run_whose_candidates_are_all_draining_is_queued_202(client, sql):
    advertise(client, "n1", cap("board"), **DRAINING)
    advertise(client, "n2", cap("board"), policy={"drain": "at-boundary"})

    resp = client.post("/v1/runs", json=contract("waiter"))

    assert resp.status_code == 202 and resp.get_json()["state"] == "QUEUED"
    assert leases(sql) == []


def test_a_run_whose_candidates_are_busy_or_draining_is_queued_202(client, sql):
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))
    advertise(client, "n2", cap("board"), **DRAINING)

    resp = client.post("/v1/runs", json=contract("waiter"))

    assert resp.status_code == 202 and run_state(sql, "waiter") == "QUEUED"
    assert leases(sql) == [("n1", "holder")]


# ---------------------------------------------------------------- 201: placed


@pytest.mark.parametrize("config_overrides", [{"lease.ttl_seconds": 1234}], ids=["ttl1234"])
def test_a_placed_run_is_201_running_with_one_lease_per_node_for_the_ttl_and_a_32_hex_nonce(
    client, ctx, sql
):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("host"))

    resp = client.post("/v1/runs", json=contract("r1", role("dut"), role("host", "host")))

    assert resp.status_code == 201 and resp.get_json()["state"] == "RUNNING"
    rows = sql.execute(
        "select node_id, run_id, nonce, extract(epoch from not_after - now())"
        " from leases order by node_id"
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [("n1", "r1"), ("n2", "r1")]
    assert all(HEX32.fullmatch(r[2]) for r in rows) and rows[0][2] != rows[1][2]
    # not_after = now() + lease.ttl_seconds, by the database clock.
    assert all(1234 - 60 < float(r[3]) <= 1234 for r in rows)
    assert record_exists(ctx, "r1")


def test_steps_of_a_placed_run_are_pending_and_bound_to_the_first_node_of_their_role(client, sql):
    # Candidate order (docs/contract.md#requirements-and-how-runs-are-placed): fewer attributes
    # first, so n2 is the role's first node.
    advertise(client, "n1", cap("board", soc="x", rev="b"))
    advertise(client, "n2", cap("board", soc="x"))
    advertise(client, "h1", cap("host"))
    doc = contract(
        "r1",
        role("dut", count=2, soc="x"),
        role("host", "host"),
        steps=[
            {"id": "flash", "uses": "host", "run": ["flash"]},
            {"id": "boot", "uses": "dut", "run": ["boot"]},
        ],
    )

    body = submit(client, doc, 201).get_json()

    assert [(a["as"], [n["node"] for n in a["nodes"]]) for a in body["assigned"]] == [
        ("dut", ["n2", "n1"]),
        ("host", ["h1"]),
    ]
    assert step_layout(sql, "r1") == [
        (1, "flash", "run", "host", "PENDING", "h1", []),
        (2, "boot", "run", "dut", "PENDING", "n2", [1]),
    ]
    assert leases(sql) == [("h1", "r1"), ("n1", "r1"), ("n2", "r1")]


# ---------------------------------------------------------------- 200: run_id already known


def test_a_resubmit_of_a_known_run_id_is_200_with_its_current_view_and_the_body_is_not_compared(
    client, sql
):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("host"))
    submit(client, contract("r1"), 201)
    steps = [{"id": "x", "uses": "host", "run": ["x"]}]
    different = contract("r1", role("host", "host"), steps=steps)

    resp = client.post("/v1/runs", json=different)

    assert resp.status_code == 200
    assert resp.get_json() == client.get("/v1/runs/r1").get_json()
    assert resp.get_json()["state"] == "RUNNING"
    assert [s[1] for s in step_layout(sql, "r1")] == ["use-dut"]
    assert leases(sql) == [("n1", "r1")]
    assert count(sql, "run_events", "r1") == 1


def test_a_resubmit_of_a_rejected_run_id_is_200_failed_even_when_the_fleet_now_fits(client, sql):
    client.post("/v1/runs", json=contract("r1"))
    advertise(client, "n1", cap("board"))

    resp = client.post("/v1/runs", json=contract("r1"))

    assert resp.status_code == 200 and resp.get_json()["state"] == "FAILED"
    assert resp.get_json()["reject"]["Reason"] == "need 1, fleet has 0 - board"
    assert leases(sql) == []


def test_a_resubmit_of_a_queued_run_id_is_200_queued(client, sql):
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))
    submit(client, contract("waiter"), 202)

    resp = client.post("/v1/runs", json=contract("waiter"))

    assert resp.status_code == 200 and resp.get_json()["state"] == "QUEUED"
    assert sql.execute("select count(*) from runs where state = 'QUEUED'").fetchone() == (1,)


# ---------------------------------------------------------------- the queue: order and skipping


@pytest.mark.parametrize(
    "older_role",
    [role("dut"), role("dut", soc="x")],
    ids=["same-shape", "another-shape"],
)
def test_of_two_queued_runs_for_one_node_the_older_is_promoted_first(client, sql, older_role):
    advertise(client, "n1", cap("board", soc="x"))
    hold(client, "holder", role("dut"))
    # The older run's id sorts last: arrival order, not run_id order, decides.
    submit(client, contract("z-older", older_role), 202)
    submit(client, contract("a-younger", role("dut")), 202)

    assert client.post("/v1/runs/holder/cancel").status_code == 200

    assert run_state(sql, "z-older") == "RUNNING" and run_state(sql, "a-younger") == "QUEUED"
    assert leases(sql) == [("n1", "z-older")]


def test_an_older_queued_run_that_does_not_fit_does_not_block_a_younger_one_whose_node_is_free(
    client, sql
):
    advertise(client, "na", cap("board", soc="a"))
    advertise(client, "nb", cap("board", soc="b"))
    hold(client, "hold-a", role("dut", soc="a"))
    hold(client, "hold-b", role("dut", soc="b"))
    submit(client, contract("older", role("a", soc="a"), role("b", soc="b")), 202)
    submit(client, contract("younger", role("b", soc="b")), 202)

    assert client.post("/v1/runs/hold-b/cancel").status_code == 200

    assert run_state(sql, "older") == "QUEUED"
    assert run_state(sql, "younger") == "RUNNING"
    assert leases(sql) == [("na", "hold-a"), ("nb", "younger")]


def test_a_queued_run_whose_promotion_fails_does_not_stop_the_scan(client, sql):
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))
    submit(client, contract("broken", role("dut")), 202)
    submit(client, contract("fine", role("dut")), 202)
    # The older run's stored requirement is damaged (same shape key): matching it raises.
    sql.execute("update runs set requires = '[{\"as\": \"dut\"}]' where run_id = 'broken'")

    resp = client.post("/v1/runs/holder/cancel")

    assert resp.get_json() == {"run_id": "holder", "state": "FAILED"}
    assert run_state(sql, "broken") == "QUEUED"
    assert run_state(sql, "fine") == "RUNNING" and leases(sql) == [("n1", "fine")]


def _queued_over_the_width_cap_at_promotion(client: Any) -> None:
    """n1 offers a board (with an attribute) and a host: one node that could fill both roles of
    "wide"; n2 a plain board, n3 a plain host. "wide" is only "all busy" (202) while n1 and n2
    are held; once n2 is free the matcher picks n2 for the board and n3 for the host, two nodes
    over a cap of 1, and n1, which would fold them into one, is still held."""
    advertise(client, "n1", cap("board", soc="x"), cap("host"))
    advertise(client, "n2", cap("board"))
    advertise(client, "n3", cap("host"))
    hold(client, "holder", role("h", soc="x"))
    hold(client, "takes-n2", role("dut"))
    submit(client, contract("wide", role("dut"), role("host", "host")), 202)
    assert client.post("/v1/runs/takes-n2/cancel").status_code == 200


@WIDTH_CAP_1
def test_a_queued_run_over_the_width_cap_at_promotion_stays_queued_and_takes_nothing(client, sql):
    _queued_over_the_width_cap_at_promotion(client)

    row = run_row(sql, "wide")
    assert row["state"] == "QUEUED" and row["reject"] is None and row["assigned"] is None
    assert leases(sql) == [("n1", "holder")]
    assert [s[5] for s in step_layout(sql, "wide")] == [None, None]


@WIDTH_CAP_1
def test_a_queued_run_kept_by_the_width_cap_is_promoted_by_a_later_scan_when_its_nodes_fold(
    client, sql
):
    _queued_over_the_width_cap_at_promotion(client)

    assert client.post("/v1/runs/holder/cancel").status_code == 200  # n1 free: a wake point

    view = client.get("/v1/runs/wide").get_json()
    assert view["state"] == "RUNNING"
    assert [(a["as"], [n["node"] for n in a["nodes"]]) for a in view["assigned"]] == [
        ("dut", ["n1"]),
        ("host", ["n1"]),
    ]
    assert leases(sql) == [("n1", "wide")]


def test_a_promotion_whose_node_was_taken_meanwhile_rolls_back_and_leaves_the_run_queued(
    client, ctx, sql
):
    advertise(client, "n1", cap())
    submit(client, contract("r1", role("dut")), 201)
    submit(client, contract("r2", role("dut")), 202)
    r1_before = run_row(sql, "r1")
    r1_lease = one(sql, "select * from leases where node_id = 'n1'")
    r1_steps = attempts(sql, "r1")
    with ctx.db.read() as s:
        run = next(h for h in queued_shape_heads(s) if h.run_id == "r2")
        adverts = candidate_order(live_adverts(s))

    # A stale picture: as if n1 were free; the lease key must catch it.
    outcome = promote(ctx, run, adverts, set(), "test")[0]

    assert outcome is Outcome.NODE_TAKEN
    assert scalar(sql, "select state from runs where run_id = 'r2'") == "QUEUED"
    assert scalar(sql, "select assigned from runs where run_id = 'r2'") is None
    assert scalar(sql, "select count(*) from leases where run_id = 'r2'") == 0
    assert (
        scalar(sql, "select count(*) from run_events where run_id = 'r2' and to_state = 'RUNNING'")
        == 0
    )
    assert sql.execute("select node_id from steps where run_id = 'r2'").fetchall() == [(None,)]
    assert run_row(sql, "r1") == r1_before
    assert one(sql, "select * from leases where node_id = 'n1'") == r1_lease
    assert attempts(sql, "r1") == r1_steps


# ---------------------------------------------------------------- what a QUEUED run is


NORMALISED = [
    {"id": "a", "uses": "dut", "run": ["a"]},
    {
        "id": "grab",
        "acquire": {
            "want": {"as": "extra", "capability": "probe"},
            "acquired": "with-probe",
            "unavailable": "without-probe",
        },
    },
    {"id": "with-probe", "uses": "extra", "run": ["probe"]},
    {"id": "without-probe", "uses": "dut", "run": ["plain"]},
    {"id": "at-once", "uses": "dut", "run": ["x"], "needs": []},
    {"id": "next", "uses": "dut", "run": ["y"]},
    {"id": "join", "uses": "dut", "run": ["z"], "needs": ["a", "next"]},
]


def test_steps_of_a_queued_run_exist_pending_unbound_with_the_needs_of_a_running_run(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("running", role("dut"), steps=NORMALISED), 201)
    submit(client, contract("queued", role("dut"), steps=NORMALISED), 202)

    running, queued = step_layout(sql, "running"), step_layout(sql, "queued")

    expected_needs = [[], [1], [2], [2], [], [5], [1, 6]]
    assert [s[6] for s in running] == expected_needs
    assert [(s[0], s[1], s[2], s[3], s[6]) for s in queued] == [
        (s[0], s[1], s[2], s[3], s[6]) for s in running
    ]
    assert {(s[4], s[5]) for s in queued} == {("PENDING", None)}
    view = client.get("/v1/runs/queued").get_json()
    assert [s["needs"] for s in view["steps"]] == [
        [],
        ["a"],
        ["grab"],
        ["grab"],
        [],
        ["at-once"],
        ["a", "next"],
    ]


HOLDS_NOTHING = [
    {
        "id": "approve",
        "ask": {"prompt": "Go?"},
        "out": ["decision"],
        "schema": {
            "decision": {"type": "object", "properties": {"verdict": {"enum": ["go", "stop"]}}}
        },
        "needs": [],
    },
    {
        "id": "grab",
        "acquire": {
            "want": {"as": "extra", "capability": "probe"},
            "acquired": "with-probe",
            "unavailable": "without-probe",
        },
        "needs": [],
    },
    {"id": "with-probe", "uses": "extra", "run": ["probe"]},
    {"id": "without-probe", "uses": "dut", "run": ["plain"]},
]


def test_a_queued_run_holds_no_lease_raises_no_ask_and_runs_no_acquire(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "px", cap("probe"))
    hold(client, "holder", role("dut"))

    submit(client, contract("waiter", role("dut"), steps=HOLDS_NOTHING), 202)

    assert leases(sql) == [("n1", "holder")]
    assert [(s[1], s[4], s[5]) for s in step_layout(sql, "waiter")] == [
        ("approve", "PENDING", None),
        ("grab", "PENDING", None),
        ("with-probe", "PENDING", None),
        ("without-probe", "PENDING", None),
    ]
    assert count(sql, "blobs", "waiter") == 0
    assert [a for a in client.get("/v1/asks").get_json()["asks"] if a["run_id"] == "waiter"] == []


def test_promotion_takes_the_leases_binds_the_steps_raises_the_ask_and_runs_the_acquire(
    client, sql
):
    advertise(client, "n1", cap("board"))
    advertise(client, "px", cap("probe"))
    hold(client, "holder", role("dut"))
    submit(client, contract("waiter", role("dut"), steps=HOLDS_NOTHING), 202)

    assert client.post("/v1/runs/holder/cancel").status_code == 200

    assert run_state(sql, "waiter") == "RUNNING"
    assert leases(sql) == [("n1", "waiter"), ("px", "waiter")]
    assert [(s[1], s[4], s[5]) for s in step_layout(sql, "waiter")] == [
        ("approve", "ASKED", None),
        ("grab", "DONE", None),
        ("with-probe", "PENDING", "px"),
        ("without-probe", "SKIPPED", "n1"),
    ]
    asks = [a for a in client.get("/v1/asks").get_json()["asks"] if a["run_id"] == "waiter"]
    assert [(a["seq"], a["step"]) for a in asks] == [(1, "approve")]


# ---------------------------------------------------------------- explaining the wait


def _two_queued_behind_three_holders(client: Any, sql: Any) -> None:
    """Boards: n1, n2 (plain), n5 (soc=other, later in candidate order), n3 draining; h1 holds n5,
    h2 n1, h3 n2; n4 is a free host. q-old (a board) and q-new (a board and a host) queue, in
    that order."""
    advertise(client, "n3", cap("board"), **DRAINING)
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    advertise(client, "n4", cap("host"))
    advertise(client, "n5", cap("board", soc="other"))
    hold(client, "h1", role("dut", soc="other"))
    hold(client, "h2", role("dut"))
    hold(client, "h3", role("dut"))
    assert leases(sql) == [("n1", "h2"), ("n2", "h3"), ("n5", "h1")]
    submit(client, contract("q-old", role("dut")), 202)
    submit(client, contract("q-new", role("dut"), role("host", "host")), 202)


def test_the_view_of_a_queued_run_explains_candidates_holders_and_its_place_in_the_queue(
    client, sql
):
    _two_queued_behind_three_holders(client, sql)

    view = client.get("/v1/runs/q-new").get_json()

    assert view["state"] == "QUEUED"
    lines = {r["as"]: r for r in view["requires"]}
    # Boards: n1, n2, n5 busy (h2, h3, h1), n3 draining; all four live.
    assert lines["dut"]["capability"] == "board"
    assert lines["dut"]["candidates"] == {
        "live": 4,
        "busy": 3,
        "draining": 1,
        "quarantined": 0,
        "reserved": 0,
    }
    assert sorted(lines["dut"]["held_by"]) == ["h1", "h2", "h3"]
    assert lines["host"]["candidates"] == {
        "live": 1,
        "busy": 0,
        "draining": 0,
        "quarantined": 0,
        "reserved": 0,
    }
    assert lines["host"]["held_by"] == []
    assert view["queue"] == {"position": 2, "ahead": 1}
    at = rfc3339(view["candidates_at"])
    assert abs(at - db_now(sql)) < timedelta(seconds=30)


def test_the_explanation_of_the_wait_is_computed_at_read_time(client, sql):
    _two_queued_behind_three_holders(client, sql)

    # h3 ends: q-old is promoted onto the board h3 held; q-new now waits behind nobody.
    assert client.post("/v1/runs/h3/cancel").status_code == 200

    assert run_state(sql, "q-old") == "RUNNING"
    view = client.get("/v1/runs/q-new").get_json()
    assert view["state"] == "QUEUED"
    assert view["queue"] == {"position": 1, "ahead": 0}
    dut = next(r for r in view["requires"] if r["as"] == "dut")
    assert dut["candidates"] == {
        "live": 4,
        "busy": 3,
        "draining": 1,
        "quarantined": 0,
        "reserved": 0,
    }
    assert sorted(dut["held_by"]) == ["h1", "h2", "q-old"]


def test_a_candidate_both_busy_and_draining_counts_as_busy_only(client):
    advertise(client, "n1", cap())
    advertise(client, "n2", cap(), policy={"drain": "graceful"})
    submit(client, contract("r1", role("dut")), 201)
    advertise(client, "n1", cap(), policy={"drain": "graceful"})  # n1: busy with r1 and draining
    submit(client, contract("r2", role("dut")), 202)

    view = client.get("/v1/runs/r2").get_json()

    line = view["requires"][0]
    assert line["candidates"] == {
        "live": 2,
        "busy": 1,
        "draining": 1,
        "quarantined": 0,
        "reserved": 0,
    }
    assert line["held_by"] == ["r1"]


def test_the_view_of_a_running_run_has_no_queue_explanation(client):
    advertise(client, "n1", cap("board"))
    view = submit(client, contract("r1"), 201).get_json()

    assert "queue" not in view and "candidates_at" not in view
    assert all("candidates" not in r and "held_by" not in r for r in view["requires"])


# ---------------------------- the submit window (docs/queue.md#on-submit-placed-queued-or-rejected)


def test_a_node_taken_between_match_and_insert_rolls_the_creation_back_whole_and_queues_202(
    app, client, ctx, sql, db_url
):
    advertise(client, "n1", cap("board"))
    with submit_held_after_its_read(app, sql, db_url, contract("late")) as answer:
        # The submit matched n1 as free; another run takes it before the lease insert.
        hold(client, "thief", role("dut"))

    resp = answer["resp"]
    assert resp.status_code == 202, resp.get_json()
    assert resp.get_json()["state"] == "QUEUED"
    assert leases(sql) == [("n1", "thief")]
    row = run_row(sql, "late")
    assert row["state"] == "QUEUED" and row["assigned"] is None
    assert step_layout(sql, "late") == [(1, "use-dut", "run", "dut", "PENDING", None, [])]
    # Nothing of the rolled-back RUNNING attempt is left: one event, the queueing.
    assert sql.execute(
        "select from_state, to_state from run_events where run_id = 'late'"
    ).fetchall() == [(None, "QUEUED")]
    assert record_exists(ctx, "late")


def test_the_scan_in_submit_promotes_a_run_whose_node_was_freed_after_the_submit_read_it(
    app, client, sql, db_url
):
    """The node is freed (and that cancel's own wake scan runs) after the submit read the
    unavailable set and before its QUEUED row is visible: only the scan the submit runs itself
    can promote it, and the reply, chosen by re-reading the run, is then 201."""
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))
    with submit_held_after_its_read(app, sql, db_url, contract("late")) as answer:
        cancel = client.post("/v1/runs/holder/cancel")
        assert cancel.get_json() == {"run_id": "holder", "state": "FAILED"}
        # n1 is free and the cancel's scan has run: it saw no queued run.
        assert leases(answer["watcher"]) == []

    resp = answer["resp"]
    assert resp.status_code == 201, resp.get_json()
    assert resp.get_json()["state"] == "RUNNING"
    assert leases(sql) == [("n1", "late")]


def submit_scans(logs: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The wake scans a submit of ``run_id`` ran or skipped at the gate, from the captured log."""
    return [
        e
        for e in logs
        if e["event"].startswith("wake scan") and e.get("cause") == f"submit of {run_id}"
    ]


@pytest.mark.parametrize("config_overrides", [{"log.level": "debug"}])
def test_a_queued_submits_scan_ends_at_its_check_when_nothing_was_freed_since_its_read(client, sql):
    """No wake mark since the submit's read and no work for the reservation step: a scan could
    find nothing, and the submit's ends at that check (no gate, no mark, no queue read). Its 202
    is the run view a GET gives, explanation of the wait included."""
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))
    marks = scalar(sql, "select last_value from wake_mark")

    with structlog.testing.capture_logs() as logs:
        view = submit(client, contract("waiter"), 202).get_json()

    scans = submit_scans(logs, "waiter")
    assert [(e["event"], e.get("nothing_freed"), e["looked"]) for e in scans] == [
        ("wake scan", True, 0)
    ]
    assert scalar(sql, "select last_value from wake_mark") == marks
    got = client.get("/v1/runs/waiter").get_json()
    assert view.pop("candidates_at") and got.pop("candidates_at")
    assert view == got
    assert view["queue"] == {"position": 1, "ahead": 0}
    assert view["requires"][0]["candidates"] == {
        "live": 1,
        "busy": 1,
        "draining": 0,
        "quarantined": 0,
        "reserved": 0,
    }
    assert view["requires"][0]["held_by"] == ["holder"]


@pytest.mark.parametrize("config_overrides", [{"log.level": "debug"}])
def test_a_queued_submit_scans_when_a_mark_was_taken_after_its_read(app, client, sql, db_url):
    """A freeing commit after the submit's read takes a wake mark: the submit scans."""
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    hold(client, "h1", role("dut"))
    hold(client, "h2", role("dut"))
    with structlog.testing.capture_logs() as logs:
        with submit_held_after_its_read(app, sql, db_url, contract("late")) as answer:
            # A node appears: capacity, a wake point with its mark (wake point 8,
            # docs/design.md#wake-points). It fits "late" only after "late" was read, so only the
            # submit's own scan places it.
            advertise(client, "n3", cap("board"))
    resp = answer["resp"]
    assert resp.status_code == 201, resp.get_json()
    assert [(e["event"], e.get("nothing_freed")) for e in submit_scans(logs, "late")] == [
        ("wake scan", None)
    ]
    assert leases(sql) == [("n1", "h1"), ("n2", "h2"), ("n3", "late")]


@pytest.mark.parametrize("config_overrides", [{"log.level": "debug"}])
def test_a_queued_submit_scans_when_the_reservation_step_has_work(client, sql):
    """A reservation stored (here one whose holder ended, which a scan removes): the reservation
    step has work, and the submit's scan does it."""
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))
    sql.execute("insert into reservations (node_id, run_id) values ('n1', 'holder')")

    with structlog.testing.capture_logs() as logs:
        submit(client, contract("waiter"), 202)

    assert [(e["event"], e.get("nothing_freed")) for e in submit_scans(logs, "waiter")] == [
        ("wake scan", None)
    ]
    assert scalar(sql, "select count(*) from reservations") == 0


# ---------------------------------------------------------------- the Record, opened before commit


def block_the_record(ctx: Any, run_id: str) -> None:
    """A plain file where the run's Record directory must go: opening the Record fails."""
    path = ctx.records.path(run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"in the way")


def test_a_queued_run_whose_record_cannot_be_opened_is_an_error_and_no_run_exists(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    hold(client, "holder", role("dut"))
    block_the_record(ctx, "waiter")

    resp = client.post("/v1/runs", json=contract("waiter"))

    assert resp.status_code >= 500 and set(resp.get_json()) == {"error"}
    assert find_run(sql, "waiter") is None
    assert count(sql, "steps", "waiter") == 0 and count(sql, "run_events", "waiter") == 0


def test_a_placed_run_whose_record_cannot_be_opened_is_an_error_and_takes_no_lease(
    client, ctx, sql
):
    advertise(client, "n1", cap("board"))
    block_the_record(ctx, "r1")

    resp = client.post("/v1/runs", json=contract("r1"))

    assert resp.status_code >= 500 and set(resp.get_json()) == {"error"}
    assert find_run(sql, "r1") is None and leases(sql) == []
    assert count(sql, "steps", "r1") == 0


# ---------------------------------------------------------------- warnings


LEASE_BLOCK_WARNING = "the contract's lease block is ignored: lease times are the server's"


def test_the_201_reply_carries_the_contract_warnings(client):
    advertise(client, "n1", cap("board"))

    body = submit(client, contract("r1", lease={"ttl": "9h"}), 201).get_json()

    assert body["warnings"] == [LEASE_BLOCK_WARNING]


def test_a_dry_run_carries_the_contract_warnings(client):
    advertise(client, "n1", cap("board"))

    body = client.post("/v1/runs/dry-run", json=contract("r1", lease={"ttl": "9h"})).get_json()

    assert body["warnings"] == [LEASE_BLOCK_WARNING]


def test_a_dry_run_does_not_count_a_node_whose_advert_expired(client, sql):
    advertise(client, "n1", cap("board"))
    sql.execute("update nodes set expires_at = now() - interval '1 second'")

    resp = client.post("/v1/runs/dry-run", json=contract("r1"))

    assert resp.status_code == 422 and resp.get_json() == error_body(
        422, "need 1, fleet has 0 - board"
    )


# ----------------------------------------------------------- the request log (docs/metrics.md#logs)


@pytest.mark.parametrize("config_overrides", [{"log.level": "info"}])
def test_the_request_log_of_a_submit_names_the_submitted_run_and_the_status(client):
    advertise(client, "n1", cap())

    with structlog.testing.capture_logs() as logs:
        submit(client, contract("r1", role("dut")), 201)

    requests = [e for e in logs if e["event"] == "request"]
    assert len(requests) == 1, logs
    assert requests[0]["run_id"] == "r1"
    assert requests[0]["status"] == 201
    assert requests[0]["route"] == "/v1/runs" and requests[0]["method"] == "POST"
