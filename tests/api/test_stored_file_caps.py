"""A run's stored files are capped (docs/security.md#runs-records-and-uploads):
``records.max_run_bytes`` of files per run and ``records.max_step_files`` distinct files per step
(each (attempt, name) of a blob, each log and each progress of a name). Over a cap a blob is 413
with a reason and nothing is stored; a log or a progress chunk is cut with its note and answered 200
with ``X-Enode-Log-Capped: 1``, as the ``max_blob_bytes`` cap cuts it. What the Mediator writes
itself (answers, acquire results, step documents, the verdict) is never counted or refused. The
counts live in the database, next to the rows that record the uploads."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from alembic import command

from app.config import load_config, to_libpq_url
from app.errors import ConfigError
from app.migrate import alembic_config
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.contracts import contract, role
from tests.support.record_contents import blob_files
from tests.support.rows import one, rows, scalar
from tests.support.submitter import submit
from tests.support.wire import error_of

MAX_RUN_BYTES = 1000
MAX_STEP_FILES = 3
NOTE = b"\n[mediator: log truncated at %d bytes]\n"
CAPPED = b'{"type":"enode.capped","bytes":%d}\n'


pytestmark = pytest.mark.config(
    {
        "records.max_run_bytes": MAX_RUN_BYTES,
        "records.max_step_files": MAX_STEP_FILES,
        "max_blob_bytes": 4096,
    }
)


def placed(client: Any, *steps: dict[str, Any]) -> None:
    """r1 RUNNING on n1 with ``steps`` (default: two run steps), step 1 CLAIMED."""
    advertise(client, "n1", cap("board"))
    body = list(steps) or [
        {"id": "build", "uses": "dut", "run": ["make"], "out": ["a.bin", "b.bin"]},
        {"id": "test", "uses": "dut", "run": ["check"]},
    ]
    submit(client, contract("r1", role("dut"), steps=body), 201)
    claimed(client, "n1")


def put_blob(client: Any, name: str, data: bytes, seq: int = 1) -> Any:
    return client.put(f"/v1/runs/r1/steps/{seq}/blob/{name}", data=data)


def put_log(client: Any, data: bytes, name: str = "step", **query: Any) -> Any:
    return client.put("/v1/runs/r1/steps/1/log", query_string={"name": name, **query}, data=data)


def stored_bytes(sql: Any) -> int:
    return scalar(sql, "select stored_bytes from runs where run_id = 'r1'")


def log_files(ctx: Any) -> list[str]:
    d = ctx.records.path("r1") / "logs"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


# ---------------------------------------------------------------- configuration


def test_the_caps_default_to_1_gib_and_1000_files_and_must_be_at_least_1():
    config = load_config(env={})
    assert (config["records.max_run_bytes"], config["records.max_step_files"]) == (1 << 30, 1000)
    env = {"MEDIATOR_RECORDS_MAX_RUN_BYTES": "5000", "MEDIATOR_RECORDS_MAX_STEP_FILES": "7"}
    assert load_config(env=env)["records.max_run_bytes"] == 5000
    assert load_config(env=env)["records.max_step_files"] == 7
    with pytest.raises(ConfigError, match=r"^records.max_run_bytes: must be at least 1"):
        load_config(env={"MEDIATOR_RECORDS_MAX_RUN_BYTES": "0"})
    with pytest.raises(ConfigError, match=r"^records.max_step_files: must be at least 1"):
        load_config(env={"MEDIATOR_RECORDS_MAX_STEP_FILES": "0"})


# ---------------------------------------------------------------- blobs


def test_a_blob_that_would_pass_the_runs_byte_cap_is_413_and_nothing_is_stored(client, sql, ctx):
    placed(client)
    assert put_blob(client, "a.bin", b"a" * 600).status_code == 204

    resp = put_blob(client, "b.bin", b"b" * 401)

    assert resp.status_code == 413
    assert error_of(resp) == "run r1 would store more than records.max_run_bytes (1000 bytes)"
    assert [r["name"] for r in rows(sql, "select name from blobs")] == ["a.bin"]
    assert blob_files(ctx, "r1") == ["01.0-a.bin"]
    assert stored_bytes(sql) == 600


def test_a_blob_that_fills_the_runs_byte_cap_exactly_is_stored(client, sql, ctx):
    placed(client)
    assert put_blob(client, "a.bin", b"a" * 600).status_code == 204

    resp = put_blob(client, "b.bin", b"b" * 400)

    assert resp.status_code == 204
    assert blob_files(ctx, "r1") == ["01.0-a.bin", "01.0-b.bin"]
    assert stored_bytes(sql) == 1000


def test_a_blob_put_again_counts_only_what_it_adds_to_the_one_it_replaces(client, sql, ctx):
    placed(client)
    assert put_blob(client, "a.bin", b"a" * 600).status_code == 204
    assert put_blob(client, "b.bin", b"b" * 300).status_code == 204

    shrunk = put_blob(client, "a.bin", b"A" * 100)
    grown = put_blob(client, "b.bin", b"B" * 900)

    assert (shrunk.status_code, grown.status_code) == (204, 204)
    assert (ctx.records.path("r1") / "blobs" / "01.0-b.bin").read_bytes() == b"B" * 900
    assert stored_bytes(sql) == 1000


def test_a_blob_that_would_be_a_steps_file_past_max_step_files_is_413(client, sql, ctx):
    placed(client)
    for name in ("a.bin", "b.bin", "_cannot"):
        assert put_blob(client, name, b"x").status_code == 204

    resp = put_blob(client, "c.bin", b"x")
    again = put_blob(client, "a.bin", b"y")  # the same file again: no new file

    assert resp.status_code == 413
    assert error_of(resp) == "step 1 of run r1 would have more than records.max_step_files (3)"
    assert again.status_code == 204
    assert blob_files(ctx, "r1") == ["01.0-_cannot", "01.0-a.bin", "01.0-b.bin"]
    assert scalar(sql, "select count(*) from blobs where name = 'c.bin'") == 0


def test_each_step_has_its_own_file_count(client, sql, ctx):
    placed(client)
    for name in ("a.bin", "b.bin", "c.bin"):
        assert put_blob(client, name, b"x").status_code == 204
    done(client, "r1", 1, "n1", produced=["a.bin"])
    claimed(client, "n1")

    resp = put_blob(client, "d.bin", b"x", seq=2)

    assert resp.status_code == 204
    assert "02.0-d.bin" in blob_files(ctx, "r1")


# ---------------------------------------------------------------- logs


def test_a_log_past_the_runs_byte_cap_is_cut_with_the_note_and_answered_capped(client, sql, ctx):
    placed(client)
    assert put_blob(client, "a.bin", b"a" * 900).status_code == 204

    resp = put_log(client, b"l" * 200)
    later = put_log(client, b"more\n")

    cut = b"l" * 100 + NOTE % 100
    assert resp.status_code == 200
    assert resp.headers["X-Enode-Log-Bytes"] == str(len(cut))
    assert resp.headers["X-Enode-Log-Capped"] == "1"
    assert (later.status_code, later.headers["X-Enode-Log-Bytes"]) == (200, str(len(cut)))
    assert later.headers["X-Enode-Log-Capped"] == "1"
    assert (ctx.records.path("r1") / "logs" / "01-step.log").read_bytes() == cut
    assert stored_bytes(sql) == 900 + len(cut)


def test_a_log_within_the_caps_is_answered_without_the_capped_header(client, sql):
    placed(client)

    resp = put_log(client, b"booting\n")

    assert resp.status_code == 200
    assert resp.headers["X-Enode-Log-Bytes"] == "8"
    assert "X-Enode-Log-Capped" not in resp.headers
    assert stored_bytes(sql) == 8


def test_a_blob_past_the_cap_that_logs_filled_is_413(client, sql):
    placed(client)
    assert put_log(client, b"l" * 700).status_code == 200
    assert put_log(client, b"m" * 200, name="make").status_code == 200

    resp = put_blob(client, "a.bin", b"a" * 101)

    assert resp.status_code == 413
    assert stored_bytes(sql) == 900


def test_a_new_log_past_max_step_files_is_200_capped_and_stores_nothing(client, sql, ctx):
    placed(client)
    for name in ("a.bin", "b.bin"):
        assert put_blob(client, name, b"x").status_code == 204
    assert put_log(client, b"first\n").status_code == 200

    resp = put_log(client, b"second\n", name="other")
    same = put_log(client, b"again\n")  # the log the step already has goes on

    assert resp.status_code == 200
    assert resp.headers["X-Enode-Log-Bytes"] == "0"
    assert resp.headers["X-Enode-Log-Capped"] == "1"
    assert (same.status_code, same.headers["X-Enode-Log-Bytes"]) == (200, "12")
    assert log_files(ctx) == ["01-step.log"]


def test_a_progress_chunk_past_the_runs_byte_cap_is_cut_with_the_cap_line(client, sql, ctx):
    placed(client)
    assert put_blob(client, "a.bin", b"a" * 900).status_code == 204

    resp = put_log(client, b"line 1\n" * 30, progress=1, attempt=0)

    kept = b"line 1\n" * 14 + CAPPED % 100  # the whole lines within the 100 bytes left
    assert resp.status_code == 200
    assert resp.headers["X-Enode-Log-Capped"] == "1"
    assert resp.headers["X-Enode-Log-Bytes"] == str(len(kept))
    log = client.get("/v1/runs/r1/steps/1/log")
    assert log.data == kept and log.headers["X-Enode-Log-Capped"] == "1"
    assert stored_bytes(sql) == 900 + len(kept)


def test_a_progress_of_a_new_attempt_counts_what_it_adds_to_the_one_it_replaces(client, sql):
    test = {"id": "test", "uses": "dut", "run": ["check"]}
    test["loop"] = {"back_to": "build", "max": 2, "until": {"exit_code": 0}}
    placed(client, {"id": "build", "uses": "dut", "run": ["make"]}, test)
    assert put_log(client, b"x" * 500 + b"\n", progress=1, attempt=0).status_code == 200
    assert stored_bytes(sql) == 501
    # The build's second attempt, claimed after the test sent it back (only the attempt the
    # step is in uploads: docs/security.md#runs-records-and-uploads).
    done(client, "r1", 1, "n1")
    assert claimed(client, "n1")["name"] == "test"
    assert done(client, "r1", 2, "n1", exit_code=1)["rolled_back"] is True
    assert claimed(client, "n1")["name"] == "build"

    resp = put_log(client, b"y" * 899 + b"\n", progress=1, attempt=1)

    assert resp.status_code == 200 and "X-Enode-Log-Capped" not in resp.headers
    assert resp.headers["X-Enode-Log-Bytes"] == "900"
    assert stored_bytes(sql) == 900


# ---------------------------------------------------------------- the Mediator's own files


def test_an_answer_is_never_counted_or_refused_by_the_caps(client, sql):
    advertise(client, "n1", cap("board"))
    ask = {"id": "q", "ask": {"prompt": "ok?"}, "out": ["decision"]}
    steps = [ask, {"id": "flash", "uses": "dut", "run": ["flash"]}]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    body = b'{"verdict": "approve", "note": "' + b"n" * 2000 + b'"}'

    resp = client.post("/v1/runs/r1/steps/1/answer", data=body, content_type="application/json")

    assert resp.status_code == 200, resp.get_json()
    assert one(sql, "select bytes from blobs where name = 'decision'") == {"bytes": len(body)}
    assert stored_bytes(sql) == 0
    assert scalar(sql, "select stored_files from steps where seq = 1") == 0


def test_an_acquire_result_is_never_counted_or_refused_by_the_caps(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("scope"))
    steps = [
        {
            "id": "more",
            "acquire": {"want": role("probe", "scope"), "acquired": "probe", "unavailable": "x"},
        },
        {"id": "probe", "uses": "probe", "run": ["probe"]},
        {"id": "x", "uses": "dut", "run": ["true"]},
    ]
    submit(client, contract("r1", role("dut"), steps=steps), 201)

    assert scalar(sql, "select count(*) from blobs where seq = 1") == 1
    assert stored_bytes(sql) == 0
    assert scalar(sql, "select stored_files from steps where seq = 1") == 0


# ---------------------------------------------------------------- the upgrade


def test_the_upgrade_counts_the_blobs_that_unfinished_runs_uploaded_before_it(fresh_db_url):
    cfg = alembic_config(fresh_db_url)
    command.downgrade(cfg, "0009")
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        for run_id, state in (("live", "RUNNING"), ("done", "SUCCEEDED")):
            conn.execute(
                "INSERT INTO runs (run_id, state, contract, requires, requires_key)"
                " VALUES (%s, %s, '{}', '[]', 'k')",
                (run_id, state),
            )
            conn.execute(
                "INSERT INTO steps (run_id, seq, step_id, kind, spec) VALUES"
                " (%s, 1, 'build', 'run', '{}'), (%s, 2, 'ok', 'ask', '{}')",
                (run_id, run_id),
            )
            conn.execute(
                "INSERT INTO blobs (run_id, seq, attempt, name, bytes, sha256) VALUES"
                " (%s, 1, 0, 'a.bin', 100, ''), (%s, 1, 1, 'a.bin', 30, ''),"
                " (%s, 2, 0, 'decision', 7, '')",
                (run_id, run_id, run_id),
            )

    command.upgrade(cfg, "head")

    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        assert rows(conn, "select run_id, stored_bytes from runs order by run_id") == [
            {"run_id": "done", "stored_bytes": 0},
            {"run_id": "live", "stored_bytes": 130},
        ]
        assert rows(conn, "select run_id, seq, stored_files from steps order by run_id, seq") == [
            {"run_id": "done", "seq": 1, "stored_files": 0},
            {"run_id": "done", "seq": 2, "stored_files": 0},
            {"run_id": "live", "seq": 1, "stored_files": 2},
            {"run_id": "live", "seq": 2, "stored_files": 0},
        ]
