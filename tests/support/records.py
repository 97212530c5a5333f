"""The Record stores the tests run against: the backends (a directory, a bucket on moto's S3
server), the run they use and a seal with a typical verdict. What a Record holds is
tests/support/record_contents.py's."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from app.records import (
    FilesystemRecords,
    RecordStore,
)
from app.records.s3 import S3Records
from tests.support.s3 import new_bucket, s3_client, shared_server

RUN = "run-0001"


def seal_example(rec: RecordStore, run_id: str = RUN) -> None:
    """Seal ``run_id`` as a finished two-step run would be sealed."""
    rec.seal(
        run_id,
        verdict={"state": "SUCCEEDED"},
        steps=[
            (1, "build", {"state": "SUCCEEDED", "node": "n1"}),
            (2, "test", {"state": "SUCCEEDED"}),
        ],
        events=[{"kind": "created"}, {"kind": "finished"}],
        manifest_update={"state": "SUCCEEDED", "ended_at": "2024-01-01T00:00:00Z"},
    )


Backend = Callable[[Path], AbstractContextManager[RecordStore]]


@contextlib.contextmanager
def filesystem(tmp_path: Path) -> Iterator[RecordStore]:
    yield FilesystemRecords(tmp_path / "records")
    for dirpath, _dirs, _files in os.walk(
        tmp_path
    ):  # sealed dirs are 0555: let cleanup remove them
        os.chmod(dirpath, 0o755)


@contextlib.contextmanager
def s3(tmp_path: Path) -> Iterator[RecordStore]:
    """A fresh bucket on moto's S3 server on 127.0.0.1; a low multipart threshold (S3's smallest
    part) so that the suite's larger blobs go multipart."""
    server = shared_server()
    bucket = new_bucket(server.url)
    yield S3Records(
        bucket,
        "records",
        client=s3_client(server.url),
        multipart_threshold=MULTIPART,
    )


MULTIPART = 5 * 1024 * 1024


BACKENDS: list[Any] = [
    pytest.param(filesystem, id="filesystem"),
    pytest.param(s3, id="s3"),
]
