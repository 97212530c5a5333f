from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract, role
from tests.support.submitter import state_of, submit


def test_a_run_queued_behind_a_busy_node_is_running_after_the_cancel_that_frees_it(client):
    advertise(client, "n1", cap("board", soc="imx8mp"))
    first = submit(client, contract("r1", role("dut", soc="imx8mp")), 201).get_json()
    assert first["state"] == "RUNNING"
    second = submit(client, contract("r2", role("dut", soc="imx8mp")), 202).get_json()
    assert second["state"] == "QUEUED"
    assert second["queue"] == {"position": 1, "ahead": 0}
    assert second["requires"][0]["held_by"] == ["r1"]
    resp = client.post("/v1/runs/r1/cancel")
    assert resp.status_code == 200 and resp.get_json() == {"run_id": "r1", "state": "FAILED"}
    assert state_of(client, "r2") == "RUNNING"
