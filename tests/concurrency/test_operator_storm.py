"""One lock order with operators about (docs/queue.md, "Lock order"; docs/operators.md): two apps
on one database, node threads advertising (now and then as a new instance, a restart that
strikes), claiming and reporting (some agent errors), a submitter, and an operator holding,
resuming, quarantining and lifting the same nodes, all at once. Afterwards every invariant holds
and PostgreSQL counted no deadlock."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import client_of
from tests.support.concurrency import JOIN_TIMEOUT, apps_on, connect, deadlocks, race
from tests.support.contracts import one_step
from tests.support.invariants import check_settled

NODES = [f"b{i}" for i in range(4)]
ROUNDS = 15  # per thread: a bound by count, not by time
CHECK = {
    "run_id": "health-check",
    "requires": [{"as": "dut", "capability": "board"}],
    "steps": [{"id": "selftest", "uses": "dut", "run": ["selftest"]}],
}


def test_heartbeats_strikes_drains_and_lifts_at_once_never_deadlock(fresh_db_url, tmp_path):
    check = Path(tmp_path) / "check.json"
    check.write_text(json.dumps(CHECK))
    keys = {
        "health.failures_in_a_row": 2,
        "health.check_contract": str(check),
        "queue.reserve_after_seconds": 0,
    }
    with apps_on(fresh_db_url, tmp_path / "r", n=2, **keys) as apps, connect(fresh_db_url) as sql:
        for node in NODES:
            advertise(apps.client(0), node, cap("board"), instance="life-0")
        ids = itertools.count()

        def node_thread(i: int) -> None:
            client = client_of(apps[i % 2])
            node = NODES[i]
            rng = random.Random(i)
            life = 0
            for _ in range(ROUNDS):
                if rng.random() < 0.15:
                    life += 1  # the agent restarted: a step it held fails, a strike
                advertise(client, node, cap("board"), instance=f"life-{life}")
                resp = client.post(f"/v1/nodes/{node}/claim?wait=0", json={})
                if resp.status_code != 200:
                    continue
                step = resp.get_json()
                body: dict[str, Any] = {"node": node, "exit_code": 0}
                if rng.random() < 0.3:
                    body = {"node": node, "error": "agent: lost the console"}
                client.post(
                    f"/v1/runs/{step['run_id']}/steps/{step['seq']}/result",
                    json={**body, "nonce": step.get("nonce")},
                    headers={"X-Enode-Instance": f"life-{life}"},
                )

        def submitter() -> None:
            client = client_of(apps[0])
            for _ in range(ROUNDS * 2):
                resp = client.post("/v1/runs", json=one_step(f"s{next(ids)}"))
                assert resp.status_code in (201, 202), resp.get_json()

        def operator() -> None:
            client = client_of(apps[1])
            rng = random.Random(99)
            for _ in range(ROUNDS * 2):
                node = rng.choice(NODES)
                action = rng.choice(["hold", "hold-now", "resume", "quarantine", "lift"])
                if action == "hold":
                    resp = client.post(
                        f"/v1/nodes/{node}/drain", json={"mode": "graceful", "reason": "storm"}
                    )
                elif action == "hold-now":
                    resp = client.post(
                        f"/v1/nodes/{node}/drain", json={"mode": "at-boundary", "reason": "storm"}
                    )
                elif action == "resume":
                    resp = client.delete(f"/v1/nodes/{node}/drain")
                elif action == "quarantine":
                    resp = client.post(f"/v1/nodes/{node}/quarantine", json={"reason": "storm"})
                else:
                    resp = client.delete(f"/v1/nodes/{node}/quarantine")
                assert resp.status_code == 200, resp.get_json()

        race(
            *(lambda i=i: node_thread(i) for i in range(len(NODES))),
            submitter,
            operator,
            timeout=JOIN_TIMEOUT * 4,
        )
        # Quiet: every hold and quarantine lifted, the nodes advertise once more, two passes.
        admin = apps.client(0)
        for node in NODES:
            assert admin.delete(f"/v1/nodes/{node}/drain").status_code == 200
            assert admin.delete(f"/v1/nodes/{node}/quarantine").status_code == 200
            advertise(admin, node, cap("board"), instance="life-final")
        reap_pass(apps.ctx(0))
        reap_pass(apps.ctx(1))
        assert check_settled(sql) == []
        (events,) = sql.execute("select count(*) from node_events").fetchone()
        assert events > 0
    assert deadlocks(fresh_db_url) == 0


def test_two_apps_agree_on_a_hold_and_a_quarantine(fresh_db_url, tmp_path):
    with apps_on(fresh_db_url, tmp_path / "r", n=2) as apps, connect(fresh_db_url) as sql:
        one, two = apps.client(0), apps.client(1)
        advertise(one, "b0", cap("board"))
        assert (
            one.post("/v1/nodes/b0/drain", json={"mode": "graceful", "reason": "x"}).status_code
            == 200
        )
        assert two.post("/v1/runs", json=one_step("r1")).status_code == 202
        assert two.get("/v1/nodes").get_json()["nodes"][0]["hold"]["reason"] == "x"
        assert two.delete("/v1/nodes/b0/drain").status_code == 200
        (state,) = sql.execute("select state from runs where run_id = 'r1'").fetchone()
        assert state == "RUNNING"
        assert one.post("/v1/nodes/b0/quarantine", json={"reason": "y"}).status_code == 200
        assert two.post("/v1/runs", json=one_step("r2")).status_code == 202
        assert two.delete("/v1/nodes/b0/quarantine").status_code == 200
        assert one.post("/v1/runs/r1/cancel", json={}).status_code == 200
        (state,) = sql.execute("select state from runs where run_id = 'r2'").fetchone()
        assert state == "RUNNING"
