"""The fleet's size costs nothing per request (docs/design.md#targets): a submit's and a dry-run's
candidate read touches as many rows at 20,000 live nodes as at 2,000, and no plan reads ``nodes``
by a sequential scan. Each read statement the request sends is replayed under ``EXPLAIN
(ANALYZE)`` (tests/support/reads.py).

Two contracts: one that every node of the fleet fits (the read walks ``ix_nodes_order`` in
candidate order and stops at its limit), and one naming a single board by an attribute only it
has (the read looks it up in ``ix_nodes_capabilities``). The fleet is grown by SQL from nodes the
Mediator stored, then analysed, as the reaper's statistics upkeep would after a bulk change."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import connect
from tests.support.contracts import contract, role
from tests.support.reads import SLACK, reads_sent, touched
from tests.support.submitter import submit


def grow_fleet(sql: Any, upto: int) -> None:
    """Live boards ``f-<n>`` up to ``upto`` in all, each with ``kind=x`` and its own ``n``."""
    sql.execute(
        "insert into nodes (node_id, label, capabilities, attr_count, expires_at)"
        " select 'f-' || g, null, jsonb_build_array(jsonb_build_object("
        "   'capability', 'board', 'attrs', jsonb_build_object('kind', 'x', 'n', g::text))),"
        "   2, now() + interval '1 hour'"
        " from generate_series(1, %s) as g on conflict (node_id) do nothing",
        (upto,),
    )
    sql.execute("analyze nodes")


def seq_scans_of_nodes(plan: dict[str, Any]) -> int:
    here = int(plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") == "nodes")
    return here + sum(seq_scans_of_nodes(p) for p in plan.get("Plans", []))


def plans_of(app: Any, sent: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    engine = app.extensions["mediator"].db.engine
    with engine.connect() as conn:
        out = []
        for statement, parameters in sent:
            explained = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)
            value = explained.scalar_one()
            out.append((value if isinstance(value, list) else json.loads(value))[0]["Plan"])
        conn.rollback()
    return out


def measure(app: Any, client: Any, tag: str) -> dict[str, tuple[list[tuple[str, int]], int]]:
    """Per request: the rows each read touched, and the sequential scans of ``nodes`` in the
    reads' plans."""
    requests = {
        "dry-run, any node fits": lambda: client.post(
            "/v1/runs/dry-run", json=contract(f"dry-any-{tag}", role("dut", kind="x"))
        ),
        "dry-run, one board": lambda: client.post(
            "/v1/runs/dry-run", json=contract(f"dry-one-{tag}", role("dut", n="1234"))
        ),
        "submit, any node fits": lambda: submit(
            client, contract(f"any-{tag}", role("dut", kind="x")), 201
        ),
        "submit, one board": lambda: submit(
            client, contract(f"one-{tag}", role("dut", n=f"{1500 + len(tag)}")), 201
        ),
    }
    out = {}
    for name, request in requests.items():
        replies: list[Any] = []
        sent = reads_sent(app, lambda r=request, out=replies: out.append(r()))  # type: ignore[misc]
        assert replies[0].status_code in (200, 201), (name, replies[0].get_json())
        out[name] = (touched(app, sent), sum(seq_scans_of_nodes(p) for p in plans_of(app, sent)))
    return out


@pytest.mark.timeout(300)
def test_a_submit_and_a_dry_run_read_no_more_rows_at_20000_nodes_than_at_2000(
    fresh_db_url, tmp_path
):
    with app_on(fresh_db_url, tmp_path / "r") as app:
        client = client_of(app)
        advertise(client, "b1", cap(kind="y"))  # a node of the Mediator's own writing
        with connect(fresh_db_url) as sql:
            grow_fleet(sql, 2_000)
            small = measure(app, client, "2k")
            grow_fleet(sql, 20_000)
            large = measure(app, client, "20k")
    for name, (reads, scans) in large.items():
        assert scans == 0, f"{name}: a sequential scan of nodes at 20,000 nodes"
        before = sum(rows for _, rows in small[name][0])
        after = sum(rows for _, rows in reads)
        assert after <= before + SLACK, f"{name}: {after} rows at 20,000 nodes, {before} at 2,000"
        assert after <= 40, f"{name}: {after} rows touched for one node: {reads}"
