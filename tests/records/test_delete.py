"""``RecordStore.delete`` (retention, docs/retention.md#what-is-pruned-and-what-is-kept) on every
backend of the behaviour suite: a sealed Record, an open one and a missing one; nothing of the run
is readable afterwards, other runs keep theirs, and a second delete is no error."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.records import FilesystemRecords, RecordStore
from tests.support.records import BACKENDS, RUN, Backend, seal_example

OTHER = "run-0002"


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RecordStore]:
    backend: Backend = request.param
    with backend(tmp_path) as s:
        yield s


def _fill(store: RecordStore, run_id: str) -> None:
    store.open(run_id, {"run_id": run_id, "state": "RUNNING"})
    store.append_log(run_id, 1, "step", b"hello\n", 1 << 20)
    store.put_blob(run_id, 1, 0, "result.json", b'{"ok": true}')


def _gone(store: RecordStore, run_id: str) -> None:
    assert not store.exists(run_id)
    assert not store.is_sealed(run_id)
    assert store.read_log(run_id, 1, "step", 0) == b""
    assert store.read_blob(run_id, 1, 0, "result.json") is None
    assert store.read_progress(run_id, 1, "step", 0) is None
    with pytest.raises(FileNotFoundError):
        store.tar_stream(run_id)


def test_deleting_a_sealed_record_removes_all_of_it_and_keeps_the_others(store):
    _fill(store, RUN)
    seal_example(store, RUN)
    _fill(store, OTHER)
    seal_example(store, OTHER)
    assert store.is_sealed(RUN)

    assert store.delete(RUN) is True

    _gone(store, RUN)
    assert store.is_sealed(OTHER)
    assert store.read_blob(OTHER, 1, 0, "result.json") == b'{"ok": true}'
    assert b"".join(store.tar_stream(OTHER))


def test_deleting_an_open_record_removes_its_logs_blobs_and_progress(store):
    _fill(store, RUN)
    store.put_progress(RUN, 1, "step", 0, b"live line\n", 1 << 20)

    assert store.delete(RUN) is True

    _gone(store, RUN)


def test_deleting_a_missing_record_or_deleting_twice_is_no_error(store):
    assert store.delete("never-opened") is False
    _fill(store, RUN)
    seal_example(store, RUN)

    assert store.delete(RUN) is True
    assert store.delete(RUN) is False

    _gone(store, RUN)


def test_a_record_deleted_can_be_opened_afresh(store):
    _fill(store, RUN)
    seal_example(store, RUN)
    store.delete(RUN)

    store.open(RUN, {"run_id": RUN, "state": "RUNNING"})

    assert store.exists(RUN) and not store.is_sealed(RUN)
    assert store.read_blob(RUN, 1, 0, "result.json") is None


# -- the filesystem backend's own way of deleting ---------------------------------------------


def test_a_filesystem_delete_leaves_nothing_under_the_root(tmp_path):
    root = tmp_path / "records"
    store = FilesystemRecords(root)
    _fill(store, RUN)
    store.put_progress(RUN, 1, "step", 0, b"live line\n", 1 << 20)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_bytes(b"x")
    os.symlink(tmp_path / "outside", store.path(RUN) / "link")  # not followed, only removed
    seal_example(store, RUN)

    store.delete(RUN)

    assert sorted(p.name for p in root.iterdir()) == [".progress"]
    assert list((root / ".progress").iterdir()) == []
    assert (tmp_path / "outside" / "keep").read_bytes() == b"x"


def test_a_filesystem_delete_cut_short_by_a_crash_is_finished_by_the_next(tmp_path):
    store = FilesystemRecords(tmp_path / "records")
    _fill(store, RUN)
    seal_example(store, RUN)
    # What a crash right after the rename leaves: the Record moved aside, still read-only.
    aside = store.root / f".deleting-{store.path(RUN).name}"
    os.chmod(store.path(RUN), 0o755)
    os.rename(store.path(RUN), aside)
    assert not store.exists(RUN)

    assert store.delete(RUN) is False  # nothing under the run's name; the leftover goes too

    assert not aside.exists()
