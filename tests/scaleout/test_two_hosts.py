"""One run across two hosts (docs/scaling.md#what-must-be-shared,
docs/scaling.md#hosts-behind-nginx): submitted through A, promoted by a cancel on B, claimed, logged
and uploaded through B, its end committed on B by a worker that then dies (no verdict, no seal),
sealed by A's reaper; its Record downloaded from both hosts byte for byte the same."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from app.config import to_libpq_url
from tests.scaleout.hosts import reaper_once, store_keys, two_hosts
from tests.support.actors import cap
from tests.support.apps import LiveServer
from tests.support.contracts import contract, role
from tests.support.record_contents import tar_files
from tests.support.s3 import bucket_keys

pytestmark = pytest.mark.slow

ALICE = {"X-Enode-Principal": "alice@example.com"}


def put(host: LiveServer, path: str, data: bytes) -> requests.Response:
    return requests.put(host.url + path, data=data, headers=host.headers(), timeout=30)


def scalar(db_url: str, query: str) -> Any:
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        row = conn.execute(query).fetchone()
        return None if row is None else row[0]


def test_a_run_moves_between_two_hosts_and_its_record_is_the_same_from_both(
    fresh_db_url: str, tmp_path: Path
) -> None:
    keys = store_keys()
    fault_file = tmp_path / "died"
    env = {
        "MEDIATOR_LEASE_NOT_AFTER_FACTOR": "60",  # no lease expires while the test runs
        "MEDIATOR_FAULT_B": f"result.after_commit@{fault_file}",
    }
    with two_hosts(fresh_db_url, tmp_path, keys, **env) as (a, b):
        board = {"node_id": "n1", "instance": "i1", "capabilities": [cap("board")]}
        assert a.post("/v1/nodes", json=board).status_code == 200
        steps = [{"id": "boot", "uses": "dut", "run": ["boot"], "out": ["result.json"]}]
        blocker = contract("blocker", role("dut"), steps=steps)
        assert a.post("/v1/runs", json=blocker).status_code == 201
        run = contract("r1", role("dut"), steps=steps)
        run["success_when"] = [{"step": "boot", "exit_code": 0, "produced": ["result.json"]}]
        assert a.post("/v1/runs", json=run).status_code == 202  # QUEUED behind the blocker

        # A cancel on B promotes r1 in the same request.
        assert b.post("/v1/runs/blocker/cancel", headers=ALICE).status_code == 200
        assert a.get("/v1/runs/r1").json()["state"] == "RUNNING"

        claim = b.post("/v1/nodes/n1/claim?wait=0", headers={"X-Enode-Instance": "i1"})
        assert claim.status_code == 200 and claim.json()["run_id"] == "r1"
        lengths = [
            put(b, "/v1/runs/r1/steps/1/log", b"booting\n"),
            put(a, "/v1/runs/r1/steps/1/log", b"through A\n"),
            put(b, "/v1/runs/r1/steps/1/log", b"up\n"),
        ]
        assert [r.headers["X-Enode-Log-Bytes"] for r in lengths] == ["8", "18", "21"]
        big = os.urandom(3 << 20)
        assert put(b, "/v1/runs/r1/steps/1/blob/result.json", b'{"ok": true}').status_code == 204
        assert put(b, "/v1/runs/r1/steps/1/blob/image.bin", big).status_code == 204
        assert a.get("/v1/runs/r1/blob/image.bin").content == big
        assert a.get("/v1/runs/r1/steps/1/log?from=0").content == b"booting\nthrough A\nup\n"

        # B commits the result, then its worker dies before the verdict and the seal.
        result = {"node": "n1", "exit_code": 0, "produced": ["result.json"]}
        with pytest.raises(requests.ConnectionError):
            b.post("/v1/runs/r1/steps/1/result", json=result)
        assert fault_file.exists()
        assert scalar(fresh_db_url, "select sealed_at from runs where run_id = 'r1'") is None
        assert a.get("/v1/runs/r1/record").status_code == 409

        done = reaper_once(a)  # A's reaper: the verdict of r1, then the seal of its Record
        assert done.returncode == 0, done.stderr
        assert "verdicts=1" in done.stdout, done.stdout
        assert scalar(fresh_db_url, "select state from runs where run_id = 'r1'") == "SUCCEEDED"
        assert scalar(fresh_db_url, "select sealed_at from runs where run_id = 'r1'") is not None
        again = reaper_once(b)  # B's reaper finds nothing left to judge or seal
        assert again.returncode == 0, again.stderr
        assert "verdicts=0" in again.stdout and "sealed=0" in again.stdout, again.stdout

        from_a = a.get("/v1/runs/r1/record")
        from_b = b.get("/v1/runs/r1/record")
        assert from_a.status_code == from_b.status_code == 200
        assert from_a.content == from_b.content
        files = tar_files(from_a.content)
        assert files["run-r1/logs/01-step.log"] == b"booting\nthrough A\nup\n"
        assert files["run-r1/blobs/01.0-image.bin"] == big
        for line in files["run-r1/SHA256SUMS"].decode().splitlines():
            digest, rel = line.split("  ", 1)
            assert hashlib.sha256(files[f"run-r1/{rel}"]).hexdigest() == digest
        blocker_tar = b.get("/v1/runs/blocker/record")  # sealed by B's cancel
        assert blocker_tar.status_code == 200
        assert blocker_tar.content == a.get("/v1/runs/blocker/record").content

    # Nothing of a Record in either host's own directory: the bucket holds them all.
    assert not list((tmp_path / "a" / "records").rglob("*.json"))
    assert not list((tmp_path / "b" / "records").rglob("*.json"))
    stored = bucket_keys(keys["records.s3.endpoint_url"], keys["records.s3.bucket"])
    assert "records/r1/.sealed" in stored and "records/blocker/.sealed" in stored
