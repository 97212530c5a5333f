"""The width cap and one node filling several roles
(docs/contract.md#requirements-and-how-runs-are-placed): under ``lease.max_per_run`` a run whose
first choice of nodes is too wide is placed on an assignment that reuses a node, if the matcher's
bounded search finds one, at submit as at dry-run; a run that no reuse can fit is refused as
before."""

from __future__ import annotations

import pytest

from tests.support.actors import Node, Submitter, cap
from tests.support.contracts import contract, role
from tests.support.rows import leases, run_row

pytestmark = pytest.mark.config({"lease.max_per_run": 1})

WIDTH_REASON = "requires exceeds the width limit: 2 nodes, limit 1"


def a_and_r(client) -> None:
    """ "a" fills x only and comes first in candidate order; "r" fills x and y."""
    Node(client, "a").advertise(cap("x"), label="Plain")
    Node(client, "r").advertise(cap("x"), cap("y"), label="Rig")


def assigned(body) -> list[tuple[str, list[tuple[str, str | None]]]]:
    return [(a["as"], [(n["node"], n["label"]) for n in a["nodes"]]) for a in body["assigned"]]


def test_a_submit_that_fits_the_cap_only_by_reuse_is_placed_on_the_node_filling_both_roles(
    client, sql
):
    a_and_r(client)

    body = Submitter(client).submitted(contract("both", role("x", "x"), role("y", "y")), 201)

    assert body["state"] == "RUNNING"
    assert assigned(body) == [("x", [("r", "Rig")]), ("y", [("r", "Rig")])]
    assert leases(sql) == [("r", "both")]
    steps = sql.execute("select step_id, node_id from steps where run_id = 'both' order by seq")
    assert [tuple(row) for row in steps] == [("use-x", "r"), ("use-y", "r")]


def test_a_dry_run_that_fits_the_cap_only_by_reuse_answers_the_same_assignment(client, sql):
    a_and_r(client)

    doc = contract("try", role("x", "x"), role("y", "y"))

    resp = client.post("/v1/runs/dry-run", json=doc)  # no actor sends a dry-run

    assert resp.status_code == 200
    assert assigned(resp.get_json()) == [("x", [("r", "Rig")]), ("y", [("r", "Rig")])]
    assert leases(sql) == []


def test_a_submit_that_no_reuse_can_fit_is_still_refused_422_and_stored_failed(client, sql):
    Node(client, "a").advertise(cap("x"))
    Node(client, "b").advertise(cap("y"))

    resp = Submitter(client).submit(contract("wide", role("x", "x"), role("y", "y")), 422)

    assert resp.get_json() == {"error": {"code": 422, "reason": WIDTH_REASON}}
    row = run_row(sql, "wide")
    assert row["state"] == "FAILED" and row["reject"]["Reason"] == WIDTH_REASON
    assert leases(sql) == []
