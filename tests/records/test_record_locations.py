"""A Record belongs to its run, whatever the run ids: a run id that is a plain file name is its
Record's place; any other id is hashed (the whole sha256) under ``_h/``, which no run id can
name (``_`` is not in the run-id alphabet), in a directory and in S3 keys alike. The place is kept
on the run's row, so a run created before this rule (no place kept) keeps its Record where the
old rule put it — and no new run is placed there, even one named like the old rule's hashes. The
filesystem backend refuses a records root where names that differ only by case are one file.

The API tests run against both backends: a directory, and a bucket on moto's S3 server."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command

from app.config import load_config, to_libpq_url
from app.context import record_store
from app.errors import ConfigError
from app.migrate import alembic_config
from app.records import FilesystemRecords
from app.services.retention import _prune_batch, prune, sweep_records
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.contracts import contract, role
from tests.support.record_contents import tar_files
from tests.support.rows import scalar
from tests.support.s3 import bucket_keys, new_bucket, shared_server
from tests.support.submitter import submit

LONG = "long-" + "x" * 150  # a valid run id, too long to be a file name: hashed
HASHED = hashlib.sha256(LONG.encode()).hexdigest()
TWIN = "run-" + HASHED[:40]  # where the old rule put LONG's Record
PREFIX = "mediator"


@pytest.fixture(params=["filesystem", "s3"])
def config_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "filesystem":
        return {}
    url = shared_server().url
    return {
        "records.backend": "s3",
        "records.s3.bucket": new_bucket(url),
        "records.s3.prefix": PREFIX,
        "records.s3.endpoint_url": url,
    }


# ---------------------------------------------------------------- builders


def boot(run_id: str) -> dict[str, Any]:
    steps = [{"id": "boot", "uses": "dut", "run": ["boot"], "out": ["result.json"]}]
    return contract(run_id, role("dut"), steps=steps)


def booting(client: Any, *run_ids: str) -> None:
    """The runs placed, one board each, and each boot step claimed by its node."""
    for i, run_id in enumerate(run_ids):
        advertise(client, f"n{i}", cap("board"))
        submit(client, boot(run_id), 201)
        assert claimed(client, f"n{i}")["run_id"] == run_id


def upload(client: Any, run_id: str, data: bytes) -> None:
    resp = client.put(f"/v1/runs/{run_id}/steps/1/blob/result.json", data=data)
    assert resp.status_code == 204, resp.get_json()
    assert client.put(f"/v1/runs/{run_id}/steps/1/log", data=data + b"\n").status_code == 200


def finish(client: Any, run_id: str, node: str) -> None:
    assert done(client, run_id, 1, node, produced=["result.json"])["run_state"] == "SUCCEEDED"


def record(client: Any, run_id: str) -> dict[str, bytes]:
    """The sealed Record's files by their path inside it."""
    resp = client.get(f"/v1/runs/{run_id}/record")
    assert resp.status_code == 200, resp.get_json()
    return tar_files(resp.data, in_run=True)


def stored_paths(ctx: Any) -> list[str]:
    """Every file the store holds, by its path under the root (or the bucket's prefix)."""
    if ctx.config["records.backend"] == "s3":
        keys = bucket_keys(ctx.config["records.s3.endpoint_url"], ctx.config["records.s3.bucket"])
        return sorted(k[len(PREFIX) + 1 :] for k in keys)
    root = ctx.records.root
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def location_of(sql: Any, run_id: str) -> str | None:
    return scalar(sql, "select record_location from runs where run_id = %s", run_id)


# ---------------------------------------------------------------- one run, one Record


def test_a_run_named_like_the_hash_of_a_long_run_id_keeps_a_record_of_its_own(client, sql):
    booting(client, LONG, TWIN)
    upload(client, LONG, b'{"run": "long"}')
    upload(client, TWIN, b'{"run": "twin"}')

    long_blob = client.get(f"/v1/runs/{LONG}/blob/result.json").data
    twin_blob = client.get(f"/v1/runs/{TWIN}/blob/result.json").data
    finish(client, LONG, "n0")
    finish(client, TWIN, "n1")

    assert (long_blob, twin_blob) == (b'{"run": "long"}', b'{"run": "twin"}')
    long_record, twin_record = record(client, LONG), record(client, TWIN)
    assert json.loads(long_record["manifest.json"])["run_id"] == LONG
    assert json.loads(twin_record["manifest.json"])["run_id"] == TWIN
    assert long_record["logs/01-step.log"] == b'{"run": "long"}\n'
    assert twin_record["logs/01-step.log"] == b'{"run": "twin"}\n'


def test_a_hashed_run_id_is_placed_under_h_by_its_whole_sha256(client, sql, ctx):
    booting(client, LONG, "plain-1")

    assert location_of(sql, LONG) == f"_h/{HASHED}"
    assert location_of(sql, "plain-1") == "plain-1"
    assert stored_paths(ctx) == [f"_h/{HASHED}/manifest.json", "plain-1/manifest.json"]


def test_a_run_id_shaped_like_an_old_hash_is_hashed_too(client, sql, ctx):
    booting(client, TWIN)

    twin = hashlib.sha256(TWIN.encode()).hexdigest()
    assert location_of(sql, TWIN) == f"_h/{twin}"
    assert stored_paths(ctx) == [f"_h/{twin}/manifest.json"]


def test_a_run_from_before_keeps_its_record_where_the_old_rule_put_it(client, sql, ctx):
    """A run created before the place was kept on its row (NULL): its Record is where the old
    rule put it, ``run-`` and 40 hex digits of the id's sha256, and stays there for its uploads
    and its seal; a new run named like that place gets a Record elsewhere."""
    booting(client, LONG)
    sql.execute("update runs set record_location = null where run_id = %s", (LONG,))
    ctx.records.delete(f"_h/{HASHED}")
    ctx.records.open(TWIN, {"run_id": LONG, "written": "before the upgrade"})
    advertise(client, "n1", cap("board"))
    submit(client, boot(TWIN), 201)
    assert claimed(client, "n1")["run_id"] == TWIN

    upload(client, LONG, b'{"run": "long"}')
    upload(client, TWIN, b'{"run": "twin"}')
    finish(client, LONG, "n0")

    assert client.get(f"/v1/runs/{LONG}/blob/result.json").data == b'{"run": "long"}'
    assert client.get(f"/v1/runs/{TWIN}/blob/result.json").data == b'{"run": "twin"}'
    long_record = record(client, LONG)
    assert json.loads(long_record["manifest.json"])["written"] == "before the upgrade"
    assert long_record["blobs/01.0-result.json"] == b'{"run": "long"}'
    twin = hashlib.sha256(TWIN.encode()).hexdigest()
    assert ctx.records.read_blob(TWIN, 1, 0, "result.json") == b'{"run": "long"}'
    assert ctx.records.read_blob(f"_h/{twin}", 1, 0, "result.json") == b'{"run": "twin"}'


# ---------------------------------------------------------------- retention


def test_pruning_deletes_each_record_where_its_run_keeps_it(client, sql, ctx):
    old = "old-" + "y" * 150  # a run from before: its Record where the old rule put it
    old_hash = hashlib.sha256(old.encode()).hexdigest()
    booting(client, LONG, old)
    sql.execute("update runs set record_location = null where run_id = %s", (old,))
    ctx.records.delete(f"_h/{old_hash}")
    ctx.records.open(f"run-{old_hash[:40]}", {"run_id": old})
    finish(client, LONG, "n0")
    finish(client, old, "n1")
    assert ctx.records.is_sealed(f"_h/{HASHED}") and ctx.records.is_sealed(f"run-{old_hash[:40]}")

    report = prune(ctx, datetime.now(UTC) + timedelta(days=3650))

    assert (report.runs, report.records) == (2, 2)
    assert not ctx.records.exists(f"_h/{HASHED}")
    assert not ctx.records.exists(f"run-{old_hash[:40]}")
    assert stored_paths(ctx) == []


def test_a_record_left_by_a_prune_that_stopped_is_swept_from_where_its_run_kept_it(
    client, sql, ctx
):
    booting(client, LONG)
    finish(client, LONG, "n0")
    # What a prune that died after its commit leaves: rows gone, tombstone, Record still there.
    _prune_batch(ctx, datetime.now(UTC) + timedelta(days=3650), 100)
    tombstone = "select record_location, record_pending from run_tombstones where run_id = %s"
    assert sql.execute(tombstone, (LONG,)).fetchall() == [(f"_h/{HASHED}", True)]
    assert ctx.records.is_sealed(f"_h/{HASHED}")

    assert sweep_records(ctx) == 1

    assert not ctx.records.exists(f"_h/{HASHED}")
    assert sql.execute(tombstone, (LONG,)).fetchall() == [(f"_h/{HASHED}", False)]


# ---------------------------------------------------------------- the migration


def test_the_migration_keeps_no_place_for_runs_created_before_it(fresh_db_url):
    cfg = alembic_config(fresh_db_url)
    command.downgrade(cfg, "0008")
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, state, contract, requires, requires_key)"
            " VALUES (%s, 'RUNNING', '{}', '[]', 'k')",
            (LONG,),
        )
    command.upgrade(cfg, "head")
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        rows = conn.execute("SELECT run_id, record_location FROM runs").fetchall()
        tombstones = conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'run_tombstones' AND column_name = 'record_location'"
        ).fetchall()
    assert rows == [(LONG, None)]
    assert tombstones == [("record_location",)]


def test_the_migration_is_undone_only_while_every_record_is_where_the_old_rule_looks(
    fresh_db_url,
):
    cfg = alembic_config(fresh_db_url)
    insert = (
        "INSERT INTO runs (run_id, state, contract, requires, requires_key, record_location)"
        " VALUES (%s, 'RUNNING', '{}', '[]', 'k', %s)"
    )
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute(insert, ("plain-1", "plain-1"))
        conn.execute(insert, (LONG, f"_h/{HASHED}"))

    with pytest.raises(RuntimeError, match="^downgrade refused: 1 runs keep their Record"):
        command.downgrade(cfg, "0008")

    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute("DELETE FROM runs WHERE run_id = %s", (LONG,))
    command.downgrade(cfg, "0008")
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        assert conn.execute("SELECT run_id FROM runs").fetchall() == [("plain-1",)]


# ---------------------------------------------------------------- a case-insensitive root


def test_a_records_root_that_ignores_case_is_refused_at_start_up(tmp_path: Path) -> None:
    """A root where the probe's name in upper case finds the probe: two run ids that differ only
    by case would share a Record there. (The test's root is case-sensitive: a link made under the
    upper-case name stands in for the filesystem that folds case.)"""
    root = tmp_path / "records"
    root.mkdir()
    os.symlink(".case-probe-test", root / ".CASE-PROBE-TEST")

    with pytest.raises(ConfigError) as info:
        FilesystemRecords(root).refuse_case_insensitive_root(probe=".case-probe-test")

    assert str(info.value) == (
        f"records.root: {root} is on a filesystem that ignores case (.case-probe-test is found "
        "as .CASE-PROBE-TEST); run ids that differ only by case would share a Record there: "
        "give a directory on a case-sensitive filesystem"
    )
    assert sorted(p.name for p in root.iterdir()) == [".CASE-PROBE-TEST"]  # the probe is gone


def test_a_case_sensitive_records_root_is_taken_and_keeps_no_probe(tmp_path: Path) -> None:
    root = tmp_path / "records"
    cfg = load_config(
        env={}, overrides={"database.url": "postgresql://x/y", "records.root": str(root)}
    )

    store = record_store(cfg)

    assert isinstance(store, FilesystemRecords) and store.root == root
    assert root.is_dir() and list(root.iterdir()) == []
