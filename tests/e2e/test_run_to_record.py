import io
import tarfile

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import role
from tests.support.submitter import submit


def test_a_two_step_run_goes_from_submit_to_a_sealed_record(client, sql):
    advertise(client, "board-1", cap("board", soc="imx8mp"), instance="i1")
    advertise(client, "host-1", cap("agent.reason"), instance="h1")
    doc = {
        "run_id": "kernel-1",
        "requires": [role("dut", soc="imx8mp"), role("host", "agent.reason")],
        "steps": [
            {"id": "flash", "uses": "host", "run": ["flash-image"], "out": ["flash.log"]},
            {
                "id": "boot",
                "uses": "dut",
                "run": ["boot-test"],
                "out": ["result.json"],
                "schema": {"result.json": {"type": "object", "required": ["ok"]}},
            },
        ],
        "success_when": [{"step": "boot", "exit_code": 0, "produced": ["result.json"]}],
    }
    assert submit(client, doc, 201).get_json()["state"] == "RUNNING"
    # boot needs flash: the board has nothing to claim yet.
    resp = client.post("/v1/nodes/board-1/claim?wait=0", headers={"X-Enode-Instance": "i1"})
    assert resp.status_code == 204
    resp = client.post("/v1/nodes/host-1/claim?wait=0", headers={"X-Enode-Instance": "h1"})
    assert resp.status_code == 200
    body = resp.get_json()
    assert (
        body["step_id"] == "kernel-1#01"
        and body["name"] == "flash"
        and body["run"] == ["flash-image"]
    )
    assert body["lease"]["node"] == "host-1" and len(body["lease"]["nonce"]) == 32
    resp = client.put("/v1/runs/kernel-1/steps/1/log", data=b"flashing\n")
    assert resp.status_code == 200 and resp.headers["X-Enode-Log-Bytes"] == "9"
    resp = client.post(
        "/v1/runs/kernel-1/steps/1/result",
        json={"node": "host-1", "exit_code": 0, "produced": [], "nonce": body["lease"]["nonce"]},
    )
    assert resp.status_code == 200 and resp.get_json() == {
        "run_id": "kernel-1",
        "seq": 1,
        "run_state": "",
    }
    resp = client.post("/v1/nodes/board-1/claim?wait=0", headers={"X-Enode-Instance": "i1"})
    assert resp.status_code == 200 and resp.get_json()["name"] == "boot"
    bad = client.put("/v1/runs/kernel-1/steps/2/blob/result.json", data=b'{"nope": 1}')
    assert bad.status_code == 422 and bad.get_json()["error"]["reason"].startswith(
        "schema violation"
    )
    ok = client.put("/v1/runs/kernel-1/steps/2/blob/result.json", data=b'{"ok": true}')
    assert ok.status_code == 204
    resp = client.post(
        "/v1/runs/kernel-1/steps/2/result",
        json={"node": "board-1", "exit_code": 0, "produced": ["result.json"]},
    )
    assert resp.status_code == 200 and resp.get_json()["run_state"] == "SUCCEEDED"
    view = client.get("/v1/runs/kernel-1").get_json()
    assert view["state"] == "SUCCEEDED"
    assert [c["ok"] for c in view["verdict"]["checks"]] == [True, True]
    assert sql.execute("select count(*) from leases").fetchone() == (0,)
    dup = client.post("/v1/runs/kernel-1/steps/2/result", json={"node": "board-1", "exit_code": 0})
    assert dup.status_code == 409
    assert dup.get_json()["error"]["reason"] == "reported a step that was not claimed (kernel-1#02)"
    assert client.put("/v1/runs/kernel-1/steps/1/log", data=b"late").status_code == 410
    resp = client.get("/v1/runs/kernel-1/record")
    assert resp.status_code == 200 and resp.mimetype == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(resp.data)) as tar:
        names = set(tar.getnames())
        assert {
            "run-kernel-1/verdict.json",
            "run-kernel-1/SHA256SUMS",
            "run-kernel-1/manifest.json",
        } <= names
        assert tar.extractfile("run-kernel-1/blobs/02.0-result.json").read() == b'{"ok": true}'
        assert tar.extractfile("run-kernel-1/logs/01-step.log").read() == b"flashing\n"
    ledger = client.get("/v1/runs/kernel-1/ledger").get_json()["entries"]
    assert [(e["seq"], e["name"], e["bytes"], e.get("schema_ok")) for e in ledger] == [
        (2, "result.json", 12, True)
    ]
