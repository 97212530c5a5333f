"""A node token bound to node ids acts only for them: another node's advert, claim, result, log
or blob is 403 before anything else (where the route would otherwise say 404 or 409), and the
rows and files are as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import records_root
from tests.support.contracts import contract, role
from tests.support.rows import rows, step_row
from tests.support.submitter import submit
from tests.support.tokens import ENTRIES, as_role, forbidden
from tests.support.wire import WORK_STEP, claimed_run, snapshot

one_app_per_module = True


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"tokens": ENTRIES}


def files_of(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def on_n1(app, client, sql):
    """r1 RUNNING on n1 with step 1 CLAIMED by n1; n2 advertised too."""
    claimed_run(client, sql)
    advertise(client, "n2", cap("board"), instance="i2")
    return app


def test_another_nodes_advert_is_403_and_the_node_row_is_untouched(on_n1, sql):
    n2 = as_role(on_n1, "node-n2")
    before = rows(sql, "SELECT * FROM nodes ORDER BY node_id")

    as_n1 = n2.post("/v1/nodes", json={"node_id": "n1", "capabilities": [cap("other")]})
    new_node = n2.post("/v1/nodes", json={"node_id": "n3", "capabilities": [cap("board")]})

    assert forbidden(as_n1) == "token node-n2 may not act for node n1"
    assert forbidden(new_node) == "token node-n2 may not act for node n3"
    assert rows(sql, "SELECT * FROM nodes ORDER BY node_id") == before


def test_another_nodes_claim_is_403_and_no_step_changes(on_n1, sql):
    before = rows(sql, "SELECT * FROM steps ORDER BY run_id, seq")

    resp = as_role(on_n1, "node-n2").post("/v1/nodes/n1/claim?wait=0")

    assert forbidden(resp) == "token node-n2 may not act for node n1"
    assert rows(sql, "SELECT * FROM steps ORDER BY run_id, seq") == before


@pytest.mark.parametrize("reporter", ["n1", "n2"])
def test_a_result_for_another_nodes_step_is_403_and_the_step_stays_claimed(on_n1, sql, reporter):
    resp = as_role(on_n1, "node-n2").post(
        "/v1/runs/r1/steps/1/result", json={"node": reporter, "exit_code": 0, "produced": []}
    )

    assert "may not act for node n1" in forbidden(resp)
    assert step_row(sql, "r1", 1, "state, ended_at") == {"state": "CLAIMED", "ended_at": None}
    assert rows(sql, "SELECT state FROM runs") == [{"state": "RUNNING"}]


def test_a_result_naming_another_node_than_the_token_is_403(on_n1, sql):
    resp = as_role(on_n1, "node-n1").post(
        "/v1/runs/r1/steps/1/result", json={"node": "n2", "exit_code": 0, "produced": []}
    )

    assert forbidden(resp) == "token node-n1 may not act for node n2"
    assert step_row(sql, "r1", 1, "state")["state"] == "CLAIMED"


def test_another_nodes_log_and_blob_are_403_and_nothing_is_written(on_n1, sql):
    n2 = as_role(on_n1, "node-n2")
    before = snapshot(sql, records_root(on_n1))

    log = n2.put("/v1/runs/r1/steps/1/log", data=b"not mine\n")
    progress = n2.put("/v1/runs/r1/steps/1/log?progress=1&attempt=0", data=b"not mine\n")
    blob = n2.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": true}')

    for resp in (log, progress, blob):
        assert forbidden(resp) == "token node-n2 may not act for node n1"
    assert rows(sql, "SELECT * FROM blobs") == []
    assert snapshot(sql, records_root(on_n1)) == before
    assert not any("log" in f or "result.json" in f for f in files_of(records_root(on_n1)))


def test_the_bound_node_does_its_own_work(on_n1, sql):
    n1 = as_role(on_n1, "node-n1")

    assert (
        n1.post("/v1/nodes", json={"node_id": "n1", "capabilities": [cap("board")]}).status_code
        == 200
    )
    assert n1.put("/v1/runs/r1/steps/1/log", data=b"mine\n").status_code == 200
    assert n1.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": true}').status_code == 204
    done = n1.post(
        "/v1/runs/r1/steps/1/result",
        json={"node": "n1", "exit_code": 0, "produced": ["result.json"]},
    )

    assert done.status_code == 200, done.get_json()
    assert step_row(sql, "r1", 1, "state")["state"] == "DONE"
    assert [r["name"] for r in rows(sql, "SELECT name FROM blobs")] == ["result.json"]


def test_a_step_that_does_not_exist_is_403_for_a_bound_token_and_404_for_an_unbound_one(on_n1):
    bound, unbound = as_role(on_n1, "node-n1"), as_role(on_n1, "node")
    for path in ("/v1/runs/r1/steps/9/log", "/v1/runs/nope/steps/1/log"):
        assert "only on steps bound to its nodes" in forbidden(bound.put(path, data=b"x\n"))
        assert unbound.put(path, data=b"x\n").status_code == 404
    result = {"node": "n1", "exit_code": 0, "produced": []}
    assert "only on steps" in forbidden(bound.post("/v1/runs/r1/steps/9/result", json=result))
    assert unbound.post("/v1/runs/r1/steps/9/result", json=result).status_code == 409
    assert "only on steps" in forbidden(bound.put("/v1/runs/r1/steps/zero/blob/x", data=b"x"))


def test_a_step_of_a_queued_run_is_bound_to_no_node_yet(on_n1, client, sql):
    submit(client, contract("r2", role("dut"), steps=[WORK_STEP]), 201)  # on n2, the free one
    submit(client, contract("r3", role("dut"), steps=[WORK_STEP]), 202)  # waits: none is free
    assert step_row(sql, "r3", 1, "node_id")["node_id"] is None

    resp = as_role(on_n1, "node-n1").put("/v1/runs/r3/steps/1/log", data=b"early\n")

    assert "only on steps bound to its nodes" in forbidden(resp)


def test_observation_gets_are_open_to_a_bound_token_for_any_run(on_n1):
    n2 = as_role(on_n1, "node-n2")
    assert n2.get("/v1/runs/r1").status_code == 200
    assert n2.get("/v1/runs/r1/steps/1/log").status_code == 200
    assert n2.get("/v1/runs/r1/blob/result.json").status_code == 404  # none yet: not a 403
