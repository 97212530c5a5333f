"""What a Record holds, read as the tests check it: the files of its tar, a sealed one's as a live
server serves it, its checksums checked, the blobs of its directory."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

from tests.support.apps import LiveServer
from tests.support.concurrency import await_value


def tar_files(data: bytes, *, in_run: bool = False) -> dict[str, bytes]:
    """The files of the tar ``data`` (a Record as it is served or streamed) by their path:
    ``run-<id>/steps/…`` as the tar has it, or ``steps/…`` (inside the run's directory) with
    ``in_run``."""
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                name = member.name.split("/", 1)[1] if in_run else member.name
                files[name] = extracted.read()
    return files


def record_files(server: LiveServer, run_id: str) -> dict[str, bytes]:
    """The sealed Record's files by their path inside ``run-<id>/``, once it is sealed."""
    resp = await_value(
        lambda: (r := server.get(f"/v1/runs/{run_id}/record")).status_code == 200 and r,
        f"the Record of {run_id} to be sealed",
    )
    return tar_files(resp.content, in_run=True)


def verify_sums(record: dict[str, bytes] | Path) -> list[str]:
    """Check a Record's ``SHA256SUMS`` against its files (``record``: its files by their path
    inside it, or its directory): sorted, each digest right, every other file listed. Returns
    the paths it lists."""
    if isinstance(record, Path):
        record = {
            p.relative_to(record).as_posix(): p.read_bytes()
            for p in record.rglob("*")
            if p.is_file()
        }
    lines = record["SHA256SUMS"].decode().splitlines()
    paths = [line.split("  ", 1)[1] for line in lines]
    assert paths == sorted(paths)
    for line in lines:
        digest, rel = line.split("  ", 1)
        assert hashlib.sha256(record[rel]).hexdigest() == digest
    assert paths == sorted(p for p in record if p != "SHA256SUMS")
    return paths


def blob_files(ctx: Any, run_id: str) -> list[str]:
    """The names of the blobs in the run's Record directory (an app's ``ctx``, the filesystem
    store), sorted; none when it has no blobs directory."""
    d = ctx.records.path(run_id) / "blobs"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []
