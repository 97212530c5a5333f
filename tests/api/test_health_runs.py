"""Health runs (docs/operators.md, "Health runs"): with a health check configured, the reaper
queues one for each quarantined live node that fits it; it runs on that node alone, whatever its
quarantine; its success lifts the quarantine and promotes what waited, in the same request; a
failure keeps it until the next is due; a lift by hand cancels it; and an agent's error is a
strike only on a node the check fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.healthcheck import health_run_id
from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, report
from tests.support.contracts import one_step

one_app_per_module = True

CHECK = {
    "run_id": "health-check",
    "requires": [{"as": "dut", "capability": "board"}],
    "steps": [{"id": "selftest", "uses": "dut", "run": ["selftest"]}],
}


@pytest.fixture(scope="module")
def module_config(tmp_path_factory: Any) -> dict[str, Any]:
    path = Path(tmp_path_factory.mktemp("health")) / "check.json"
    path.write_text(json.dumps(CHECK))
    return {
        "health.check_contract": str(path),
        "health.failures_in_a_row": 2,
        "queue.reserve_after_seconds": 0,
    }


def state(sql: Any, run_id: str) -> str | None:
    row = sql.execute("select state from runs where run_id = %s", (run_id,)).fetchone()
    return row[0] if row else None


def health(client: Any, node_id: str) -> dict[str, Any]:
    nodes = client.get("/v1/nodes").get_json()["nodes"]
    line: dict[str, Any] = next(n for n in nodes if n["node_id"] == node_id)["health"]
    return line


def quarantine(client: Any, node_id: str) -> None:
    resp = client.post(f"/v1/nodes/{node_id}/quarantine", json={"reason": "smoke"})
    assert resp.status_code == 200, resp.get_json()


def test_the_health_run_lifts_the_quarantine_and_promotes_the_waiting_run(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    quarantine(client, "n1")
    client.post("/v1/runs", json=one_step("busy-n2"))  # n2 is taken
    assert client.post("/v1/runs", json=one_step("waiting")).status_code == 202
    reap_pass(ctx)
    first = health_run_id("n1", 1)
    row = sql.execute(
        "select state, principal, team, priority, pinned_node from runs where run_id = %s",
        (first,),
    ).fetchone()
    # Placed at once by the reaper's wake, on its quarantined node, ahead of the older run.
    assert row == ("RUNNING", "mediator", "health", 100, "n1")
    step = claimed(client, "n1")
    assert step["run_id"] == first
    assert done(client, first, 1, "n1")["run_state"] == "SUCCEEDED"
    # Lifted in its verdict's transaction, and the waiting run placed by the same request.
    assert health(client, "n1") == {"state": "ok", "strikes": 0}
    assert state(sql, "waiting") == "RUNNING"
    events = [c for (c,) in sql.execute("select change from node_events order by id")]
    assert events == ["quarantined", "health run queued", "quarantine lifted"]


def test_a_health_run_never_goes_to_another_node(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))  # free, and fits the check
    quarantine(client, "n1")
    advertise(client, "n1", cap("board"), policy={"drain": "graceful"})  # and it drains
    reap_pass(ctx)
    first = health_run_id("n1", 1)
    assert state(sql, first) == "QUEUED"
    assert sql.execute("select count(*) from leases").fetchone() == (0,)
    advertise(client, "n1", cap("board"))  # the drain lifted: the health run takes n1
    assert sql.execute("select node_id from leases where run_id = %s", (first,)).fetchall() == [
        ("n1",)
    ]


def test_a_failed_health_run_keeps_the_quarantine_until_the_next_is_due(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    quarantine(client, "n1")
    reap_pass(ctx)
    first = health_run_id("n1", 1)
    claimed(client, "n1")
    report(client, first, 1, "n1", exit_code=None, error="selftest: no serial console")
    assert state(sql, first) == "FAILED"
    assert health(client, "n1")["state"] == "quarantined"
    reap_pass(ctx)  # not due yet: health.recheck_seconds (3600) after it ended
    assert state(sql, health_run_id("n1", 2)) is None
    sql.execute("update runs set ended_at = now() - interval '2 hours' where run_id = %s", (first,))
    reap_pass(ctx)
    assert state(sql, health_run_id("n1", 2)) == "RUNNING"


def test_a_lift_by_hand_cancels_the_open_health_run(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    quarantine(client, "n1")
    reap_pass(ctx)
    first = health_run_id("n1", 1)
    assert state(sql, first) == "RUNNING"
    resp = client.delete("/v1/nodes/n1/quarantine")
    assert resp.status_code == 200 and resp.get_json()["health"]["state"] == "ok"
    assert state(sql, first) == "FAILED"
    assert sql.execute("select count(*) from leases").fetchone() == (0,)


def test_an_agent_error_is_a_strike_only_on_a_node_the_check_fits(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    for i, (node, capability) in enumerate([("n1", "board"), ("s1", "scope")]):
        client.post("/v1/runs", json=one_step(f"e{i}", capability=capability))
        claimed(client, node)
        report(client, f"e{i}", 1, node, exit_code=None, error="agent: lost the serial console")
    assert health(client, "n1")["strikes"] == 1
    assert health(client, "s1")["strikes"] == 0
