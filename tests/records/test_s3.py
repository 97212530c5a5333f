"""What the S3 backend does beyond the behaviour every backend shares (test_backends.py): its
layout in the bucket, two hosts appending to one log, multipart uploads, and an unreachable store —
a 503 for the routes that need it, and a seal that the reaper does again once the store is back.

Against moto's S3 server on 127.0.0.1, started here (tests/support/s3.py): real HTTP, no mock of boto3."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest

from app.config import load_config
from app.context import record_store
from app.errors import ConfigError
from app.records import RecordSealed, RecordStoreUnavailable
from app.records.s3 import S3Records
from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.contracts import contract, role
from tests.support.record_contents import tar_files
from tests.support.records import RUN, seal_example
from tests.support.rows import scalar
from tests.support.s3 import S3Server, bucket_keys, new_bucket, s3_client, shared_server
from tests.support.submitter import submit

PREFIX = "mediator/records"


@pytest.fixture
def bucket() -> str:
    return new_bucket(shared_server().url)


def store_on(url: str, bucket: str, **kw: Any) -> S3Records:
    return S3Records(bucket, PREFIX, client=s3_client(url), **kw)


def _tar_files(store: S3Records, run_id: str = RUN) -> dict[str, bytes]:
    return tar_files(b"".join(store.tar_stream(run_id)), in_run=True)


def test_a_log_is_one_object_per_append_until_the_seal_writes_it_whole(bucket: str) -> None:
    url = shared_server().url
    store = store_on(url, bucket)
    store.open(RUN, {"run_id": RUN})
    store.append_log(RUN, 1, "build", b"one\n", 1000)
    store.append_log(RUN, 1, "build", b"two\n", 1000)
    store.put_progress(RUN, 1, "build", 0, b"live\n", 1000)
    keys = set(bucket_keys(url, bucket))
    d = f"{PREFIX}/{RUN}"
    assert {
        f"{d}/manifest.json",
        f"{d}/.chunks/01-build.log/0000000001",
        f"{d}/.chunks/01-build.log/0000000002",
        f"{PREFIX}/.progress/{RUN}/01-build/0000000000/0000000001",
    } == keys
    seal_example(store)
    keys = set(bucket_keys(url, bucket))
    assert not [k for k in keys if "/.chunks/" in k or "/.progress/" in k]
    assert {f"{d}/logs/01-build.log", f"{d}/SHA256SUMS", f"{d}/.sealed", f"{d}/.sealing"} <= keys
    client = s3_client(url)
    body = client.get_object(Bucket=bucket, Key=f"{d}/logs/01-build.log")["Body"].read()
    assert body == b"one\ntwo\n"
    marker = json.loads(client.get_object(Bucket=bucket, Key=f"{d}/.sealed")["Body"].read())
    assert dict(marker["files"])["logs/01-build.log"] == 8
    assert sorted(dict(marker["files"])) == sorted(_tar_files(store))


def test_two_hosts_append_to_one_log_and_either_reads_it_whole(bucket: str) -> None:
    """Each host keeps what it listed of a log; another host's chunks are found after them."""
    url = shared_server().url
    a, b = store_on(url, bucket), store_on(url, bucket)
    a.open(RUN, {"run_id": RUN})
    assert a.append_log(RUN, 1, "s", b"a1\n", 1000).total == 3
    assert b.append_log(RUN, 1, "s", b"b1\n", 1000).total == 6
    assert a.append_log(RUN, 1, "s", b"a2\n", 1000).total == 9
    assert b.append_log(RUN, 1, "s", b"b2\n", 12).total == 12
    total = a.append_log(RUN, 1, "s", b"a3\n", 12).total
    note = b"\n[mediator: log truncated at 12 bytes]\n"
    assert total == 12 + len(note)
    assert b.append_log(RUN, 1, "s", b"b3\n", 12) == (total, 0, True)
    whole = b"a1\nb1\na2\nb2\n" + note
    assert a.read_log(RUN, 1, "s", 0) == b.read_log(RUN, 1, "s", 0) == whole
    assert a.put_progress(RUN, 1, "p", 0, b"x\n", 100).total == 2
    assert b.put_progress(RUN, 1, "p", 1, b"new\n", 100).total == 4  # a new attempt on b
    assert a.put_progress(RUN, 1, "p", 0, b"stale\n", 100).attempt == 1
    assert a.put_progress(RUN, 1, "p", 1, b"more\n", 100).total == 9
    assert b.read_progress(RUN, 1, "p", 0) == (b"new\nmore\n", (9, 1, False))
    seal_example(b)
    with pytest.raises(RecordSealed):
        a.append_log(RUN, 1, "s", b"late\n", 1000)  # a's listing is old: the marker still stops it
    assert a.read_progress(RUN, 1, "p", 0) is None
    assert _tar_files(a) == _tar_files(b)
    assert b"".join(a.tar_stream(RUN)) == b"".join(b.tar_stream(RUN))


def test_a_blob_past_the_threshold_is_uploaded_in_parts(bucket: str) -> None:
    url = shared_server().url
    store = store_on(url, bucket, multipart_threshold=5 * 1024 * 1024)
    store.open(RUN, {"run_id": RUN})
    big = bytes(range(256)) * (6 * 4096)  # 6 MiB
    store.put_blob(RUN, 1, 1, "big.bin", big)
    store.put_blob(RUN, 1, 1, "small.bin", b"small")
    client = s3_client(url)
    head = client.head_object(Bucket=bucket, Key=f"{PREFIX}/{RUN}/blobs/01.1-big.bin")
    assert head["ETag"].strip('"').endswith("-2")  # two parts: a multipart upload
    small = client.head_object(Bucket=bucket, Key=f"{PREFIX}/{RUN}/blobs/01.1-small.bin")
    assert "-" not in small["ETag"]
    assert store.read_blob(RUN, 1, 1, "big.bin") == big


def test_a_store_that_cannot_be_reached_is_unavailable_for_every_operation(
    bucket: str,
) -> None:
    closed = S3Server().start()
    url = closed.url
    closed.stop()  # nothing listens on its port any more
    store = S3Records(bucket, client=s3_client(url))
    calls = [
        lambda: store.open(RUN, {}),
        lambda: store.exists(RUN),
        lambda: store.is_sealed(RUN),
        lambda: store.append_log(RUN, 1, "s", b"x", 10),
        lambda: store.read_log(RUN, 1, "s", 0),
        lambda: store.put_progress(RUN, 1, "s", 0, b"x", 10),
        lambda: store.read_progress(RUN, 1, "s", 0),
        lambda: store.put_blob(RUN, 1, 1, "b", b"x"),
        lambda: store.read_blob(RUN, 1, 1, "b"),
        lambda: seal_example(store),
        lambda: store.tar_stream(RUN),
        lambda: store.delete(RUN),
    ]
    for call in calls:
        with pytest.raises(RecordStoreUnavailable) as info:
            call()
        assert info.value.status == 503
        assert info.value.reason.startswith("record store unavailable")


def test_a_missing_bucket_is_unavailable_too() -> None:
    store = S3Records("no-such-bucket-here", client=s3_client(shared_server().url))
    with pytest.raises(RecordStoreUnavailable):
        store.put_blob(RUN, 1, 1, "b", b"x")


# ---------------------------------------------------------------- through the API


@pytest.fixture
def own_server() -> Iterator[S3Server]:
    """A server of this test's own, which it stops and starts again (it keeps its buckets)."""
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def config_overrides(own_server: S3Server) -> dict[str, Any]:
    return {
        "records.backend": "s3",
        "records.s3.bucket": new_bucket(own_server.url),
        "records.s3.prefix": "mediator",
        "records.s3.endpoint_url": own_server.url,
    }


UNAVAILABLE = {
    "error": {"code": 503, "reason": "record store unavailable: EndpointConnectionError"}
}


def _boot(client: Any, run_id: str) -> None:
    advertise(client, "n1", cap("board"))
    steps = [{"id": "boot", "uses": "dut", "run": ["boot"], "out": ["result.json"]}]
    doc = contract(run_id, role("dut"), steps=steps)
    submit(client, doc, 201)
    assert claimed(client, "n1", "n1-i")["run_id"] == run_id


def test_an_unreachable_store_is_503_and_the_reaper_seals_once_it_is_back(
    client: Any, ctx: Any, sql: Any, own_server: S3Server
) -> None:
    _boot(client, "r1")
    assert client.put("/v1/runs/r1/steps/1/log", data=b"booting\n").status_code == 200
    own_server.stop()
    resp = client.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": true}')
    assert (resp.status_code, resp.get_json()) == (503, UNAVAILABLE)
    assert scalar(sql, "select count(*) from blobs") == 0  # nothing half-written
    resp = client.put("/v1/runs/r1/steps/1/log", data=b"more\n")
    assert (resp.status_code, resp.get_json()) == (503, UNAVAILABLE)
    assert client.get("/v1/runs/r1/steps/1/log?from=0").status_code == 503
    # The run ends while the store is down: the seal fails and is left to the reaper.
    done(client, "r1", 1, "n1")
    assert scalar(sql, "select state from runs where run_id = 'r1'") == "SUCCEEDED"
    assert scalar(sql, "select sealed_at from runs where run_id = 'r1'") is None
    assert reap_pass(ctx).sealed == 0
    resp = client.get("/v1/runs/r1/record")
    assert resp.status_code == 409  # the database says: not sealed yet
    own_server.start()  # the same port, the same buckets
    assert not ctx.records.is_sealed("r1")  # never half-sealed
    assert reap_pass(ctx).sealed == 1
    assert scalar(sql, "select sealed_at from runs where run_id = 'r1'") is not None
    resp = client.get("/v1/runs/r1/record")
    assert resp.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(resp.data), mode="r:") as tar:
        log = tar.extractfile("run-r1/logs/01-step.log")
        assert log is not None and log.read() == b"booting\n"
        names = set(tar.getnames())
    assert {"run-r1/verdict.json", "run-r1/SHA256SUMS", "run-r1/steps/01-boot.json"} <= names
    own_server.stop()
    resp = client.get("/v1/runs/r1/record")  # sealed in the database, but the store is down
    assert (resp.status_code, resp.get_json()) == (503, UNAVAILABLE)
    own_server.start()


def test_a_submit_while_the_store_is_down_is_503_and_stores_no_run(
    client: Any, sql: Any, own_server: S3Server
) -> None:
    advertise(client, "n1", cap("board"))
    own_server.stop()
    resp = client.post("/v1/runs", json=contract("r2", role("dut")))
    assert (resp.status_code, resp.get_json()) == (503, UNAVAILABLE)
    assert scalar(sql, "select count(*) from runs") == 0
    own_server.start()
    assert client.post("/v1/runs", json=contract("r2", role("dut"))).status_code == 201


# ---------------------------------------------------------------- configuration


def test_the_record_store_keys_are_read_from_the_environment() -> None:
    env = {
        "MEDIATOR_RECORDS_BACKEND": "s3",
        "MEDIATOR_RECORDS_S3_BUCKET": "records",
        "MEDIATOR_RECORDS_S3_PREFIX": "prod/",
        "MEDIATOR_RECORDS_S3_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    cfg = load_config(env=env)
    assert (cfg["records.backend"], cfg["records.s3.bucket"]) == ("s3", "records")
    assert (cfg["records.s3.prefix"], cfg["records.s3.endpoint_url"]) == (
        "prod/",
        "http://127.0.0.1:9",
    )
    store = record_store(cfg)
    assert isinstance(store, S3Records) and store.prefix == "prod/"
    assert load_config(env={})["records.backend"] == "filesystem"


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"MEDIATOR_RECORDS_BACKEND": "s3"}, "records.s3.bucket: must be set"),
        ({"MEDIATOR_RECORDS_BACKEND": "nfs"}, "records.backend: must be one of filesystem, s3"),
    ],
)
def test_a_bad_record_store_configuration_names_its_key(env: dict[str, str], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert str(info.value).startswith(line)
