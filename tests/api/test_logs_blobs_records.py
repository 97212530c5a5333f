"""Logs, blobs, Records and the ledger (docs/design.md#records), and names or ids in their URLs that
try to escape the record directory or name nothing (docs/security.md#runs-records-and-uploads)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from app.services.reaper import reap_pass
from app.services.records import seal_run
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.contracts import contract, role
from tests.support.record_contents import blob_files
from tests.support.rows import scalar
from tests.support.submitter import submit

# Above 1 MiB, so a log can be longer than one GET reply; small enough to cross quickly.
MAX_BLOB = 1_200_000
GONE = {"error": {"code": 410, "reason": "run has already finished"}}
NOT_SEALED = {"error": {"code": 409, "reason": "run is not sealed yet"}}
RESULT_SCHEMA = {
    "type": "object",
    "required": ["ok"],
    "properties": {"ok": {"type": "boolean"}},
}


pytestmark = pytest.mark.config({"max_blob_bytes": MAX_BLOB})


# ---------------------------------------------------------------- builders


def boot_contract(run_id: str, **top: Any) -> dict[str, Any]:
    """One board step with a schema'd output and a free-form one."""
    steps = [
        {
            "id": "boot",
            "uses": "dut",
            "run": ["boot-test"],
            "out": ["result.json", "boot.bin"],
            "schema": {"result.json": RESULT_SCHEMA},
        }
    ]
    return contract(
        run_id,
        role("dut"),
        steps=steps,
        success_when=[{"step": "boot", "exit_code": 0, "produced": ["result.json"]}],
        **top,
    )


def placed(client: Any, run_id: str = "r1", node: str = "n1", **top: Any) -> None:
    """A RUNNING run on ``node`` whose boot step is bound to it, not claimed yet: what the tests
    of refusals and reads need. Uploads are taken only from the step that makes them, once its
    node has claimed it (:func:`booting`); a claim starts the process's LISTEN thread, which costs
    a test a second at teardown, so the tests that upload nothing leave it out."""
    advertise(client, node, cap("board"))
    submit(client, boot_contract(run_id, **top), 201)


def booting(client: Any, run_id: str = "r1", node: str = "n1", **top: Any) -> None:
    """A RUNNING run whose boot step is CLAIMED by ``node``."""
    placed(client, run_id, node, **top)
    body = claimed(client, node, f"{node}-i")
    assert (body["run_id"], body["seq"]) == (run_id, 1)


def finished(client: Any, run_id: str = "r1") -> None:
    """A run that logged, stored its result and SUCCEEDED."""
    booting(client, run_id)
    assert client.put(f"/v1/runs/{run_id}/steps/1/log", data=b"booting\nup\n").status_code == 200
    resp = client.put(f"/v1/runs/{run_id}/steps/1/blob/result.json", data=b'{"ok": true}')
    assert resp.status_code == 204
    reply = done(client, run_id, 1, "n1", produced=["result.json"])
    assert reply["run_state"] == "SUCCEEDED"


def put_log(client: Any, data: bytes, run_id: str = "r1", seq: int = 1) -> Any:
    return client.put(f"/v1/runs/{run_id}/steps/{seq}/log", data=data)


def read_whole_log(client: Any, run_id: str = "r1", seq: int = 1) -> bytes:
    out = b""
    while True:
        resp = client.get(f"/v1/runs/{run_id}/steps/{seq}/log?from={len(out)}")
        assert resp.status_code == 200
        if not resp.data:
            return out
        out += resp.data


def blob_rows(sql: Any, run_id: str) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in sql.execute(
            "select seq, attempt, name, bytes from blobs where run_id = %s order by seq, attempt, name",
            (run_id,),
        )
    ]


def tree(root: Path) -> list[str]:
    """Every path below ``root``: writes anywhere show up here."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def record_members(client: Any, run_id: str) -> dict[str, bytes | None]:
    resp = client.get(f"/v1/runs/{run_id}/record")
    assert resp.status_code == 200 and resp.mimetype == "application/x-tar"
    out: dict[str, bytes | None] = {}
    with tarfile.open(fileobj=io.BytesIO(resp.data)) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.isfile() else None
            out[member.name] = f.read() if f else None
    return out


# ---------------------------------------------------------------- logs


def test_a_log_put_appends_and_answers_the_total_length(client):
    booting(client)

    first = put_log(client, b"flashing\n")
    second = put_log(client, b"done\n")

    assert first.status_code == 200 and first.headers["X-Enode-Log-Bytes"] == "9"
    assert second.status_code == 200 and second.headers["X-Enode-Log-Bytes"] == "14"
    assert read_whole_log(client) == b"flashing\ndone\n"


def test_a_log_is_capped_at_max_blob_bytes_then_carries_a_truncation_note(client):
    booting(client)
    head = b"x" * (MAX_BLOB - 10)
    assert put_log(client, head).headers["X-Enode-Log-Bytes"] == str(MAX_BLOB - 10)

    over = put_log(client, b"y" * 30)
    later = put_log(client, b"z" * 30)

    whole = read_whole_log(client)
    assert over.status_code == 200 and over.headers["X-Enode-Log-Bytes"] == str(len(whole))
    assert whole[:MAX_BLOB] == head + b"y" * 10
    note = whole[MAX_BLOB:]
    assert b"truncat" in note and b"y" * 11 not in whole
    # Once cut, nothing more is appended, and the total length stays what it was.
    assert later.status_code == 200 and later.headers["X-Enode-Log-Bytes"] == str(len(whole))
    assert b"z" not in whole


def test_a_log_is_read_from_a_byte_offset(client):
    booting(client)
    put_log(client, b"line one\nline two\n")

    tail = client.get("/v1/runs/r1/steps/1/log?from=9")
    whole = client.get("/v1/runs/r1/steps/1/log")
    end = client.get("/v1/runs/r1/steps/1/log?from=18")

    assert tail.status_code == 200 and tail.data == b"line two\n"
    assert whole.status_code == 200 and whole.data == b"line one\nline two\n"
    assert end.status_code == 200 and end.data == b""


def test_a_log_reply_is_at_most_1_mib_and_ends_at_a_newline(client):
    booting(client)
    lines = b"".join(b"%099d\n" % i for i in range(11_000))  # 1,100,000 bytes, 100 a line
    assert put_log(client, lines).headers["X-Enode-Log-Bytes"] == str(len(lines))

    first = client.get("/v1/runs/r1/steps/1/log?from=0").data
    rest = client.get(f"/v1/runs/r1/steps/1/log?from={len(first)}").data

    assert 0 < len(first) <= 1 << 20
    assert first.endswith(b"\n") and len(first) % 100 == 0
    assert first + rest == lines


def test_a_log_from_that_is_not_a_byte_offset_is_400(client):
    placed(client)
    put_log(client, b"line\n")

    statuses = {
        offset: client.get(f"/v1/runs/r1/steps/1/log?from={offset}").status_code
        for offset in ("x", "1.5", "-1", "0x10")
    }

    assert statuses == {"x": 400, "1.5": 400, "-1": 400, "0x10": 400}


def test_reading_the_log_of_an_unknown_run_is_404_and_of_an_unknown_step_is_empty(client):
    placed(client)

    unknown_run = client.get("/v1/runs/nope/steps/1/log")
    unknown_step = client.get("/v1/runs/r1/steps/7/log")

    assert unknown_run.status_code == 404 and unknown_run.get_json()["error"]["code"] == 404
    assert unknown_step.status_code == 200 and unknown_step.data == b""
    assert unknown_step.headers["X-Enode-Log-Bytes"] == "0"


def test_putting_a_log_of_an_unknown_run_or_step_is_404_and_writes_nothing(client, tmp_path):
    placed(client)
    before = tree(tmp_path)

    unknown_run = put_log(client, b"x\n", run_id="nope")
    unknown_step = put_log(client, b"x\n", seq=7)

    assert unknown_run.status_code == 404 and unknown_step.status_code == 404
    assert tree(tmp_path) == before


def test_a_log_put_after_the_run_finished_is_410(client, ctx):
    finished(client)

    resp = put_log(client, b"late\n")

    assert resp.status_code == 410 and resp.get_json() == GONE
    assert read_whole_log(client) == b"booting\nup\n"


def test_a_log_name_that_tries_to_escape_is_a_4xx_and_writes_nothing(client, tmp_path):
    placed(client)
    before = tree(tmp_path)

    statuses = {
        name: client.put(
            "/v1/runs/r1/steps/1/log", query_string={"name": name}, data=b"evil\n"
        ).status_code
        for name in ("../../escaped", "..", "a/b", "a\\b", "x\x00y")
    }

    assert all(status in (400, 404) for status in statuses.values()), statuses
    assert tree(tmp_path) == before


def test_a_log_name_that_tries_to_escape_is_a_4xx_on_read(client):
    placed(client)
    put_log(client, b"line\n")

    statuses = {
        name: client.get("/v1/runs/r1/steps/1/log", query_string={"name": name}).status_code
        for name in ("../../manifest", "..", "a/b", "x\x00y")
    }

    assert all(status in (400, 404) for status in statuses.values()), statuses


# ---------------------------------------------------------------- blobs


def test_a_blob_that_violates_its_schema_is_422_and_nothing_is_stored(client, sql, ctx):
    booting(client)

    resp = client.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": "yes"}')

    assert resp.status_code == 422
    reason = resp.get_json()["error"]["reason"]
    assert reason.startswith("schema violation: ") and "ok" in reason
    assert blob_rows(sql, "r1") == [] and blob_files(ctx, "r1") == []
    assert client.get("/v1/runs/r1/ledger").get_json() == {"entries": []}


def test_a_blob_with_a_schema_that_is_not_json_is_422_and_nothing_is_stored(client, sql, ctx):
    booting(client)

    resp = client.put("/v1/runs/r1/steps/1/blob/result.json", data=b"ok: true")

    assert resp.status_code == 422
    assert resp.get_json()["error"]["reason"].startswith("schema violation: ")
    assert blob_rows(sql, "r1") == [] and blob_files(ctx, "r1") == []


def test_a_valid_blob_is_204_and_stored_in_the_record_and_the_ledger(client, sql, ctx):
    booting(client)

    resp = client.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": true}')

    assert resp.status_code == 204 and resp.data == b""
    assert blob_rows(sql, "r1") == [(1, 0, "result.json", 12)]
    assert (ctx.records.path("r1") / "blobs" / "01.0-result.json").read_bytes() == b'{"ok": true}'


def test_a_blob_over_max_blob_bytes_is_413_and_nothing_is_stored(client, sql, ctx):
    placed(client)

    resp = client.put("/v1/runs/r1/steps/1/blob/boot.bin", data=b"b" * (MAX_BLOB + 1))

    assert resp.status_code == 413 and resp.get_json()["error"]["code"] == 413
    assert blob_rows(sql, "r1") == [] and blob_files(ctx, "r1") == []


def test_a_blob_of_exactly_max_blob_bytes_is_stored_whole(client):
    booting(client)
    data = b"b" * MAX_BLOB

    assert client.put("/v1/runs/r1/steps/1/blob/boot.bin", data=data).status_code == 204

    assert client.get("/v1/runs/r1/blob/boot.bin").data == data


def test_a_blob_name_not_declared_in_the_step_out_is_stored_too(client, sql, ctx):
    booting(client)
    attempt = scalar(sql, "select attempt from steps where run_id = 'r1' and seq = 1")

    resp = client.put("/v1/runs/r1/steps/1/blob/other.txt", data=b"x")

    assert resp.status_code == 204
    assert blob_rows(sql, "r1") == [(1, attempt, "other.txt", 1)]
    assert blob_files(ctx, "r1") == [f"01.{attempt}-other.txt"]


ESCAPING_PUTS = [
    "/v1/runs/r1/steps/1/blob/..",
    "/v1/runs/r1/steps/1/blob/%2e%2e",
    "/v1/runs/r1/steps/1/blob/..%2F..%2Fescaped",
    "/v1/runs/r1/steps/1/blob/..%2f..%2f..%2fescaped",
    "/v1/runs/r1/steps/1/blob/..%5C..%5Cescaped",
    "/v1/runs/r1/steps/1/blob/result.json%00",
    "/v1/runs/..%2F..%2Fescaped/steps/1/blob/result.json",
]


def test_a_blob_put_whose_name_or_run_tries_to_escape_is_a_4xx_and_writes_nothing(
    client, sql, tmp_path
):
    placed(client)
    before = tree(tmp_path)

    statuses = {path: client.put(path, data=b'{"ok": true}').status_code for path in ESCAPING_PUTS}

    assert all(status in (400, 404) for status in statuses.values()), statuses
    assert tree(tmp_path) == before
    assert sql.execute("select count(*) from blobs").fetchone() == (0,)


def test_a_blob_put_after_the_run_finished_is_410_and_changes_nothing(client, sql):
    finished(client)

    resp = client.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": false}')

    assert resp.status_code == 410 and resp.get_json() == GONE
    assert client.get("/v1/runs/r1/blob/result.json").data == b'{"ok": true}'
    assert blob_rows(sql, "r1") == [(1, 0, "result.json", 12)]


@pytest.mark.parametrize(
    "put",
    [
        pytest.param(lambda c: c.put("/v1/runs/r1/steps/1/log", data=b"late line\n"), id="log"),
        pytest.param(
            lambda c: c.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": true}'),
            id="blob",
        ),
    ],
)
def test_a_log_or_blob_put_for_a_finished_and_sealed_run_is_410(client, sql, put):
    advertise(client, "n1", cap())
    doc = contract(
        "r1",
        role("dut"),
        steps=[{"id": "boot", "uses": "dut", "run": ["boot"], "out": ["result.json"]}],
    )
    submit(client, doc, 201)
    assert claimed(client, "n1")["name"] == "boot"
    assert client.post("/v1/runs/r1/cancel").status_code == 200
    assert scalar(sql, "select sealed_at from runs where run_id = 'r1'") is not None

    resp = put(client)

    assert resp.status_code == 410
    assert resp.get_json() == GONE
    assert scalar(sql, "select count(*) from blobs where run_id = 'r1'") == 0


def test_a_blob_put_to_an_unknown_run_or_step_is_404(client, sql):
    placed(client)

    unknown_run = client.put("/v1/runs/nope/steps/1/blob/result.json", data=b'{"ok": true}')
    unknown_step = client.put("/v1/runs/r1/steps/7/blob/result.json", data=b'{"ok": true}')

    assert unknown_run.status_code == 404 and unknown_step.status_code == 404
    assert sql.execute("select count(*) from blobs").fetchone() == (0,)


def test_get_blob_returns_the_bytes_as_an_octet_stream(client):
    booting(client)
    data = bytes(range(256)) * 4
    assert client.put("/v1/runs/r1/steps/1/blob/boot.bin", data=data).status_code == 204

    resp = client.get("/v1/runs/r1/blob/boot.bin")

    assert resp.status_code == 200 and resp.mimetype == "application/octet-stream"
    assert resp.data == data


def test_get_blob_returns_the_newest_attempt_of_that_name(client, sql):
    advertise(client, "n1", cap("board"))
    steps = [
        {"id": "prep", "uses": "dut", "run": ["prep"]},
        {
            "id": "build",
            "uses": "dut",
            "run": ["build"],
            "out": ["out.txt"],
            "loop": {"back_to": "prep", "max": 2, "until": {"exit_code": 0}},
        },
    ]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    for attempt, exit_code in ((0, 1), (1, 0)):
        assert claimed(client, "n1", "n1-i")["seq"] == 1
        done(client, "r1", 1, "n1")
        body = claimed(client, "n1", "n1-i")
        assert (body["seq"], body.get("attempt", 0)) == (2, attempt)
        data = b"attempt %d\n" % attempt
        assert client.put("/v1/runs/r1/steps/2/blob/out.txt", data=data).status_code == 204
        reply = done(client, "r1", 2, "n1", exit_code=exit_code, produced=["out.txt"])
        assert reply.get("rolled_back") is (True if attempt == 0 else None)

    resp = client.get("/v1/runs/r1/blob/out.txt")

    assert resp.status_code == 200 and resp.data == b"attempt 1\n"
    assert blob_rows(sql, "r1") == [(2, 0, "out.txt", 10), (2, 1, "out.txt", 10)]


def test_get_blob_of_an_unknown_run_or_name_is_404(client):
    placed(client)
    paths = [
        "/v1/runs/nope/blob/result.json",
        "/v1/runs/r1/blob/result.json",
        "/v1/runs/r1/blob/..",
    ]

    bodies = [client.get(path).get_json() for path in paths]

    assert [b["error"]["code"] for b in bodies] == [404, 404, 404]


def test_a_seq_that_is_not_a_positive_integer_is_400_and_writes_nothing(client, tmp_path):
    placed(client)
    before = tree(tmp_path)
    routes = [("PUT", "log"), ("GET", "log"), ("PUT", "blob/boot.bin")]

    statuses = {
        (method, seq, route): client.open(
            f"/v1/runs/r1/steps/{seq}/{route}", method=method, data=b"x\n"
        ).status_code
        for seq in ("0", "-1", "x", "1.0")
        for method, route in routes
    }

    assert set(statuses.values()) == {400}, statuses
    assert tree(tmp_path) == before


@pytest.mark.parametrize("run_id", ["no%20such%20run!", "r1%00"], ids=["bad-chars", "nul"])
def test_a_run_id_that_could_never_be_valid_is_404_on_get_and_put_routes(client, tmp_path, run_id):
    placed(client)
    before = tree(tmp_path)
    routes = [
        ("GET", "ledger"),
        ("GET", "record"),
        ("GET", "events"),
        ("GET", "blob/result.json"),
        ("GET", "steps/1/log"),
        ("PUT", "steps/1/log"),
        ("PUT", "steps/1/blob/result.json"),
    ]

    statuses = {
        (method, route): client.open(
            f"/v1/runs/{run_id}/{route}", method=method, data=b'{"ok": true}'
        ).status_code
        for method, route in routes
    }

    assert set(statuses.values()) == {404}, statuses
    assert tree(tmp_path) == before


# ---------------------------------------------------------------- records


def test_a_running_run_has_its_record_opened_at_creation(client, ctx):
    advertise(client, "n1", cap("board"))
    doc = boot_contract("r1")

    resp = client.post("/v1/runs", json=doc, headers={"X-Enode-Principal": "dev@example.com"})

    assert resp.status_code == 201
    manifest = json.loads((ctx.records.path("r1") / "manifest.json").read_bytes())
    assert manifest["run_id"] == "r1" and manifest["contract"] == doc
    assert manifest["requester"] == "dev@example.com"


def test_a_queued_run_has_its_record_opened_at_creation(client, ctx):
    advertise(client, "n1", cap("board"))
    submit(client, contract("blocker"), 201)

    submit(client, boot_contract("r2"), 202)

    manifest = json.loads((ctx.records.path("r2") / "manifest.json").read_bytes())
    assert manifest["run_id"] == "r2" and manifest["contract"] == boot_contract("r2")


def test_a_rejected_run_has_no_record(client, ctx, tmp_path):
    advertise(client, "n1", cap("board"))
    root = tmp_path / "records"
    before = tree(root) if root.exists() else []

    submit(client, contract("r1", role("dut", soc="nope")), 422)

    assert not ctx.records.path("r1").exists()
    assert (tree(root) if root.exists() else []) == before


def test_the_record_of_a_running_or_queued_run_is_409_not_sealed_yet(client):
    placed(client, "r1")
    submit(client, boot_contract("r2"), 202)

    running = client.get("/v1/runs/r1/record")
    queued = client.get("/v1/runs/r2/record")

    assert running.status_code == 409 and running.get_json() == NOT_SEALED
    assert queued.status_code == 409 and queued.get_json() == NOT_SEALED


def test_the_record_of_a_rejected_run_is_409_not_sealed_yet(client):
    advertise(client, "n1", cap("board"))
    submit(client, contract("r1", role("dut", soc="nope")), 422)

    resp = client.get("/v1/runs/r1/record")

    assert resp.status_code == 409 and resp.get_json() == NOT_SEALED


def test_the_record_of_an_unknown_run_is_404(client):
    resp = client.get("/v1/runs/nope/record")

    assert resp.status_code == 404 and resp.get_json()["error"]["code"] == 404


def test_a_finished_run_s_record_is_a_tar_of_its_files_under_run_id(client):
    finished(client)

    members = record_members(client, "r1")

    assert all(name == "run-r1" or name.startswith("run-r1/") for name in members)
    files = {name for name, data in members.items() if data is not None}
    assert {
        "run-r1/manifest.json",
        "run-r1/verdict.json",
        "run-r1/steps/01-boot.json",
        "run-r1/logs/01-step.log",
        "run-r1/blobs/01.0-result.json",
        "run-r1/SHA256SUMS",
    } <= files
    assert members["run-r1/logs/01-step.log"] == b"booting\nup\n"
    assert members["run-r1/blobs/01.0-result.json"] == b'{"ok": true}'
    assert json.loads(members["run-r1/verdict.json"])["state"] == "SUCCEEDED"
    step = json.loads(members["run-r1/steps/01-boot.json"])
    assert (step["state"], step["node"], step["exit_code"]) == ("DONE", "n1", 0)
    manifest = json.loads(members["run-r1/manifest.json"])
    assert manifest["run_id"] == "r1" and manifest["state"] == "SUCCEEDED"


def test_the_sha256sums_of_a_record_match_every_file_in_it(client):
    finished(client)

    members = record_members(client, "r1")

    sums = {}
    for line in members["run-r1/SHA256SUMS"].decode().splitlines():
        digest, rel = line.split("  ", 1)
        sums["run-r1/" + rel] = digest
    files = {n: d for n, d in members.items() if d is not None and n != "run-r1/SHA256SUMS"}
    assert set(sums) == set(files)
    assert all(hashlib.sha256(files[n]).hexdigest() == sums[n] for n in files)


def test_a_sealed_record_is_read_only_on_disk(client, ctx):
    finished(client)
    root = ctx.records.path("r1")

    modes = {str(p.relative_to(root)): os.lstat(p).st_mode for p in [root, *root.rglob("*")]}

    assert modes and all(
        stat.S_IMODE(m) == (0o555 if stat.S_ISDIR(m) else 0o444) for m in modes.values()
    ), {k: oct(v) for k, v in modes.items()}
    assert stat.S_IMODE(modes["."]) == 0o555 and stat.S_IMODE(modes["SHA256SUMS"]) == 0o444


def test_the_record_holds_the_run_s_audit_trail(client):
    finished(client)
    events = client.get("/v1/runs/r1/events").get_json()["events"]
    assert [(e["from"], e["to"]) for e in events][-1][1] == "SUCCEEDED"

    members = record_members(client, "r1")

    found = False
    for name, data in members.items():
        if data is None or not name.endswith(".json"):
            continue
        doc = json.loads(data)
        if doc == events or (isinstance(doc, dict) and doc.get("events") == events):
            found = True
    assert found, sorted(members)


def test_sealing_again_changes_nothing(client, ctx):
    finished(client)
    first = client.get("/v1/runs/r1/record").data
    root = ctx.records.path("r1")
    stamps = {p: (os.lstat(p).st_mtime_ns, os.lstat(p).st_mode) for p in root.rglob("*")}

    seal_run(ctx, "r1")
    report_ = reap_pass(ctx)

    assert report_.sealed == 0
    assert {p: (os.lstat(p).st_mtime_ns, os.lstat(p).st_mode) for p in root.rglob("*")} == stamps
    assert client.get("/v1/runs/r1/record").data == first


# ---------------------------------------------------------------- ledger


def test_the_ledger_lists_each_stored_artifact_with_its_metadata(client, sql):
    booting(client)
    assert (
        client.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": true}').status_code == 204
    )
    assert client.put("/v1/runs/r1/steps/1/blob/boot.bin", data=b"\x00" * 100).status_code == 204

    resp = client.get("/v1/runs/r1/ledger")

    assert resp.status_code == 200
    entries = sorted(resp.get_json()["entries"], key=lambda e: e["name"])
    ats = [e.pop("at") for e in entries]
    assert entries == [
        {"seq": 1, "attempt": 0, "name": "boot.bin", "by": "n1", "bytes": 100},
        {"seq": 1, "attempt": 0, "name": "result.json", "by": "n1", "bytes": 12, "schema_ok": True},
    ]
    assert all(at.endswith("Z") for at in ats)


def test_a_work_scoped_ledger_lists_earlier_runs_of_the_same_work_first(client):
    work = {"id": {"system": "gerrit", "change_id": "4711"}}
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    advertise(client, "n3", cap("board"))
    submit(client, boot_contract("w1", work=work), 201)
    submit(client, boot_contract("w2", work=work, ledger={"scope": "work"}), 201)
    other = {"id": {"system": "gerrit", "change_id": "9999"}}
    submit(client, boot_contract("x1", work=other), 201)
    for node in ("n1", "n2", "n3"):
        claimed(client, node)
    # The later run stores first: the order is by run (earlier runs first), not by time.
    assert client.put("/v1/runs/w2/steps/1/blob/boot.bin", data=b"2" * 2).status_code == 204
    assert client.put("/v1/runs/x1/steps/1/blob/boot.bin", data=b"3" * 3).status_code == 204
    assert client.put("/v1/runs/w1/steps/1/blob/boot.bin", data=b"1" * 1).status_code == 204

    entries = client.get("/v1/runs/w2/ledger").get_json()["entries"]

    assert [(e["name"], e["bytes"], e["by"]) for e in entries] == [
        ("boot.bin", 1, "n1"),
        ("boot.bin", 2, "n2"),
    ]


def test_a_run_scoped_ledger_lists_only_the_run_s_own_artifacts(client):
    work = {"id": {"system": "gerrit", "change_id": "4711"}}
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    submit(client, boot_contract("w1", work=work), 201)
    submit(client, boot_contract("w2", work=work), 201)
    claimed(client, "n1")
    claimed(client, "n2")
    assert client.put("/v1/runs/w1/steps/1/blob/boot.bin", data=b"1").status_code == 204
    assert client.put("/v1/runs/w2/steps/1/blob/boot.bin", data=b"22").status_code == 204

    entries = client.get("/v1/runs/w2/ledger").get_json()["entries"]

    assert [(e["name"], e["bytes"]) for e in entries] == [("boot.bin", 2)]


def test_the_ledger_of_an_unknown_run_is_404(client):
    resp = client.get("/v1/runs/nope/ledger")

    assert resp.status_code == 404 and resp.get_json()["error"]["code"] == 404
