"""The storm (tests/storm) across two hosts: two gunicorns on one database, their Records in one
bucket, every driver sending each request to either host, a reaper configured as each host; the
invariant checker sampled throughout and run in full at the end. Short for CI (a deadline of 15 s
per driver); ``python -m tests.storm --hosts 2 --soak 600`` runs it long."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import psycopg
import pytest

from app.config import to_libpq_url
from app.records.s3 import S3Records
from tests.scaleout.hosts import store_keys
from tests.support.s3 import s3_client
from tests.support.storm import Plan, run_storm, storm_seed

pytestmark = pytest.mark.slow


def test_a_storm_across_two_hosts_keeps_every_invariant(fresh_db_url: str, tmp_path: Path) -> None:
    seed = storm_seed()
    print(f"storm seed {seed}")
    soak = float(os.environ.get("STORM_SOAK_SECONDS") or 0)
    plan = (
        Plan(seconds=soak)
        if soak
        else Plan(submitter_ops=50, canceller_ops=35, node_ops=130, deadline=15)
    )
    keys = store_keys()
    report = run_storm(fresh_db_url, tmp_path, seed, plan, hosts=2, store=keys)
    print(report.describe())
    assert report.failures() == [], f"seed {seed}\n" + report.describe()
    assert report.rows.get("promotions", 0) > 0, report.describe()
    assert report.rows.get("runs SUCCEEDED", 0) > 0, report.describe()
    assert report.rows.get("runs FAILED", 0) > 0, report.describe()
    assert report.samples > 0
    # Every run the database calls sealed has a complete Record in the bucket, whole in its tar.
    records = S3Records(
        keys["records.s3.bucket"],
        keys["records.s3.prefix"],
        client=s3_client(keys["records.s3.endpoint_url"]),
    )
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as sql:
        sealed = [r[0] for r in sql.execute("select run_id from runs where sealed_at is not null")]
    assert sealed
    for run_id in sealed:
        assert records.is_sealed(run_id), run_id
        with tarfile.open(fileobj=io.BytesIO(b"".join(records.tar_stream(run_id)))) as tar:
            assert f"run-{run_id}/SHA256SUMS" in tar.getnames()
