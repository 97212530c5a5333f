"""Reading rows the way an operator would (plain SQL over the ``sql`` connection), and moving the
database's timestamps to simulate time passing: the reaper reads only ``now()`` of the database,
so these tests never sleep and never mock a clock."""

from __future__ import annotations

from typing import Any

from tests.helpers import advertise, cap, contract, one, role, scalar, submit

LEASE_EXPIRED = "lease expired: renewal stopped"


def run_row(sql: Any, run_id: str) -> dict[str, Any]:
    return one(sql, "select * from runs where run_id = %s", run_id)


def steps(sql: Any, run_id: str) -> list[tuple[int, str, str | None]]:
    return [
        tuple(r)
        for r in sql.execute(
            "select seq, state, error from steps where run_id = %s order by seq", (run_id,)
        ).fetchall()
    ]


def leases(sql: Any) -> list[tuple[str, str]]:
    """(node_id, run_id) of every lease, by node."""
    return [tuple(r) for r in sql.execute("select node_id, run_id from leases order by node_id")]


def events(sql: Any, run_id: str, cause: str) -> int:
    return scalar(
        sql, "select count(*) from run_events where run_id = %s and cause = %s", run_id, cause
    )


def expire_leases(sql: Any, run_id: str, ago: str = "1 s") -> None:
    sql.execute(
        "update leases set not_after = now() - %s::interval where run_id = %s", (ago, run_id)
    )


def running_on_n1_and_one_queued(client: Any, *, queued: dict[str, Any] | None = None) -> None:
    """Node n1 (a board); run-a RUNNING on it; run-b QUEUED behind it (202)."""
    advertise(client, "n1", cap("board"))
    assert submit(client, contract("run-a"), 201).get_json()["state"] == "RUNNING"
    doc = queued or contract("run-b")
    assert submit(client, doc, 202).get_json()["state"] == "QUEUED"


def ask_contract(run_id: str, **ask: Any) -> dict[str, Any]:
    """An ask raised at creation (needs nothing), then a board step after it."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {
                "id": "approve",
                "ask": {"prompt": "Looks right?", **ask},
                "out": ["decision"],
                "schema": {
                    "decision": {
                        "type": "object",
                        "properties": {"verdict": {"enum": ["approve", "reject"]}},
                    }
                },
            },
            {"id": "flash", "uses": "dut", "run": ["flash-image"]},
        ],
    )
