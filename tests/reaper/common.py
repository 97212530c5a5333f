"""Pieces of the reaper's tests: moving the database's timestamps to simulate time passing (the
reaper reads only ``now()`` of the database, so these tests never sleep and never mock a clock),
and the runs they start from."""

from __future__ import annotations

from typing import Any

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract, role
from tests.support.submitter import submit

LEASE_EXPIRED = "lease expired: renewal stopped"


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
