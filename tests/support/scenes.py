"""Starting pictures built through the API by a node agent's and a submitter's requests
(tests/support/agent.py, tests/support/submitter.py), with plain SQL where a picture needs what no
request leaves: a fleet in every state the status page shows, a run queued behind a freed scope,
a run running with another queued behind it, a run finished with its Record sealed, a run
rejected."""

from __future__ import annotations

from typing import Any

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, put_blob, report
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


def placed_on_n1(client: Any, *steps: dict[str, Any]) -> None:
    """r1 RUNNING on n1 with ``steps`` (default: one run step producing result.json)."""
    advertise(client, "n1", cap("board"))
    body = list(steps) or [{"id": "work", "uses": "dut", "run": ["x"], "out": ["result.json"]}]
    submit(client, contract("r1", role("dut"), steps=body), 201)


def holder_and_waiter(client: Any) -> None:
    """n1 held by ``holder``; ``waiter`` QUEUED behind it."""
    advertise(client, "n1", cap("board"))
    submit(client, contract("holder"), 201)
    submit(client, contract("waiter"), 202)


def running_on_n1_and_one_queued(client: Any, *, queued: dict[str, Any] | None = None) -> None:
    """Node n1 (a board); run-a RUNNING on it; run-b QUEUED behind it (202)."""
    advertise(client, "n1", cap("board"))
    assert submit(client, contract("run-a"), 201).get_json()["state"] == "RUNNING"
    doc = queued or contract("run-b")
    assert submit(client, doc, 202).get_json()["state"] == "QUEUED"


def finished_run(client: Any, run_id: str, node: str = "n1", *, work: str | None = None) -> None:
    """``run_id`` on ``node`` (a board, advertised here): one step that logs, uploads a blob and
    succeeds; the run ends SUCCEEDED and its Record is sealed."""
    advertise(client, node, cap("board", serial=node))
    top: dict[str, Any] = {}
    if work:  # work key gerrit:<work>; the ledger then shows earlier runs of the work
        top = {"work": {"system": "gerrit", "change_id": work}, "ledger": {"scope": "work"}}
    doc = contract(
        run_id,
        role("dut", serial=node),
        steps=[{"id": "boot", "uses": "dut", "run": ["boot"], "out": ["result.json"]}],
        **top,
    )
    submit(client, doc, 201)
    step = claimed(client, node)
    assert (step["run_id"], step["seq"]) == (run_id, 1)
    assert client.put(f"/v1/runs/{run_id}/steps/1/log", data=b"booted\n").status_code == 200
    assert put_blob(client, run_id, 1, "result.json", b'{"ok": true}') == 204
    assert done(client, run_id, 1, node, produced=["result.json"])["run_state"] == "SUCCEEDED"


def rejected_run(client: Any, run_id: str) -> None:
    """A submit no node of the fleet could ever take: 422, stored FAILED with its reject."""
    submit(client, contract(run_id, role("dut", "no-such-capability")), 422)
