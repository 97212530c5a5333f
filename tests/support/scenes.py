"""Starting pictures built through the API by a node agent's and a submitter's requests
(tests/support/agent.py, tests/support/submitter.py), with plain SQL where a picture needs what no
request leaves: a fleet in every state the status page shows, a run queued behind a freed scope.
"""

from __future__ import annotations

from typing import Any

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, report
from tests.support.contracts import contract, one_step, role
from tests.support.rows import run_row
from tests.support.submitter import submit

DECISION = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}


def build_fleet(
    client: Any,
    *,
    label: str = "Board in rack 3",
    principal: str = "ana@lab.test",
    prompt: str = "Does the board boot?",
) -> None:
    """A finished run, runs running on nodes (one with an open ask), runs queued behind busy
    nodes and one for which no live node matches, a draining node."""
    advertise(client, "board-1", cap("board", soc="imx8mp"), label=label)
    advertise(client, "board-2", cap("board", soc="imx8mp"))
    advertise(client, "scope-1", cap("scope"), policy={"drain": "graceful"})

    # Finished: ran on board-1 and succeeded; a second one failed its step.
    submit(client, one_step("done-ok"), 201, principal)
    step = claimed(client, "board-1")
    assert step["run_id"] == "done-ok"
    assert done(client, "done-ok", step["seq"], "board-1")["run_state"] == "SUCCEEDED"
    submit(
        client, {**one_step("done-bad"), "success_when": [{"step": "work", "exit_code": 0}]}, 201
    )
    step = claimed(client, "board-1")
    assert step["run_id"] == "done-bad"
    resp = report(client, "done-bad", step["seq"], "board-1", exit_code=1)
    assert resp.status_code == 200, resp.get_json()

    # Running: flash on board-1 (claimed), and an ask open on board-2's run.
    doc = contract(
        "run-flash",
        role("dut", soc="imx8mp"),
        steps=[
            {"id": "flash", "uses": "dut", "run": ["flash"]},
            {"id": "boot", "uses": "dut", "run": ["boot"]},
        ],
    )
    submit(client, doc, 201, principal)
    step = claimed(client, "board-1")
    assert (step["run_id"], step["name"]) == ("run-flash", "flash")
    asking = contract(
        "run-asks",
        role("dut", soc="imx8mp"),
        steps=[
            {
                "id": "sign-off",
                "ask": {"prompt": prompt},
                "out": ["decision"],
                "schema": {"decision": DECISION},
            },
            {"id": "boot", "uses": "dut", "run": ["boot"], "needs": ["sign-off"]},
        ],
    )
    submit(client, asking, 201)

    # Queued: two behind the busy boards, one for a scope (the only one is draining).
    submit(client, one_step("wait-1"), 202, principal)
    submit(client, one_step("wait-2"), 202)
    submit(client, one_step("wait-scope", capability="scope"), 202)


def queued_behind_a_freed_scope(client: Any, sql: Any) -> None:
    """Node x1 (a scope) held by run ``holder``; run ``waiter`` QUEUED for a scope; then the
    holder's lease is deleted by raw SQL, so x1 is free but no wake has looked yet."""
    advertise(client, "x1", cap("scope"))
    submit(client, one_step("holder", "probe", "scope"), 201)
    submit(client, one_step("waiter", "probe", "scope"), 202)
    sql.execute("delete from leases where run_id = 'holder'")
    assert run_row(sql, "waiter")["state"] == "QUEUED"
